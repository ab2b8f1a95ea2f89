package socketapi

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
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
	_, raw := connFD(nc)
	require.NotNil(t, raw)
	return newLineWriter(nc, raw, timeout), peer
}

// readAll reads n bytes from peer in the background.
func readAll(peer net.Conn, n int) <-chan []byte {
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(peer, int64(n)))
		got <- b
	}()
	return got
}

// bigLine is a line larger than a socket's buffer.
func bigLine() []byte { return append(bytes.Repeat([]byte("x"), 1<<20), '\n') }

// TestLineWriter: a line the socket takes at once, a line larger than the
// socket's buffer that the peer reads, and several lines in one call all
// arrive whole and in order.
func TestLineWriter(t *testing.T) {
	w, peer := testLineWriter(t, 5*time.Second)
	big := bigLine()
	got := readAll(peer, len(big)+6)
	require.NoError(t, w.write([]byte("a\n")))
	require.NoError(t, w.write(big), "the peer reads it: the rest waits, and goes")
	require.NoError(t, w.writeLines([][]byte{[]byte("b\n"), []byte("c\n")}))
	want := append(append([]byte("a\n"), big...), "b\nc\n"...)
	assert.True(t, bytes.Equal(want, <-got), "the lines arrive whole and in order")
}

// TestLineWriterFull: a line offered to a socket whose buffer is full
// (EAGAIN) waits, with the deadline, until the peer reads.
func TestLineWriterFull(t *testing.T) {
	w, peer := testLineWriter(t, 5*time.Second)
	filled := 0
	for {
		w.lines = [][]byte{bytes.Repeat([]byte("y"), 64<<10)}
		require.NoError(t, w.raw.Write(w.offer))
		filled += w.n
		if w.err == syscall.EAGAIN {
			break
		}
		require.NoError(t, w.err)
	}
	w.lines, w.n, w.err = nil, 0, nil
	got := readAll(peer, filled+2)
	require.NoError(t, w.write([]byte("a\n")))
	b := <-got
	require.Len(t, b, filled+2)
	assert.Equal(t, "a\n", string(b[filled:]))
}

// TestLineWriterTimeout: a line the peer does not read is cut off once
// blocked for the timeout, not before.
func TestLineWriterTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	w, _ := testLineWriter(t, timeout)
	start := time.Now()
	err := w.write(bigLine())
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.GreaterOrEqual(t, time.Since(start), timeout)
}

// TestLineWriterSlowReader: a peer that keeps reading, slowly, gets lines
// that take several timeouts to go: the timeout is on a write blocked
// without progress, not on the whole line.
func TestLineWriterSlowReader(t *testing.T) {
	const timeout = 500 * time.Millisecond
	w, peer := testLineWriter(t, timeout)
	big := bigLine()
	done := make(chan []byte, 1)
	go func() {
		var got []byte
		buf := make([]byte, 64<<10)
		for len(got) < 2*len(big) {
			n, err := peer.Read(buf)
			if err != nil {
				break
			}
			got = append(got, buf[:n]...)
			time.Sleep(50 * time.Millisecond) // a slow reader: 64 KiB at a time
		}
		done <- got
	}()
	start := time.Now()
	require.NoError(t, w.write(big), "one line")
	require.NoError(t, w.writeLines([][]byte{big[:len(big)/2], big[len(big)/2:]}), "lines in one call")
	took := time.Since(start)
	assert.Greater(t, took, 2*timeout, "the reader is slow: the lines took several timeouts")
	assert.True(t, bytes.Equal(append(bytes.Clone(big), big...), <-done), "the lines arrive whole")
	t.Logf("2 MiB to a reader of 64 KiB every 50ms: %s, with a %s timeout", took, timeout)
}

// TestLineWriterClearsDeadline: a line that needed the deadline leaves none
// behind, so that a line written after the deadline would have passed
// still goes.
func TestLineWriterClearsDeadline(t *testing.T) {
	const timeout = 500 * time.Millisecond
	w, peer := testLineWriter(t, timeout)
	big := bigLine()
	got := readAll(peer, len(big)+2)
	start := time.Now()
	require.NoError(t, w.write(big))
	// Real sockets keep real deadlines: only time passing shows that the
	// one this write set is gone.
	<-time.After(time.Until(start.Add(timeout + 50*time.Millisecond)))
	require.NoError(t, w.write([]byte("a\n")))
	assert.Len(t, <-got, len(big)+2)
}
