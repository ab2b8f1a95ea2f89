package handover

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pair is both sides of a conversation in one process.
func pair(t *testing.T) (old, new *Conn) {
	t.Helper()
	old, f, err := Pair()
	require.NoError(t, err)
	new, err = Open(int(f.Fd()))
	require.NoError(t, err)
	t.Cleanup(func() { old.Close(); new.Close() })
	return old, new
}

func TestMessagesGoAcross(t *testing.T) {
	old, new := pair(t)
	hello := Hello{Version: "2.0", PID: 42, Formats: []int{Format}, Settings: Settings{Backend: "memory /x", Socket: "/s"}}
	require.NoError(t, new.Send(hello))
	var got Hello
	require.NoError(t, old.Recv(&got))
	require.Equal(t, hello, got)
}

// TestDescriptorsGoAcrossInBatches: more descriptors than one message
// carries arrive all, in order, open.
func TestDescriptorsGoAcrossInBatches(t *testing.T) {
	old, new := pair(t)
	dir := t.TempDir()
	var fds []int
	for i := range 2*fdBatch + 7 {
		f, err := os.Create(filepath.Join(dir, strconv.Itoa(i)))
		require.NoError(t, err)
		defer f.Close()
		_, err = f.WriteString(strconv.Itoa(i))
		require.NoError(t, err)
		fds = append(fds, int(f.Fd()))
	}
	done := make(chan error, 1)
	go func() { done <- old.SendFDs(fds) }()
	files, err := new.RecvFDs(len(fds))
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Len(t, files, len(fds))
	for i, f := range files {
		b := make([]byte, 8)
		n, err := f.ReadAt(b, 0)
		require.Equal(t, strconv.Itoa(i), string(b[:n]), "descriptor %d: %v", i, err)
		f.Close()
	}
}

// TestOversizedMessageRefused: a length above the bound is an error, not
// an allocation.
func TestOversizedMessageRefused(t *testing.T) {
	old, new := pair(t)
	_, err := new.uc.Write([]byte{0xff, 0xff, 0xff, 0xff})
	require.NoError(t, err)
	var h Hello
	require.ErrorContains(t, old.Recv(&h), "a message of 4294967295 bytes")
}

func TestSinceCountsOnTheMonotonicClock(t *testing.T) {
	st := State{Mono: Now() - time.Second}
	require.GreaterOrEqual(t, st.Since(), time.Second)
	st.Mono += 1 << 40 // in the future: never negative
	require.Zero(t, st.Since())
}
