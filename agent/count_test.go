package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockagent/lockagent/backend/memory"
	"github.com/stretchr/testify/require"
)

// TestGrantCountsOnce: from the moment an acquire, a try or a wait, is
// granted, its name counts once against the session's and the uid's lease
// limits, not as a lease and a pending acquire both (which refused
// pipelined acquires at the limit).
func TestGrantCountsOnce(t *testing.T) {
	mb, err := memory.Open(filepath.Join(t.TempDir(), "state"))
	require.NoError(t, err)
	defer mb.Close()
	a := New(Config{Backend: mb})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	const uid = 1000
	s, err := a.Open(Peer{UID: uid}, SessionOptions{}, &events{})
	require.NoError(t, err)
	for i, wait := range []time.Duration{0, time.Second} {
		var held, perUID int
		res, err := s.Acquire(context.Background(), AcquireRequest{Name: fmt.Sprint("n", i), Wait: wait,
			Granted: func(Lease) { held, perUID = s.held(), a.perUID[uid] }}) // a.mu is held
		require.NoError(t, err)
		require.True(t, res.Acquired)
		require.Equal(t, i+1, held, "the session's count at the grant, wait %s", wait)
		require.Equal(t, i+1, perUID, "the uid's count at the grant, wait %s", wait)
	}
}
