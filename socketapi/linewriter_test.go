package socketapi

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// socketPair returns the server and client ends of a Unix connection.
func socketPair(t *testing.T) (server *net.UnixConn, client net.Conn) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unix"})
	require.NoError(t, err)
	defer ln.Close()
	client, err = net.Dial("unix", ln.Addr().String())
	require.NoError(t, err)
	server, err = ln.AcceptUnix()
	require.NoError(t, err)
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

func testLineWriter(t *testing.T, timeout time.Duration) (*lineWriter, net.Conn) {
	t.Helper()
	nc, peer := socketPair(t)
	_, raw := descriptor(nc)
	require.NotNil(t, raw)
	return newLineWriter(nc, raw, timeout), peer
}

// TestLineWriter: a line the socket takes at once, a line larger than the
// socket's buffer that the peer reads, and several lines in one call all
// arrive whole and in order.
func TestLineWriter(t *testing.T) {
	w, peer := testLineWriter(t, 5*time.Second)
	big := append(bytes.Repeat([]byte("x"), 4<<20), '\n')
	got := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(peer, int64(len(big)+6)))
		got <- b
	}()
	require.NoError(t, w.write([]byte("a\n")))
	require.NoError(t, w.write(big), "the peer reads it: the rest waits, and goes")
	require.NoError(t, w.writeLines([][]byte{[]byte("b\n"), []byte("c\n")}))
	want := append(append([]byte("a\n"), big...), "b\nc\n"...)
	assert.True(t, bytes.Equal(want, <-got), "the lines arrive whole and in order")
}

// TestLineWriterTimeout: a line the peer does not read is cut off once
// blocked for the timeout, not before.
func TestLineWriterTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	w, _ := testLineWriter(t, timeout)
	big := append(bytes.Repeat([]byte("x"), 4<<20), '\n')
	start := time.Now()
	err := w.write(big)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.GreaterOrEqual(t, time.Since(start), timeout)
}

// TestLineWriterClearsDeadline: a line that needed the deadline leaves none
// behind, so that a line written after the deadline would have passed
// still goes.
func TestLineWriterClearsDeadline(t *testing.T) {
	const timeout = 50 * time.Millisecond
	w, peer := testLineWriter(t, timeout)
	big := append(bytes.Repeat([]byte("x"), 4<<20), '\n')
	read := make(chan error)
	go func() {
		_, err := io.ReadFull(peer, make([]byte, len(big)+2))
		read <- err
	}()
	require.NoError(t, w.write(big))
	// The deadline that write set would be past now: only time passing
	// can show that it is gone.
	time.Sleep(2 * timeout)
	require.NoError(t, w.write([]byte("a\n")))
	require.NoError(t, <-read)
}
