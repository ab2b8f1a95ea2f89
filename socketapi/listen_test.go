package socketapi

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
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
