package socketapi

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/lockfile"
	"github.com/lockagent/lockagent/internal/socketpath"
)

// socketFile makes a socket of the domain and type, bound to addr, as
// systemd would before handing it over; listen says whether it listens.
func socketFile(t *testing.T, domain, typ int, addr syscall.Sockaddr, listen bool) *os.File {
	t.Helper()
	fd, err := syscall.Socket(domain, typ|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), "test-socket")
	require.NoError(t, syscall.Bind(fd, addr))
	if listen {
		require.NoError(t, syscall.Listen(fd, 16))
	}
	return f
}

// shortDir is a temporary directory with room for socket paths.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "la")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestActivatedServesTheSocketAndLeavesIt: the handed-over socket is
// served as it is, and closing the listener leaves its file for the next
// start.
func TestActivatedServesTheSocketAndLeavesIt(t *testing.T) {
	path := filepath.Join(shortDir(t), "s")
	f := socketFile(t, syscall.AF_UNIX, syscall.SOCK_STREAM, &syscall.SockaddrUnix{Name: path}, true)
	before, err := os.Lstat(path)
	require.NoError(t, err)

	ln, err := activated([]*os.File{f})
	require.NoError(t, err)
	require.NotNil(t, ln)
	require.Equal(t, path, ln.Addr().String())
	_, err = f.Stat()
	require.ErrorIs(t, err, os.ErrClosed, "the handed-over file is closed; the listener has its own descriptor")

	c, err := net.DialTimeout("unix", path, time.Second)
	require.NoError(t, err)
	s, err := ln.Accept()
	require.NoError(t, err)
	s.Close()
	c.Close()

	require.NoError(t, ln.Close())
	after, err := os.Lstat(path)
	require.NoError(t, err, "closing the listener must not unlink the unit's socket")
	require.True(t, os.SameFile(before, after), "the socket file was replaced")
	_, err = os.Lstat(path + ".lock")
	require.ErrorIs(t, err, os.ErrNotExist, "the unit's socket takes no lock file")
}

// TestActivatedNone: without a socket handed over, the agent listens itself.
func TestActivatedNone(t *testing.T) {
	ln, err := activated(nil)
	require.NoError(t, err)
	require.Nil(t, ln)
}

// TestActivatedRefusesWhatItCannotServe: every socket it cannot serve is a
// clear error, and every handed-over file is closed.
func TestActivatedRefusesWhatItCannotServe(t *testing.T) {
	dir := shortDir(t)
	unix := func(name string) syscall.Sockaddr { return &syscall.SockaddrUnix{Name: filepath.Join(dir, name)} }
	loopback := &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}
	notSocket, err := os.CreateTemp(dir, "f")
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		files func() []*os.File
		want  string
	}{
		{"two sockets", func() []*os.File {
			return []*os.File{
				socketFile(t, syscall.AF_UNIX, syscall.SOCK_STREAM, unix("a"), true),
				socketFile(t, syscall.AF_UNIX, syscall.SOCK_STREAM, unix("b"), true),
			}
		}, "2 sockets handed over"},
		{"datagram", func() []*os.File {
			return []*os.File{socketFile(t, syscall.AF_UNIX, syscall.SOCK_DGRAM, unix("d"), false)}
		}, "not a stream socket"},
		{"not listening", func() []*os.File {
			return []*os.File{socketFile(t, syscall.AF_UNIX, syscall.SOCK_STREAM, unix("n"), false)}
		}, "not a listening socket"},
		{"tcp", func() []*os.File {
			return []*os.File{socketFile(t, syscall.AF_INET, syscall.SOCK_STREAM, loopback, true)}
		}, "is a tcp socket, not a Unix one"},
		{"regular file", func() []*os.File { return []*os.File{notSocket} }, "not a socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := tc.files()
			ln, err := activated(files)
			require.Nil(t, ln)
			require.ErrorContains(t, err, tc.want)
			for _, f := range files {
				_, err := f.Stat()
				require.ErrorIs(t, err, os.ErrClosed)
			}
		})
	}
}

// TestListenMakesItsDirectory: a missing directory is made with mode 0755
// whatever the umask, so that the socket's own mode decides who connects.
func TestListenMakesItsDirectory(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := filepath.Join(shortDir(t), "a", "b")
	ln, err := Listen(filepath.Join(dir, "s"), 0o660, "")
	require.NoError(t, err)
	defer ln.Close()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		fi, err := os.Stat(d)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o755), fi.Mode().Perm(), d)
	}
}

// TestPrivateSocketDir: the default socket of a user without a runtime
// directory lives in lockagent-UID in the temporary directory, which
// anybody could make first. The agent makes it accessible to its user
// only; the agent and the clients refuse it unless it is a directory of
// the user's that nobody else may enter.
func TestPrivateSocketDir(t *testing.T) {
	t.Setenv("TMPDIR", shortDir(t))
	dir := socketpath.PrivateDir()
	path := filepath.Join(dir, "agent.sock")

	ln, err := Listen(path, 0o660, "")
	require.NoError(t, err)
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "made private")
	c, err := client.Dial(t.Context(), path)
	require.NoError(t, err)
	c.Close()
	ln.Close()

	refused := func(what string) {
		t.Helper()
		_, err := Listen(path, 0o660, "")
		require.ErrorContains(t, err, "not a directory private to uid", "listen, %s", what)
		_, err = client.Dial(t.Context(), path)
		require.ErrorContains(t, err, "not a directory private to uid", "dial, %s", what)
	}
	require.NoError(t, os.Chmod(dir, 0o777))
	refused("open to everybody")
	require.NoError(t, os.Chmod(dir, 0o750))
	refused("open to its group")
	require.NoError(t, os.Chmod(dir, 0o700))
	if os.Geteuid() == 0 { // only root gives a directory away
		require.NoError(t, os.Chown(dir, 4242, -1))
		refused("another user's")
	}

	require.NoError(t, os.RemoveAll(dir))
	elsewhere := filepath.Join(shortDir(t), "d")
	require.NoError(t, os.Mkdir(elsewhere, 0o700))
	require.NoError(t, os.Symlink(elsewhere, dir))
	refused("a link")
}

// TestListenRacing: Listen calls racing on one path, with and without a
// stale socket left there, never both serve it. Between one's bind and
// its listen, its socket refuses connections as a dead agent's does; the
// lock on the path keeps the others from taking that for a stale socket.
func TestListenRacing(t *testing.T) {
	const rounds, racers = 200, 3
	path := filepath.Join(shortDir(t), "s")
	for round := range rounds {
		if round%2 == 1 {
			leaveStaleSocket(t, path)
		}
		start := make(chan struct{})
		lns := make([]*Listener, racers)
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				<-start
				lns[i], errs[i] = Listen(path, 0o600, "")
			})
		}
		close(start)
		wg.Wait()
		var serving []*Listener
		for i, ln := range lns {
			if errs[i] != nil {
				require.ErrorIs(t, errs[i], ErrInUse, "round %d", round)
				continue
			}
			serving = append(serving, ln)
		}
		for _, ln := range serving {
			ln.Close()
		}
		require.Len(t, serving, 1, "round %d: listeners serving %s", round, path)
		_, err := os.Lstat(path)
		require.ErrorIs(t, err, os.ErrNotExist, "round %d: the socket file is removed on close", round)
	}
}

// TestListenLeavesASocketWhileLocked: a socket nobody listens on is stale
// only if no agent holds the path's lock. One that does may be between its
// bind and its listen: its socket is left as it is, and Listen says the
// path is in use, and by whom.
func TestListenLeavesASocketWhileLocked(t *testing.T) {
	path := filepath.Join(shortDir(t), "s")
	leaveStaleSocket(t, path)
	before, err := os.Lstat(path)
	require.NoError(t, err)
	other, err := lockfile.Acquire(path + ".lock")
	require.NoError(t, err)

	ln, err := Listen(path, 0o600, "")
	require.Nil(t, ln)
	require.ErrorIs(t, err, ErrInUse)
	require.ErrorContains(t, err, fmt.Sprintf("%s.lock is held by pid %d", path, os.Getpid()))
	after, err := os.Lstat(path)
	require.NoError(t, err, "the socket was removed")
	require.True(t, os.SameFile(before, after), "the socket was replaced")

	// Once nobody holds the lock, the socket is a dead agent's.
	require.NoError(t, other.Release())
	ln, err = Listen(path, 0o600, "")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.DialTimeout("unix", path, time.Second)
	require.NoError(t, err, "the stale socket is replaced")
	c.Close()
}

// TestListenerCloseLeavesAnotherSocket: a listener closing removes its own
// socket file only; one that replaced it (made by a process that takes no
// lock) stays. The lock is released all the same.
func TestListenerCloseLeavesAnotherSocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "s")
	ln, err := Listen(path, 0o600, "")
	require.NoError(t, err)

	require.NoError(t, os.Remove(path))
	theirs, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	defer theirs.Close()
	before, err := os.Lstat(path)
	require.NoError(t, err)

	require.NoError(t, ln.Close())
	after, err := os.Lstat(path)
	require.NoError(t, err, "closing removed another's socket")
	require.True(t, os.SameFile(before, after))
	c, err := net.DialTimeout("unix", path, time.Second)
	require.NoError(t, err, "the other socket answers")
	c.Close()

	l, err := lockfile.Acquire(path + ".lock")
	require.NoError(t, err, "the lock was not released")
	l.Release()
}

// TestListenerLockFile: the lock file beside the socket is the agent's
// user's, mode 0600, and stays after the listener closes; a link there is
// refused, and its target left alone.
func TestListenerLockFile(t *testing.T) {
	path := filepath.Join(shortDir(t), "s")
	ln, err := Listen(path, 0o660, "")
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	fi, err := os.Lstat(path + ".lock")
	require.NoError(t, err, "the lock file stays")
	require.Equal(t, os.FileMode(0o600), fi.Mode())
	require.Equal(t, uint32(os.Geteuid()), fi.Sys().(*syscall.Stat_t).Uid)

	require.NoError(t, os.Remove(path+".lock"))
	target := filepath.Join(filepath.Dir(path), "target")
	require.NoError(t, os.Symlink(target, path+".lock"))
	_, err = Listen(path, 0o660, "")
	require.ErrorContains(t, err, "is a symbolic link; not following it")
	_, err = os.Lstat(target)
	require.ErrorIs(t, err, os.ErrNotExist, "the link was followed")
	_, err = os.Lstat(path)
	require.ErrorIs(t, err, os.ErrNotExist, "a socket was bound without the lock")
}

// leaveStaleSocket leaves at path the socket file of an agent killed with
// SIGKILL: bound, and served by nobody.
func leaveStaleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
}
