package descriptor

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestDupOutlivesTheOriginal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	require.NoError(t, err)
	_, err = f.WriteString("kept")
	require.NoError(t, err)
	d, err := Dup(f)
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, f.Close())
	b := make([]byte, 4)
	_, err = d.ReadAt(b, 0)
	require.NoError(t, err)
	require.Equal(t, "kept", string(b))
	flags, err := unix.FcntlInt(d.Fd(), unix.F_GETFD, 0)
	require.NoError(t, err)
	require.NotZero(t, flags&unix.FD_CLOEXEC, "close-on-exec")
}

func TestOfIsTheSocketsDescriptor(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	fd, err := Of(ln.(*net.TCPListener))
	require.NoError(t, err)
	// The same socket: its local address is the listener's.
	sa, err := unix.Getsockname(fd)
	require.NoError(t, err)
	require.Equal(t, ln.Addr().(*net.TCPAddr).Port, sa.(*unix.SockaddrInet4).Port)
}
