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
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"

	"github.com/lockagent/lockagent/internal/socketpath"
)

// ErrInUse is returned by Listen when another process is serving the path.
var ErrInUse = errors.New("socketapi: socket in use by a live agent")

// Listen binds the agent's Unix socket at path, defensively: a live agent's
// socket is never replaced (ErrInUse), a path that is not a socket is never
// removed, and a stale socket left by a dead agent is. A missing directory
// is created (see socketDir). The socket gets mode and, when group is set (a
// name or a number), that group, with no moment at which it is more open:
// it is created accessible to its owner only, and opened up to mode once
// its group is set.
func Listen(path string, mode os.FileMode, group string) (*net.UnixListener, error) {
	gid := -1
	if group != "" {
		var err error
		if gid, err = lookupGID(group); err != nil {
			return nil, fmt.Errorf("listen %s: %w", path, err)
		}
	}
	if err := socketDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("listen %s: exists and is not a socket; not removing it", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("listen %s: %w", path, ErrInUse)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("listen %s: cannot tell whether the socket is live: %w", path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen %s: removing the stale socket: %w", path, err)
		}
	}
	ln, err := bindPrivate(path, mode, gid)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return ln, nil
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
func Activated() (*net.UnixListener, error) {
	return activated(activation.Files(true))
}

// activated turns the handed-over files into the agent's listener; it
// closes the files in every case.
func activated(files []*os.File) (*net.UnixListener, error) {
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
	return uln, nil
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

// bindPrivate binds and listens at path. Linux creates a socket file with
// the permission bits of the socket itself (less the umask), so the socket
// is made owner-only before bind; the group is set next, and the mode last.
func bindPrivate(path string, mode os.FileMode, gid int) (*net.UnixListener, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close() // FileListener keeps a copy
	if err := syscall.Fchmod(fd, uint32(mode.Perm()&0o700)); err != nil {
		return nil, os.NewSyscallError("fchmod", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		return nil, os.NewSyscallError("bind", err)
	}
	bound := true
	defer func() {
		if bound {
			os.Remove(path)
		}
	}()
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(path, mode.Perm()); err != nil {
		return nil, err
	}
	if err := syscall.Listen(fd, backlog()); err != nil {
		return nil, os.NewSyscallError("listen", err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	uln := ln.(*net.UnixListener)
	uln.SetUnlinkOnClose(true) // as net.ListenUnix's own listeners do
	bound = false
	return uln, nil
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
