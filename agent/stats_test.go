package agent_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/agent"
)

// TestStats: the snapshot counts sessions, leases and waiters, and says
// when renewals fail and when they recover.
func TestStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		assert.Equal(t, agent.Stats{}, a.Stats())

		s1, err := a.Open(agent.Peer{}, agent.SessionOptions{}, &conn{})
		require.NoError(t, err)
		s2, err := a.Open(agent.Peer{}, agent.SessionOptions{}, &conn{})
		require.NoError(t, err)
		mustAcquire(t, s1, agent.AcquireRequest{Name: "a", TTL: 3 * time.Second})
		mustAcquire(t, s1, agent.AcquireRequest{Name: "b", TTL: 3 * time.Second})
		ctx, cancel := context.WithCancel(context.Background())
		go s2.Acquire(ctx, agent.AcquireRequest{Name: "a", Wait: agent.WaitForever})
		synctest.Wait()
		assert.Equal(t, agent.Stats{Sessions: 2, Leases: 2, Waiters: 1}, a.Stats())

		f.failRenew.Store(true)
		time.Sleep(time.Second + 100*time.Millisecond) // the first renewal, at TTL/3, fails
		assert.True(t, a.Stats().Degraded)
		f.failRenew.Store(false)
		time.Sleep(400 * time.Millisecond) // retried at TTL/10
		assert.Equal(t, agent.Stats{Sessions: 2, Leases: 2, Waiters: 1}, a.Stats())

		cancel()
		synctest.Wait()
		assert.Equal(t, agent.Stats{Sessions: 2, Leases: 2}, a.Stats())
	})
}
