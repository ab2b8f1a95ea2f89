package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/redistest"
)

// TestA1_AcrossAgents: an app on one agent holds a lock and drops; a
// waiter on another agent gets it well under 100 ms later, with a higher
// token.
func TestA1_AcrossAgents(t *testing.T) {
	t.Parallel()
	f := startFleet(t, 2, redistest.Options{}, "")
	holder := f.agents[0].client(t, "holder")
	l := mustAcquire(t, holder, "fleet/a1", nil)

	waiter := f.agents[1].client(t, "waiter")
	require.False(t, tryAcquire(t, waiter, "fleet/a1", nil).Acquired)
	got := make(chan lease, 1)
	go func() {
		var w lease
		waiter.Call(t.Context(), "acquire", map[string]any{"name": "fleet/a1", "wait_ms": 10000}, &w)
		got <- w
	}()
	f.agents[1].waitQueued(t, 1)
	dropped := time.Now()
	holder.Close()
	w := <-got
	took := time.Since(dropped)
	require.True(t, w.Acquired)
	assert.Greater(t, w.Token, l.Token)
	assert.Less(t, took, 100*time.Millisecond, "the waiter on the other agent was woken by the release")
	t.Logf("A1 across agents: granted %v after the holder dropped", took)
}
