package agent_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
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
		st := a.Stats()
		assert.False(t, st.Degraded, "renewed")
		assert.Contains(t, st.BackendError, "unavailable", "told for 5 s after the failure")
		time.Sleep(6 * time.Second) // renewals reach the backend
		assert.Equal(t, agent.Stats{Sessions: 2, Leases: 2, Waiters: 1}, a.Stats())

		cancel()
		synctest.Wait()
		assert.Equal(t, agent.Stats{Sessions: 2, Leases: 2}, a.Stats())
	})
}

// recorder is an Observer that keeps the results of acquires and the ops
// of backend errors.
type recorder struct {
	mu      sync.Mutex
	results []string
	errors  []string
}

func (r *recorder) Acquired(_ backend.Mode, result string, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.results = append(r.results, result)
}
func (r *recorder) Renewed(int, time.Duration, int) {}
func (r *recorder) Lost(string)                     {}
func (r *recorder) BackendError(op string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, op)
}

// TestWaitEndedWithTheSessionIsCanceled: a waiting acquire that ends with
// its session (bye, a dropped connection) is answered canceled, and
// counted so, not as an error.
func TestWaitEndedWithTheSessionIsCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		a, _, stop := run(t, agent.Config{Observer: rec})
		defer stop()
		holder, _ := openSession(t, a)
		mustAcquire(t, holder, agent.AcquireRequest{Name: "n"})
		waiter, c := openSession(t, a)
		errc := make(chan error, 1)
		go func() {
			_, err := waiter.Acquire(context.Background(), agent.AcquireRequest{Name: "n", Wait: -1})
			errc <- err
		}()
		synctest.Wait()
		waiter.Bye(context.Background(), c)
		require.ErrorIs(t, <-errc, agent.ErrSessionEnded)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		assert.Equal(t, []string{agent.ResultGranted, agent.ResultCanceled}, rec.results)
		assert.Empty(t, rec.errors)
	})
}

// count is how many backend errors of op the recorder was told of.
func (r *recorder) count(op string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, o := range r.errors {
		if o == op {
			n++
		}
	}
	return n
}

// TestEveryFailedCallIsCounted: each backend call that fails is told to
// the observer: every attempt of a waiting acquire and of a campaign
// through an outage, not only an acquire that ends in the error, and the
// releases of a break.
func TestEveryFailedCallIsCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		a, f, stop := run(t, agent.Config{Observer: rec})
		defer stop()
		holder, _ := openSession(t, a)
		mustAcquire(t, holder, agent.AcquireRequest{Name: "n"})
		s, _ := openSession(t, a)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := s.Acquire(ctx, agent.AcquireRequest{Name: "n", Wait: agent.WaitForever})
			done <- err
		}()
		synctest.Wait()
		f.failAcquire.Store(true)
		time.Sleep(5 * time.Second)
		assert.GreaterOrEqual(t, rec.count("acquire"), 3, "the waiting acquire's attempts")

		before := rec.count("acquire")
		_, err := s.Campaign(agent.CampaignRequest{Name: "c"})
		require.NoError(t, err)
		time.Sleep(5 * time.Second)
		assert.GreaterOrEqual(t, rec.count("acquire")-before, 6, "the campaign's attempts too")

		f.failRelease.Store(true)
		_, err = s.Break(context.Background(), "n")
		require.ErrorIs(t, err, backend.ErrUnavailable)
		assert.GreaterOrEqual(t, rec.count("release"), 1, "the break's release")

		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		f.failAcquire.Store(false)
		f.failRelease.Store(false)
	})
}
