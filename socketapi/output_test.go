package socketapi

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testOutput is the output of one end of a socket pair, bound to maxBytes;
// the peer is the other end. It is closed, and its writers waited for,
// when the test ends.
func testOutput(t *testing.T, maxBytes int) (*output, net.Conn) {
	nc, peer := socketPair(t)
	_, raw := connFD(nc)
	nolog := func(string, ...any) {}
	o := &output{
		w:           newLineWriter(nc, raw, 10*time.Second),
		maxBytes:    maxBytes,
		closeSocket: func() { nc.Close() },
		warn:        nolog,
		debug:       nolog,
	}
	t.Cleanup(func() {
		o.close()
		o.writers.Wait()
	})
	return o, peer
}

// TestLargeAnswerBehindAWrite: a large answer queued while the writer is
// busy with earlier lines is not counted against the output bound, and
// the lines queued behind it go out too.
func TestLargeAnswerBehindAWrite(t *testing.T) {
	const maxBytes = 4096
	c, peer := testOutput(t, maxBytes)

	// A line larger than the socket's buffer keeps a writer busy until
	// the peer reads.
	first := bigLine()
	c.enqueue(first, false)
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.writing && len(c.lines) == 0
	}, 5*time.Second, time.Millisecond, "the writer takes the line")

	event := []byte(`{"event":"backend","state":"degraded"}` + "\n")
	answer := append(bytes.Repeat([]byte("a"), 3*maxBytes), '\n')
	pong := []byte(`{"id":1,"ok":true,"pong":true}` + "\n")
	for _, line := range [][]byte{event, answer, pong} {
		c.enqueue(line, true)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	require.False(t, closed, "the connection was cut off")

	want := bytes.Join([][]byte{first, event, answer, pong}, nil)
	got := readAll(peer, len(want))
	select {
	case b := <-got:
		require.Equal(t, len(want), len(b))
		require.True(t, bytes.Equal(want, b), "the lines arrive whole and in order")
	case <-time.After(10 * time.Second):
		t.Fatal("the lines did not arrive")
	}
}

// TestWritten: written's channel is closed once the lines queued before it
// was asked for are written, not before, and at once when nothing waits;
// a connection that closes ends the wait too.
func TestWritten(t *testing.T) {
	c, peer := testOutput(t, 1<<20)

	requireClosed := func(ch <-chan struct{}, want bool, what string) {
		t.Helper()
		select {
		case <-ch:
			require.True(t, want, what)
		default:
			require.False(t, want, what)
		}
	}
	requireClosed(c.written(), true, "nothing queued: written")

	// A line larger than the socket's buffer waits for the peer to read.
	first := bigLine()
	c.enqueue(first, false)
	written := c.written()
	event := []byte(`{"event":"lost"}` + "\n")
	c.enqueue(event, false)
	afterEvent := c.written()
	requireClosed(written, false, "the large line is not written while the peer does not read")

	got := readAll(peer, len(first)+len(event))
	select {
	case <-afterEvent:
	case <-time.After(10 * time.Second):
		t.Fatal("Written's channel not closed once the peer read every line")
	}
	requireClosed(written, true, "the earlier wait ended too")
	require.Len(t, <-got, len(first)+len(event))

	c.enqueue(bigLine(), false)
	pending := c.written()
	requireClosed(pending, false, "a line waits")
	c.mu.Lock()
	c.closeNow()
	c.mu.Unlock()
	requireClosed(pending, true, "a connection closed ends the wait")
}
