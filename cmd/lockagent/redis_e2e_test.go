package main

import (
	"fmt"
	"net"
	"os"
	"syscall"
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

// TestStopDuringStartup: a SIGTERM while the agent waits for its Redis
// (here, a server that accepts and never answers) stops it cleanly: exit
// 0 within a Redis read's timeout, its socket removed.
func TestStopDuringStartup(t *testing.T) {
	t.Parallel()
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer mute.Close()
	go func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	e := newAgentEnv(t)
	e.writeConfig(t, fmt.Sprintf("backend \"redis\" {\n  addresses = [%q]\n}\n", mute.Addr().String()))
	p := e.spawn(t)
	eventually(t, exitTimeout, "the agent binds its socket", func() bool {
		_, err := os.Stat(e.socket)
		return err == nil
	})
	p.signal(t, syscall.SIGTERM)
	stopped := time.Now()
	require.Equal(t, 0, p.wait(t, exitTimeout), "exit status; stderr:\n%s", p.stderr)
	// A read from Redis in flight ends at its timeout (3 s), not at once.
	require.Less(t, time.Since(stopped), 5*time.Second, "stopped within a read's timeout, not after the backend's (10 s)")
	require.Contains(t, p.stderr.String(), "stopped during start-up")
	_, err = os.Stat(e.socket)
	require.ErrorIs(t, err, os.ErrNotExist, "socket removed")
}
