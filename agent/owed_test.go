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

// TestReleaseAnsweredAtOnce: a release is answered before the backend
// hears of it; the next attempt of its name sends it first, in its own
// call, so that it reaches the backend after the release; a release no
// attempt takes goes on its own within a millisecond.
func TestReleaseAnsweredAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, _ := openSession(t, a)
		other, _ := openSession(t, a)

		l := mustAcquire(t, s, agent.AcquireRequest{Name: "n"})
		f.releaseDelay.Store(int64(time.Hour)) // a release on its own would hang
		start := time.Now()
		require.NoError(t, s.Release(context.Background(), l.ID))
		assert.Zero(t, time.Since(start), "answered at once")
		assert.Equal(t, 1, f.holders(t, "n"), "the backend has not heard of it yet")
		info, err := other.Inspect(context.Background(), "n")
		require.NoError(t, err)
		assert.Empty(t, info.Holders, "the agent does not show a lease it released")

		calls := f.acquireCalls.Load()
		g := mustAcquire(t, other, agent.AcquireRequest{Name: "n"})
		assert.Greater(t, g.Token, l.Token)
		assert.Equal(t, calls+1, f.acquireCalls.Load())
		assert.Zero(t, f.releaseCalls.Load(), "the release went with the acquire")

		// Alone, it goes within releaseDelay.
		f.releaseDelay.Store(0)
		require.NoError(t, other.Release(context.Background(), g.ID))
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assert.Equal(t, int64(1), f.releaseCalls.Load())
		assert.Zero(t, f.holders(t, "n"))
	})
}

// TestReleaseWithAFailedAttempt: an attempt that took an owed release and
// failed leaves it owed, and it goes on its own.
func TestReleaseWithAFailedAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, _ := openSession(t, a)
		l := mustAcquire(t, s, agent.AcquireRequest{Name: "n"})
		require.NoError(t, s.Release(context.Background(), l.ID))
		f.failAcquire.Store(true)
		_, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "n"})
		require.Error(t, err)
		f.failAcquire.Store(false)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assert.Zero(t, f.holders(t, "n"), "released on its own")
		// It, and the failed attempt's lease, which may have been granted.
		assert.Equal(t, int64(2), f.releaseCalls.Load())
	})
}

// TestFreezeSendsOwedReleases: a frozen agent owes the backend nothing:
// the state handed over has no place for an owed release.
func TestFreezeSendsOwedReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, _ := openSession(t, a)
		l := mustAcquire(t, s, agent.AcquireRequest{Name: "n"})
		require.NoError(t, s.Release(context.Background(), l.ID))
		require.NoError(t, a.Freeze(context.Background()))
		assert.Zero(t, f.holders(t, "n"))
		a.Thaw()
	})
}
