package agent_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/backend/memory"
)

// history is one order of what the agent tells every session: lost and
// elected events as the sessions' connections are sent them, and grants
// as they are handed out.
type history struct {
	mu    sync.Mutex
	lines []string
}

func (h *history) add(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, fmt.Sprintf(format, args...))
}

func (h *history) got() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.lines...)
}

// histConn is a session's connection that writes what it is sent into a
// history at once.
type histConn struct {
	h    *history
	name string
}

func (c *histConn) Send(ev agent.Event) {
	if ev.Kind == agent.EventLost || ev.Kind == agent.EventElected {
		c.h.add("%s %s %s", c.name, ev.Kind, ev.Name)
	}
}
func (c *histConn) Close()                   {}
func (c *histConn) Written() <-chan struct{} { return closedChan }

// starved is an agent whose scheduler does not run until the test ends,
// as when the agent is stopped or starved of CPU: no lease is lost at its
// local deadline by the scheduler. What it needs to run is done by the
// requests alone.
func starved(t *testing.T) (*agent.Agent, *history, func(name string, opts agent.SessionOptions) (*agent.Session, *histConn)) {
	t.Helper()
	mb, err := memory.Open(filepath.Join(t.TempDir(), "state"))
	require.NoError(t, err)
	a := agent.New(agent.Config{Backend: mb})
	t.Cleanup(func() {
		// The scheduler runs at last, to shut the agent down.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		a.Run(ctx)
		mb.Close()
	})
	h := &history{}
	open := func(name string, opts agent.SessionOptions) (*agent.Session, *histConn) {
		c := &histConn{h: h, name: name}
		s, err := a.Open(agent.Peer{}, opts, c)
		require.NoError(t, err)
		return s, c
	}
	return a, h, open
}

// granted records the grant of req in h.
func granted(h *history, who string, req agent.AcquireRequest) agent.AcquireRequest {
	req.Granted = func(l agent.Lease) { h.add("%s granted %s", who, l.Name) }
	return req
}

// TestNoGrantBeforeTheHolderIsTold: with the agent's scheduler starved past
// a holder's local deadline, the backend lets the holder's lease expire
// and grants its name again; whatever asks for it — a try, a waiting
// acquire trying again, a waiter woken by a release, a campaign — the
// holder is told it lost the lease before the grant is handed out. A
// session resumed after its lease's deadline is told of the loss too.
func TestNoGrantBeforeTheHolderIsTold(t *testing.T) {
	const ttl = time.Second
	ctx := context.Background()
	t.Run("try", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, h, open := starved(t)
			holder, _ := open("holder", agent.SessionOptions{})
			mustAcquire(t, holder, agent.AcquireRequest{Name: "n", TTL: ttl})
			time.Sleep(2 * ttl)
			other, _ := open("other", agent.SessionOptions{})
			res, err := other.Acquire(ctx, granted(h, "other", agent.AcquireRequest{Name: "n", TTL: ttl}))
			require.NoError(t, err)
			require.True(t, res.Acquired)
			assert.Equal(t, []string{"holder lost n", "other granted n"}, h.got())
		})
	})
	t.Run("waiter asking again", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, h, open := starved(t)
			holder, _ := open("holder", agent.SessionOptions{})
			mustAcquire(t, holder, agent.AcquireRequest{Name: "n", TTL: ttl})
			waiter, _ := open("waiter", agent.SessionOptions{})
			res, err := waiter.Acquire(ctx, granted(h, "waiter", agent.AcquireRequest{Name: "n", TTL: ttl, Wait: agent.WaitForever}))
			require.NoError(t, err)
			require.True(t, res.Acquired)
			assert.Equal(t, []string{"holder lost n", "waiter granted n"}, h.got())
		})
	})
	t.Run("waiter woken", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, h, open := starved(t)
			holder, _ := open("holder", agent.SessionOptions{})
			mustAcquire(t, holder, agent.AcquireRequest{Name: "n", Mode: backend.Shared, TTL: ttl})
			other, _ := open("other", agent.SessionOptions{})
			long := mustAcquire(t, other, agent.AcquireRequest{Name: "n", Mode: backend.Shared, TTL: time.Hour})
			waiter, _ := open("waiter", agent.SessionOptions{})
			done := make(chan agent.AcquireResult)
			go func() {
				res, err := waiter.Acquire(ctx, granted(h, "waiter", agent.AcquireRequest{Name: "n", TTL: ttl, Wait: agent.WaitForever}))
				assert.NoError(t, err)
				done <- res
			}()
			time.Sleep(2 * ttl)
			synctest.Wait()
			require.Empty(t, h.got(), "granted while a holder of an hour holds the name")
			// The release wakes the waiter, whose grant is the first
			// look at the holder's deadline since it passed.
			require.NoError(t, other.Release(ctx, long.ID))
			require.True(t, (<-done).Acquired)
			assert.Equal(t, []string{"holder lost n", "waiter granted n"}, h.got())
		})
	})
	t.Run("campaign", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, h, open := starved(t)
			holder, _ := open("holder", agent.SessionOptions{})
			mustAcquire(t, holder, agent.AcquireRequest{Name: "n", TTL: ttl})
			candidate, _ := open("candidate", agent.SessionOptions{})
			_, err := candidate.Campaign(agent.CampaignRequest{Name: "n", TTL: ttl})
			require.NoError(t, err)
			time.Sleep(2 * ttl)
			synctest.Wait()
			assert.Equal(t, []string{"holder lost n", "candidate elected n"}, h.got())
		})
	})
	t.Run("resume", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a, h, open := starved(t)
			sessionTTL := time.Hour
			holder, c := open("holder", agent.SessionOptions{SessionTTL: &sessionTTL})
			mustAcquire(t, holder, agent.AcquireRequest{Name: "n", TTL: ttl, Scope: agent.ScopeSession})
			holder.Detach(c)
			time.Sleep(2 * ttl)
			_, err := a.Resume(agent.Peer{}, holder.ID(), holder.ResumeToken(), agent.SessionOptions{}, &histConn{h: h, name: "resumed"})
			require.NoError(t, err)
			assert.Equal(t, []string{"resumed lost n"}, h.got())
		})
	})
}

// slowConn is a connection whose events are written only when the test
// says so.
type slowConn struct {
	histConn
	written chan struct{}
}

func (c *slowConn) Written() <-chan struct{} { return c.written }

// TestGrantWaitsForTheLostEvent: the grant of a name whose holder on this
// agent was just told it lost the name (here, broken by an admin) is handed
// out once the holder's connection has written the lost event, or once
// NotifyBudget has passed, whichever comes first.
func TestGrantWaitsForTheLostEvent(t *testing.T) {
	ctx := context.Background()
	for _, written := range []bool{true, false} {
		t.Run(fmt.Sprintf("written=%v", written), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a, _, stop := run(t, agent.Config{NotifyBudget: 50 * time.Millisecond})
				defer stop()
				h := &history{}
				holderConn := &slowConn{histConn{h, "holder"}, make(chan struct{})}
				holder, err := a.Open(agent.Peer{}, agent.SessionOptions{}, holderConn)
				require.NoError(t, err)
				mustAcquire(t, holder, agent.AcquireRequest{Name: "n"})
				waiter, _ := openSession(t, a)
				grantedAt := make(chan time.Time, 1)
				go func() {
					req := agent.AcquireRequest{Name: "n", Wait: agent.WaitForever}
					req.Granted = func(agent.Lease) { grantedAt <- time.Now() }
					res, err := waiter.Acquire(ctx, req)
					assert.NoError(t, err)
					assert.True(t, res.Acquired)
				}()
				synctest.Wait()
				admin, _ := openSession(t, a)
				broken := time.Now()
				n, err := admin.Break(ctx, "n")
				require.NoError(t, err)
				require.Equal(t, 1, n)
				synctest.Wait()
				require.Equal(t, []string{"holder lost n"}, h.got())
				require.Empty(t, grantedAt, "granted before the holder's lost event was written")
				if written {
					time.Sleep(20 * time.Millisecond)
					close(holderConn.written)
					assert.Equal(t, broken.Add(20*time.Millisecond), <-grantedAt, "granted once the lost event is written")
				} else {
					assert.Equal(t, broken.Add(50*time.Millisecond), <-grantedAt, "granted once NotifyBudget has passed")
				}
			})
		})
	}
}
