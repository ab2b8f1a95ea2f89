package socketapi

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"

	"github.com/lockagent/lockagent/internal/lockfile"
	"github.com/lockagent/lockagent/internal/socketpath"
)

// ErrInUse is returned by Listen when another process is serving the path.
var ErrInUse = errors.New("socketapi: socket in use by a live agent")

// Listener is the agent's listening socket. One that Listen bound also
// holds the lock on its path: its Close removes the socket file, if the
// path still is that socket, and then releases the lock. Any other
// (Activated's, or Listener{UnixListener: ln} around a listener of one's
// own) closes as its UnixListener does.
type Listener struct {
	*net.UnixListener

	lock  *lockfile.Lock // nil unless Listen bound the socket
	path  string
	bound os.FileInfo // the socket file Listen bound, to know it again
	once  sync.Once   // releases the path exactly once
}

// Close releases the path (see Listener) and stops listening. It may be
// called more than once, and concurrently.
func (l *Listener) Close() error {
	l.once.Do(l.release)
	return l.UnixListener.Close()
}

// release removes the socket file if it still is the one Listen bound,
// and then releases the lock. While the lock is held no agent binds the
// path, and while the socket is open its file's inode cannot be reused,
// so the file removed is ours: one that replaced it (made by a process
// that takes no lock) is left alone.
func (l *Listener) release() {
	if l.lock == nil {
		return
	}
	if fi, err := os.Lstat(l.path); err == nil && os.SameFile(fi, l.bound) {
		os.Remove(l.path)
	}
	l.lock.Release()
}

// Listen binds the agent's Unix socket at path, defensively. The path is
// the agent's as long as its listener is open: Listen first takes an
// exclusive lock on path+".lock" (see lockfile), without waiting, and
// another agent holding it is ErrInUse. Under the lock, a live socket is
// never replaced (ErrInUse: a process that takes no lock serves it), a
// path that is not a socket is never removed, and a stale socket left by
// a dead agent is. A missing directory is created (see socketDir). The
// socket gets mode and, when group is set (a name or a number), that
// group, with no moment at which it is more open: it is created
// accessible to its owner only, and opened up to mode once its group is
// set.
func Listen(path string, mode os.FileMode, group string) (*Listener, error) {
	gid := -1
	if group != "" {
		var err error
		if gid, err = lookupGID(group); err != nil {
			return nil, fmt.Errorf("listen %s: %w", path, err)
		}
	}
	// The directory first: the lock file is made in the private directory
	// only once it is known to be the user's.
	if err := socketDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	// The lock before the socket is touched: between another agent's bind
	// and its listen, its socket refuses connections as a dead one's does,
	// and only the lock tells the two apart.
	lock, err := lockfile.Acquire(path + ".lock")
	var held *lockfile.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("listen %s: %w (%w)", path, ErrInUse, err)
	}
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	l, err := listenLocked(path, mode, gid)
	if err != nil {
		lock.Release()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	l.lock = lock
	return l, nil
}

// listenLocked binds and listens at path, removing a stale socket first;
// the caller holds the path's lock.
func listenLocked(path string, mode os.FileMode, gid int) (*Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, errors.New("exists and is not a socket; not removing it")
		}
		// No agent that takes the lock serves the path, but an older agent
		// or another program might.
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, ErrInUse
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("cannot tell whether the socket is live: %w", err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing the stale socket: %w", err)
		}
	}
	ln, bound, err := bindPrivate(path, mode, gid)
	if err != nil {
		return nil, err
	}
	return &Listener{UnixListener: ln, path: path, bound: bound}, nil
}

// socketDir makes the socket's directory if it is missing, mode 0755
// whatever the umask, or, for the private directory of a user without a
// runtime directory (socketpath.PrivateDir), mode 0700; that one must
// be the user's own and private even if it exists: in the temporary
// directory, anybody could have made it first.
func socketDir(dir string) error {
	if dir == socketpath.PrivateDir() {
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		return socketpath.CheckPrivate(dir)
	}
	// The missing directories, from the first: each gets 0755, which
	// MkdirAll's would not under a strict umask.
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := os.Chmod(missing[i], 0o755); err != nil {
			return err
		}
	}
	return nil
}

// Activated returns the listening socket that systemd handed over (socket
// activation: LISTEN_PID names this process and LISTEN_FDS counts the
// sockets), or nil when none was. The socket is the unit's: its path, mode
// and group are systemd's to set, and closing the listener neither unlinks
// nor rebinds it. More than one socket, or one that is not a listening
// Unix stream socket, is an error. The LISTEN_* variables are removed from
// the environment, so that no child takes the socket for its own.
func Activated() (*Listener, error) {
	return activated(activation.Files(true))
}

// activated turns the handed-over files into the agent's listener; it
// closes the files in every case.
func activated(files []*os.File) (*Listener, error) {
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	switch len(files) {
	case 0:
		return nil, nil
	case 1:
	default:
		return nil, fmt.Errorf("socket activation: %d sockets handed over; the agent serves exactly one", len(files))
	}
	f := files[0]
	if err := checkListening(f); err != nil {
		return nil, fmt.Errorf("socket activation: %s: %w", f.Name(), err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	uln, ok := ln.(*net.UnixListener)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("socket activation: %s is a %s socket, not a Unix one", f.Name(), ln.Addr().Network())
	}
	// The socket file belongs to the socket unit, which may hand it to
	// the agent's next start: the agent must never remove it.
	uln.SetUnlinkOnClose(false)
	return &Listener{UnixListener: uln}, nil
}

// checkListening requires f to be a stream socket in the listening state.
func checkListening(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var soType, listening int
	var sockErr error
	err = rc.Control(func(fd uintptr) {
		if soType, sockErr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TYPE); sockErr != nil {
			return
		}
		listening, sockErr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN)
	})
	switch {
	case err != nil:
		return err
	case errors.Is(sockErr, syscall.ENOTSOCK):
		return errors.New("not a socket")
	case sockErr != nil:
		return sockErr
	case soType != syscall.SOCK_STREAM:
		return errors.New("not a stream socket (ListenStream= in the socket unit)")
	case listening == 0:
		return errors.New("not a listening socket (Accept=no in the socket unit)")
	}
	return nil
}

// bindPrivate binds and listens at path, and returns the listener and
// the socket file it made. Linux creates a socket file with the permission
// bits of the socket itself (less the umask), so the socket is made
// owner-only before bind; the group is set next, and the mode last. The
// listener leaves the file when it closes: Listener.Close removes it.
func bindPrivate(path string, mode os.FileMode, gid int) (*net.UnixListener, os.FileInfo, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, os.NewSyscallError("socket", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close() // FileListener keeps a copy
	if err := syscall.Fchmod(fd, uint32(mode.Perm()&0o700)); err != nil {
		return nil, nil, os.NewSyscallError("fchmod", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		return nil, nil, os.NewSyscallError("bind", err)
	}
	bound := true
	defer func() {
		if bound {
			os.Remove(path)
		}
	}()
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, nil, err
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			return nil, nil, err
		}
	}
	if err := os.Chmod(path, mode.Perm()); err != nil {
		return nil, nil, err
	}
	if err := syscall.Listen(fd, backlog()); err != nil {
		return nil, nil, os.NewSyscallError("listen", err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, nil, err
	}
	bound = false
	return ln.(*net.UnixListener), fi, nil
}

// lookupGID returns the gid of a group given by number or name.
func lookupGID(group string) (int, error) {
	if gid, err := strconv.Atoi(group); err == nil {
		return gid, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, fmt.Errorf("group %q: %w", group, err)
	}
	return strconv.Atoi(g.Gid)
}

// backlog is the system's bound on a listener's queue, as net.Listen uses.
func backlog() int {
	b, err := os.ReadFile("/proc/sys/net/core/somaxconn")
	if err != nil {
		return syscall.SOMAXCONN
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return syscall.SOMAXCONN
	}
	return min(n, 1<<16-1)
}
