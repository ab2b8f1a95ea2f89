package agent_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/backend/memory"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// faulty is the memory backend with faults switched on by the test: the
// embedded backend is the fake, and faults are injected around it.
type faulty struct {
	*memory.Backend
	failRenew    atomic.Bool  // renewals fail with ErrUnavailable
	acquireDelay atomic.Int64 // an acquire's answer takes this long
	renewCalls   atomic.Int64
	lastRenewOK  atomic.Int64 // when the last successful renewal was sent, in Unix ns
	lostAnswer   atomic.Bool  // an acquire is applied, but its answer lost
	failPrefix   atomic.Value // string: renewals of names with it fail
	releaseDelay atomic.Int64 // a release is sent this late, unless its context ends first
	failRelease  atomic.Bool  // releases fail with ErrUnavailable
	lateAnswer   atomic.Bool  // a renewal is answered only when its context ends (see Renew)
	failAcquire  atomic.Bool  // acquires fail with ErrUnavailable, not applied
	hangAcquire  atomic.Bool  // acquires go unanswered until their deadline, not applied
	acquireCalls atomic.Int64
	releaseCalls atomic.Int64

	mu       sync.Mutex
	failedAt []time.Time // when each renewal that failed with failRenew was sent
}

// holders is how many holders the backend has for name.
func (f *faulty) holders(t *testing.T, name string) int {
	t.Helper()
	info, err := f.Inspect(context.Background(), name)
	require.NoError(t, err)
	return len(info.Holders)
}

func (f *faulty) Renew(ctx context.Context, reqs []backend.RenewRequest) []error {
	f.renewCalls.Add(1)
	if f.lateAnswer.Load() {
		// The answer comes when the agent stops waiting for it: it failed
		// if the agent waited a sixth of the TTL; if it waited less, the
		// wait was cut at a lease's local deadline, and the renewals are
		// applied, but answered right at that deadline.
		sent := time.Now()
		<-ctx.Done()
		errs := make([]error, len(reqs))
		if time.Since(sent) >= reqs[0].TTL/6 {
			for i := range errs {
				errs[i] = backend.ErrUnavailable
			}
		}
		return errs
	}
	if f.failRenew.Load() {
		f.mu.Lock()
		f.failedAt = append(f.failedAt, time.Now())
		f.mu.Unlock()
		errs := make([]error, len(reqs))
		for i := range errs {
			errs[i] = backend.ErrUnavailable
		}
		return errs
	}
	f.lastRenewOK.Store(time.Now().UnixNano())
	errs := f.Backend.Renew(ctx, reqs)
	if p, _ := f.failPrefix.Load().(string); p != "" {
		for i, r := range reqs {
			if strings.HasPrefix(r.Name, p) {
				errs[i] = backend.ErrUnavailable
			}
		}
	}
	return errs
}

func (f *faulty) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Grant, error) {
	f.acquireCalls.Add(1)
	if f.failAcquire.Load() {
		return backend.Grant{}, fmt.Errorf("acquire %s: %w", req.Name, backend.ErrUnavailable)
	}
	if f.hangAcquire.Load() {
		select {
		case <-time.After(time.Until(req.Deadline)):
		case <-ctx.Done():
		}
		return backend.Grant{}, fmt.Errorf("acquire %s: %w: no answer", req.Name, backend.ErrUnavailable)
	}
	g, err := f.Backend.Acquire(ctx, req)
	time.Sleep(time.Duration(f.acquireDelay.Load()))
	if err == nil && f.lostAnswer.Load() {
		return backend.Grant{}, backend.ErrUnavailable
	}
	return g, err
}

// Local is false: faulty stands for a backend across a network, whose
// releases the agent owes (see agent's owe).
func (f *faulty) Local() bool { return false }

func (f *faulty) Release(ctx context.Context, l backend.LeaseKey) error {
	f.releaseCalls.Add(1)
	if f.failRelease.Load() {
		return fmt.Errorf("release %s: %w", l.Name, backend.ErrUnavailable)
	}
	select {
	case <-time.After(time.Duration(f.releaseDelay.Load())):
		return f.Backend.Release(ctx, l)
	case <-ctx.Done():
		return ctx.Err() // never sent, as a call taken out of a gathering batch
	}
}

// conn records what the agent sends to a session.
type conn struct {
	mu     sync.Mutex
	events []stamped
	closed bool
}

type stamped struct {
	agent.Event
	at time.Time
}

func (c *conn) Send(ev agent.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, stamped{ev, time.Now()})
}

func (c *conn) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
}

// Written: Send records an event at once.
func (c *conn) Written() <-chan struct{} { return closedChan }

var closedChan = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

func (c *conn) got() []stamped {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]stamped(nil), c.events...)
}

// run starts an agent on a faulty memory backend; the returned stop ends it
// and waits for all of its goroutines.
func run(t *testing.T, cfg agent.Config) (*agent.Agent, *faulty, func()) {
	t.Helper()
	mb, err := memory.Open(filepath.Join(t.TempDir(), "state"))
	require.NoError(t, err)
	f := &faulty{Backend: mb}
	cfg.Backend = f
	a := agent.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	t.Cleanup(func() { mb.Close() })
	return a, f, func() { cancel(); <-done }
}

// openSession opens a session of peer uid 0 with default options on a
// connection that records what it is sent.
func openSession(t *testing.T, a *agent.Agent) (*agent.Session, *conn) {
	t.Helper()
	c := &conn{}
	s, err := a.Open(agent.Peer{}, agent.SessionOptions{}, c)
	require.NoError(t, err)
	return s, c
}

func mustAcquire(t *testing.T, s *agent.Session, req agent.AcquireRequest) agent.Lease {
	t.Helper()
	res, err := s.Acquire(context.Background(), req)
	require.NoError(t, err)
	require.True(t, res.Acquired, "denied: %s", res.Reason)
	return res.Lease
}

// TestRenewalKeepsLeasesAlive: with a healthy backend a lease lives as long
// as its session, whatever its TTL.
func TestRenewalKeepsLeasesAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, c := openSession(t, a)
		l := mustAcquire(t, s, agent.AcquireRequest{Name: "n", TTL: time.Second})

		time.Sleep(time.Hour)
		assert.Empty(t, c.got())
		res, err := s.Check(context.Background(), l.ID)
		require.NoError(t, err)
		assert.True(t, res.Held)
		// About three renewals a TTL (±10% jitter), batched.
		assert.InDelta(t, 3*3600, f.renewCalls.Load(), 400)
	})
}

// margin is how much sooner than the backend the agent gives a lease up:
// 1% drift, 2ms of expiry precision, 50ms to deliver the event.
func margin(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond + 50*time.Millisecond
}

// TestLostAtLocalDeadline: when renewals fail, the session is told the
// backend is degraded, then the lease is lost at the local deadline: before
// the backend's own expiry, so before anybody else could be granted it.
func TestLostAtLocalDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, c := openSession(t, a)
		const ttl = 3 * time.Second
		l := mustAcquire(t, s, agent.AcquireRequest{Name: "n", TTL: ttl})

		time.Sleep(5 * time.Second) // a few healthy renewals
		f.failRenew.Store(true)
		failedFrom := time.Now()
		time.Sleep(2 * ttl)

		evs := c.got()
		require.Len(t, evs, 2, "%v", evs)
		assert.Equal(t, agent.EventBackend, evs[0].Kind)
		assert.Equal(t, "degraded", evs[0].State)
		lost := evs[1]
		assert.Equal(t, agent.EventLost, lost.Kind)
		assert.Equal(t, agent.ReasonBackendUnavailable, lost.Reason)
		assert.Equal(t, l.ID, lost.Lease)
		assert.Equal(t, l.Token, lost.Token)

		// The backend keeps the lease ttl after the last renewal that
		// succeeded was sent; the agent gives it up a margin earlier.
		lastGood := time.Unix(0, f.lastRenewOK.Load())
		assert.Equal(t, lastGood.Add(ttl-margin(ttl)), lost.at, "lost exactly at the local deadline")
		assert.True(t, lost.at.After(failedFrom), "not before renewals failed")

		_, err := s.Check(context.Background(), l.ID)
		assert.ErrorIs(t, err, agent.ErrNotHeld, "after lost the lease id is dead")
	})
}

// TestRenewalAnsweredAtTheDeadline: a renewal tried again close to the
// lease's local deadline is applied by the backend, but its answer comes
// only at that deadline. Too late to count: the lease is lost then, as
// unavailable, whether the answer or the scheduler's deadline is handled
// first.
func TestRenewalAnsweredAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, c := openSession(t, a)
		const ttl = 3 * time.Second
		l := mustAcquire(t, s, agent.AcquireRequest{Name: "n", TTL: ttl})
		granted := time.Now()
		f.lateAnswer.Store(true)
		time.Sleep(2 * ttl)

		evs := c.got()
		require.Len(t, evs, 2, "%v", evs)
		assert.Equal(t, "degraded", evs[0].State)
		lost := evs[1]
		assert.Equal(t, agent.EventLost, lost.Kind)
		assert.Equal(t, agent.ReasonBackendUnavailable, lost.Reason, "the answer came too late")
		assert.Equal(t, granted.Add(ttl-margin(ttl)), lost.at, "lost at the local deadline, not extended")
		_, err := s.Check(context.Background(), l.ID)
		assert.ErrorIs(t, err, agent.ErrNotHeld)
		assert.GreaterOrEqual(t, f.renewCalls.Load(), int64(2), "a renewal failed, and one was tried again")
	})
}

// TestWaitThroughAnOutage: an outage of the backend (a restart, a
// failover) does not end a waiting acquire: it asks again, backing off,
// and is granted once the backend is back. A wait that ends during the
// outage fails with the backend's error, not as a timeout.
func TestWaitThroughAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		holder, _ := openSession(t, a)
		held := mustAcquire(t, holder, agent.AcquireRequest{Name: "n"})
		s, _ := openSession(t, a)
		type outcome struct {
			res agent.AcquireResult
			err error
			at  time.Time
		}
		forever, bounded := make(chan outcome, 1), make(chan outcome, 1)
		go func() {
			res, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "n", Wait: agent.WaitForever})
			forever <- outcome{res, err, time.Now()}
		}()
		synctest.Wait()
		f.failAcquire.Store(true) // an outage: every call fails (the release just before it too)
		require.NoError(t, holder.Release(context.Background(), held.ID))
		// The release, owed to the backend, goes within a millisecond
		// (the waiter's attempt, which took it too, failed).
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		f.failRelease.Store(true)
		releases := f.releaseCalls.Load()
		other, _ := openSession(t, a)
		start := time.Now()
		go func() {
			res, err := other.Acquire(context.Background(), agent.AcquireRequest{Name: "m", Wait: 2 * time.Second})
			bounded <- outcome{res, err, time.Now()}
		}()

		time.Sleep(10 * time.Second)
		select {
		case o := <-forever:
			t.Fatalf("the wait ended during the outage: %+v", o)
		default:
		}
		o := <-bounded
		require.ErrorIs(t, o.err, backend.ErrUnavailable, "a wait that ends during the outage says why")
		assert.Equal(t, 2*time.Second, o.at.Sub(start), "at the end of its wait")

		calls := f.acquireCalls.Load()
		time.Sleep(10 * time.Second)
		assert.LessOrEqual(t, f.acquireCalls.Load()-calls, int64(11), "backing off: about one attempt a second")
		// Each failed attempt may have been granted all the same: the
		// next asks again with its lease id, and only the wait that ended
		// gives its last one back (retrying that release, backing off).
		assert.LessOrEqual(t, f.releaseCalls.Load()-releases, int64(12), "no release per attempt")
		f.failAcquire.Store(false)
		f.failRelease.Store(false)
		time.Sleep(time.Second)
		o = <-forever
		require.NoError(t, o.err)
		assert.True(t, o.res.Acquired, "granted once the backend is back")
	})
}

// TestWaitEndsUnanswered: a wait whose one attempt the backend leaves
// unanswered until the wait ends fails as backend_unavailable, not as a
// timeout, which would say the name stayed held; but an attempt sent just
// before the end of the wait, and cut short by it, times out.
func TestWaitEndsUnanswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, _ := openSession(t, a)
		f.hangAcquire.Store(true)
		start := time.Now()
		res, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "n", Wait: 2 * time.Second})
		require.ErrorIs(t, err, backend.ErrUnavailable, "%+v", res)
		assert.Equal(t, 2*time.Second, time.Since(start), "at the end of its wait")
		assert.Equal(t, int64(1), f.acquireCalls.Load())

		f.hangAcquire.Store(false)
		holder, _ := openSession(t, a)
		held := mustAcquire(t, holder, agent.AcquireRequest{Name: "m"})
		done := make(chan agent.AcquireResult, 1)
		go func() {
			res, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "m", Wait: 2 * time.Second})
			assert.NoError(t, err)
			done <- res
		}()
		time.Sleep(2*time.Second - 10*time.Millisecond)
		f.hangAcquire.Store(true) // the next attempt, woken by the release, is cut by the end of the wait
		require.NoError(t, holder.Release(context.Background(), held.ID))
		res = <-done
		assert.False(t, res.Acquired)
		assert.Equal(t, agent.ReasonTimeout, res.Reason, "an attempt of the last 10 ms says nothing of the backend")
	})
}

// TestBackendErrorForgottenWhenIdle: a failure followed within 5 s by a
// call that reaches the backend is forgotten 5 s after it, though no call
// comes after (no lease to renew).
func TestBackendErrorForgottenWhenIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, _ := openSession(t, a)
		f.failAcquire.Store(true)
		_, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "n"})
		require.ErrorIs(t, err, backend.ErrUnavailable)
		f.failAcquire.Store(false)
		time.Sleep(time.Second)
		_, err = s.Inspect(context.Background(), "n")
		require.NoError(t, err)
		assert.NotEmpty(t, a.Stats().BackendError, "within 5 s of the failure")
		time.Sleep(5 * time.Second)
		assert.Empty(t, a.Stats().BackendError, "reached since, and no failure for 5 s")
	})
}

// TestSessionEndsDuringABackoff: a waiter backing off after an outage
// hears at once that its session ended, though it asks the backend again
// only later.
func TestSessionEndsDuringABackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		holder, _ := openSession(t, a)
		mustAcquire(t, holder, agent.AcquireRequest{Name: "n"})
		s, c := openSession(t, a)
		f.failAcquire.Store(true)
		f.failRelease.Store(true)
		ended := make(chan time.Time, 1)
		go func() {
			_, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "n", Wait: agent.WaitForever})
			assert.ErrorIs(t, err, agent.ErrSessionEnded)
			ended <- time.Now()
		}()
		time.Sleep(3*time.Second + 100*time.Millisecond) // backing off, up to a second
		bye := time.Now()
		s.Bye(context.Background(), c)
		assert.Equal(t, bye, <-ended, "at once")
	})
}

// TestBackendErrorInStats: a backend call that cannot reach the backend,
// of any kind, is what Stats tells of it, until a call reaches it again
// with none failing for 5 s; with no lease to renew, Degraded cannot tell.
// When only some calls fail (a part of the backend down), the others do
// not clear it.
func TestBackendErrorInStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, _ := openSession(t, a)
		assert.Empty(t, a.Stats().BackendError)
		f.failAcquire.Store(true) // an outage: every call fails
		f.failRelease.Store(true)
		_, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "n"})
		require.ErrorIs(t, err, backend.ErrUnavailable)
		time.Sleep(time.Minute) // the give-back of the attempt's possible grant is retried, and fails
		st := a.Stats()
		assert.False(t, st.Degraded, "no lease at risk")
		assert.Contains(t, st.BackendError, "unavailable")
		assert.False(t, st.BackendErrorAt.IsZero())

		f.failAcquire.Store(false)
		f.failRelease.Store(false)
		res, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "n"})
		require.NoError(t, err)
		require.True(t, res.Acquired)
		assert.Empty(t, a.Stats().BackendError, "reached again")

		f.failPrefix.Store("down/") // the renewals of names on a failed part fail
		mustAcquire(t, s, agent.AcquireRequest{Name: "down/1", TTL: 30 * time.Second})
		for range 1500 { // its first renewal, at 9–11 s, fails
			if a.Stats().BackendError != "" {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		require.NotEmpty(t, a.Stats().BackendError, "the renewal failed")
		for i := range 40 { // calls to the other parts, while the renewal is retried every 3 s
			_, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: fmt.Sprintf("up/%d", i), Wait: time.Second})
			require.NoError(t, err)
			assert.Contains(t, a.Stats().BackendError, "unavailable", "after %d calls that reached the backend", i+1)
			time.Sleep(250 * time.Millisecond)
		}
		f.failPrefix.Store("")
		time.Sleep(5 * time.Second)
		_, err = s.Acquire(context.Background(), agent.AcquireRequest{Name: "up/last"})
		require.NoError(t, err)
		assert.Empty(t, a.Stats().BackendError, "no call failed for 5 s")

		f.failRenew.Store(true)
		time.Sleep(10 * time.Second) // renewals fail
		assert.Contains(t, a.Stats().BackendError, "unavailable", "renewals tell too")
	})
}

// TestDegradedEndsWithTheLeasesAtRisk: the backend is degraded while a
// lease is at risk. When the last one is lost, with no renewal after it
// to tell, the state clears all the same (the metric and the status
// follow it), sessions still holding leases are told ok after the lost
// event, and a later failure is told again.
func TestDegradedEndsWithTheLeasesAtRisk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, c := openSession(t, a)
		f.failPrefix.Store("bad")
		bad := mustAcquire(t, s, agent.AcquireRequest{Name: "bad/1", TTL: 3 * time.Second})
		time.Sleep(6 * time.Second)
		synctest.Wait()
		assert.False(t, a.Stats().Degraded, "nothing at risk any more")
		var kinds []string
		for _, ev := range c.got() {
			kinds = append(kinds, ev.Kind+":"+ev.State+ev.Reason)
		}
		assert.Equal(t, []string{"backend:degraded", "lost:" + agent.ReasonBackendUnavailable}, kinds)
		require.Equal(t, bad.ID, c.got()[1].Lease)

		// A second outage, with a lease renewing well beside: degraded,
		// then ok once the lease at risk is lost.
		mustAcquire(t, s, agent.AcquireRequest{Name: "good", TTL: 3 * time.Second})
		mustAcquire(t, s, agent.AcquireRequest{Name: "bad/2", TTL: 3 * time.Second})
		time.Sleep(2 * time.Second)
		assert.True(t, a.Stats().Degraded)
		time.Sleep(4 * time.Second)
		synctest.Wait()
		assert.False(t, a.Stats().Degraded)
		kinds = kinds[:0]
		for _, ev := range c.got()[2:] {
			kinds = append(kinds, ev.Kind+":"+ev.State+ev.Reason)
		}
		assert.Equal(t, []string{"backend:degraded", "lost:" + agent.ReasonBackendUnavailable, "backend:ok"}, kinds)
	})
}

// TestFailedRenewalRetriedAtATenthOfTTL: while renewals fail, a lease's
// renewal is tried again every tenth of its TTL, on time, although the
// scheduler had planned to sleep longer (until the deadline, or for a
// second), until its local deadline.
func TestFailedRenewalRetriedAtATenthOfTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, c := openSession(t, a)
		const ttl = 5 * time.Second
		mustAcquire(t, s, agent.AcquireRequest{Name: "n", TTL: ttl})
		time.Sleep(3 * time.Second) // a healthy renewal or two
		f.failRenew.Store(true)
		time.Sleep(2 * ttl)

		f.mu.Lock()
		defer f.mu.Unlock()
		require.Greater(t, len(f.failedAt), 5, "%v", f.failedAt)
		for i := 1; i < len(f.failedAt); i++ {
			assert.Equal(t, ttl/10, f.failedAt[i].Sub(f.failedAt[i-1]), "retry %d", i)
		}
		evs := c.got()
		require.Len(t, evs, 2, "%v", evs)
		assert.Equal(t, agent.EventLost, evs[1].Kind)
	})
}

// TestShortOutageLosesNothing: an outage shorter than TTL - margin
// produces no lost lease, and the recovery is announced.
func TestShortOutageLosesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, c := openSession(t, a)
		mustAcquire(t, s, agent.AcquireRequest{Name: "n", TTL: 10 * time.Second})

		time.Sleep(time.Second)
		f.failRenew.Store(true)
		time.Sleep(5 * time.Second)
		f.failRenew.Store(false)
		time.Sleep(time.Minute)

		evs := c.got()
		require.Len(t, evs, 2, "%v", evs)
		assert.Equal(t, "degraded", evs[0].State)
		assert.Equal(t, "ok", evs[1].State)
	})
}

// TestLeaseGoneFromBackend: a renewal that finds the lease gone (an
// operator deleted it) loses it within one renew interval.
func TestLeaseGoneFromBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, c := openSession(t, a)
		const ttl = 3 * time.Second
		l := mustAcquire(t, s, agent.AcquireRequest{Name: "n", TTL: ttl})
		require.NoError(t, f.Release(context.Background(), backend.LeaseKey{Name: "n", LeaseID: l.ID}))
		deleted := time.Now()

		time.Sleep(ttl)
		evs := c.got()
		require.Len(t, evs, 1)
		assert.Equal(t, agent.ReasonExpired, evs[0].Reason)
		assert.LessOrEqual(t, evs[0].at.Sub(deleted), ttl*11/30)
	})
}

// TestLateGrantIsNotHandedOut: a grant whose answer arrives after its local
// deadline is released, never handed out as valid.
func TestLateGrantIsNotHandedOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, err := a.Open(agent.Peer{}, agent.SessionOptions{}, &conn{})
		require.NoError(t, err)
		f.acquireDelay.Store(int64(990 * time.Millisecond))
		res, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "late", TTL: time.Second})
		require.NoError(t, err)
		assert.False(t, res.Acquired)

		f.acquireDelay.Store(0)
		synctest.Wait() // the background release
		info, err := f.Inspect(context.Background(), "late")
		require.NoError(t, err)
		assert.Empty(t, info.Holders)
	})
}

// TestSessionOutlivesConnectionForItsTTL: session-scoped leases survive a
// dropped connection for session_ttl, then go.
func TestSessionOutlivesConnectionForItsTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		c := &conn{}
		peer := agent.Peer{UID: 1000}
		s, err := a.Open(peer, agent.SessionOptions{SessionTTL: ptr(30 * time.Second)}, c)
		require.NoError(t, err)
		mustAcquire(t, s, agent.AcquireRequest{Name: "sess", Scope: agent.ScopeSession, TTL: time.Second})
		mustAcquire(t, s, agent.AcquireRequest{Name: "conn", TTL: time.Second})
		s.Detach(c)

		assert.Equal(t, 0, f.holders(t, "conn"))
		time.Sleep(29 * time.Second)
		assert.Equal(t, 1, f.holders(t, "sess"), "renewed while the session waits for a resume")

		// Another uid cannot resume it, with the right token or not.
		_, err = a.Resume(agent.Peer{UID: 1001}, s.ID(), s.ResumeToken(), agent.SessionOptions{}, &conn{})
		assert.ErrorIs(t, err, agent.ErrSessionExpired)

		time.Sleep(2 * time.Second)
		synctest.Wait()
		assert.Equal(t, 0, f.holders(t, "sess"))
		_, err = a.Resume(peer, s.ID(), s.ResumeToken(), agent.SessionOptions{}, &conn{})
		assert.ErrorIs(t, err, agent.ErrSessionExpired)
	})
}

// TestByeFromATakenOverConnection: a bye that comes from a connection
// whose session another connection took over with a resume (the bye was on
// its way when the resume came) leaves the session to the new connection;
// the new connection's bye ends it and releases its leases.
func TestByeFromATakenOverConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		old, taker := &conn{}, &conn{}
		peer := agent.Peer{UID: 1000}
		s, err := a.Open(peer, agent.SessionOptions{SessionTTL: ptr(30 * time.Second)}, old)
		require.NoError(t, err)
		resumed, err := a.Resume(peer, s.ID(), s.ResumeToken(), agent.SessionOptions{}, taker)
		require.NoError(t, err)
		require.Same(t, s, resumed)
		l := mustAcquire(t, s, agent.AcquireRequest{Name: "n", Scope: agent.ScopeSession, TTL: time.Second})

		s.Bye(context.Background(), old)
		taker.mu.Lock()
		assert.False(t, taker.closed, "the taker's connection stays open")
		taker.mu.Unlock()
		time.Sleep(5 * time.Second) // renewals go on
		info, err := f.Inspect(context.Background(), "n")
		require.NoError(t, err)
		require.Len(t, info.Holders, 1, "the lease is still held")
		assert.Equal(t, l.ID, info.Holders[0].LeaseID)
		mustAcquire(t, s, agent.AcquireRequest{Name: "m", TTL: time.Second})

		s.Bye(context.Background(), taker)
		info, err = f.Inspect(context.Background(), "n")
		require.NoError(t, err)
		assert.Empty(t, info.Holders, "the taker's bye released the lease")
		_, err = s.Acquire(context.Background(), agent.AcquireRequest{Name: "o"})
		assert.ErrorIs(t, err, agent.ErrSessionEnded)
	})
}

// TestAcquireAfterAResume: a connection that resumes a session may
// acquire, or campaign for, a name that the old connection was still
// waiting for when it went (its acquire is being given up): the new
// request takes the old one's place in the session, and the old one,
// should it be granted before it ends, gives the grant back.
func TestAcquireAfterAResume(t *testing.T) {
	for _, campaign := range []bool{false, true} {
		t.Run(fmt.Sprint("campaign=", campaign), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a, f, stop := run(t, agent.Config{MaxLeasesPerUID: 2})
				defer stop()
				holder, _ := openSession(t, a)
				held := mustAcquire(t, holder, agent.AcquireRequest{Name: "n"})
				peer := agent.Peer{UID: 1000}
				s, err := a.Open(peer, agent.SessionOptions{SessionTTL: ptr(30 * time.Second)}, &conn{})
				require.NoError(t, err)
				// The old connection's acquire waits; its context ends
				// only once the new connection has asked.
				oldCtx, cancelOld := context.WithCancel(context.Background())
				oldDone := make(chan error, 1)
				go func() {
					_, err := s.Acquire(oldCtx, agent.AcquireRequest{Name: "n", Wait: -1})
					oldDone <- err
				}()
				synctest.Wait()

				c := &conn{}
				_, err = a.Resume(peer, s.ID(), s.ResumeToken(), agent.SessionOptions{}, c)
				require.NoError(t, err)
				newDone := make(chan agent.AcquireResult, 1)
				if campaign {
					_, err := s.Campaign(agent.CampaignRequest{Name: "n"})
					require.NoError(t, err, "a campaign in the old acquire's place")
				} else {
					go func() {
						res, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "n", Wait: -1})
						assert.NoError(t, err, "an acquire in the old one's place")
						newDone <- res
					}()
				}
				synctest.Wait()
				// The old acquire comes first in the queue: it is granted
				// first, gives the grant back, and the new request has it.
				require.NoError(t, holder.Release(context.Background(), held.ID))
				synctest.Wait()
				cancelOld()
				require.Error(t, <-oldDone)
				var got string
				if campaign {
					synctest.Wait()
					evs := c.got()
					require.NotEmpty(t, evs)
					assert.Equal(t, agent.EventElected, evs[len(evs)-1].Kind)
					got = evs[len(evs)-1].Lease
				} else {
					res := <-newDone
					require.True(t, res.Acquired)
					got = res.Lease.ID
				}
				info, err := f.Inspect(context.Background(), "n")
				require.NoError(t, err)
				require.Len(t, info.Holders, 1)
				assert.Equal(t, got, info.Holders[0].LeaseID, "the new request holds the name, alone")
				list, _, err := s.List(agent.ListRequest{})
				require.NoError(t, err)
				require.Len(t, list, 1)
				require.Len(t, list[0].Leases, 1)
				assert.Empty(t, list[0].Waiting)
				// Nothing was left counted against the uid (a cap of 2).
				mustAcquire(t, s, agent.AcquireRequest{Name: "m"})
			})
		})
	}
}

// TestResumeEndsTheOldWaiters: the waiting acquires of a connection that a
// resume took the session from leave at once, before their goroutines
// notice that their requests were cancelled: they no longer count against
// the limits, nor hold up the queue and the tries of the name.
func TestResumeEndsTheOldWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _, stop := run(t, agent.Config{MaxLeasesPerSession: 2, MaxWaiters: 2})
		defer stop()
		holder, _ := openSession(t, a)
		mustAcquire(t, holder, agent.AcquireRequest{Name: "x", Mode: backend.Shared})
		mustAcquire(t, holder, agent.AcquireRequest{Name: "y"})
		old := &conn{}
		s, err := a.Open(agent.Peer{}, agent.SessionOptions{SessionTTL: ptr(time.Minute)}, old)
		require.NoError(t, err)
		// The requests' contexts are never cancelled, as if the socket
		// server had yet to notice the old connection's end.
		ended := make(chan error, 2)
		for _, name := range []string{"x", "y"} {
			go func() {
				_, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: name, Wait: agent.WaitForever, Conn: old})
				ended <- err
			}()
		}
		synctest.Wait()
		require.Equal(t, 2, a.Stats().Waiters)

		_, err = a.Resume(agent.Peer{}, s.ID(), s.ResumeToken(), agent.SessionOptions{}, &conn{})
		require.NoError(t, err)
		assert.Equal(t, 0, a.Stats().Waiters)
		synctest.Wait() // the old waiters' goroutines, woken, take their tickets out of the backend's queue
		for range 2 {
			assert.ErrorIs(t, <-ended, context.Canceled, "the old acquires end as cancelled")
		}
		other, _ := openSession(t, a)
		mustAcquire(t, other, agent.AcquireRequest{Name: "x", Mode: backend.Shared}) // a try, no longer behind the old waiter
		mustAcquire(t, s, agent.AcquireRequest{Name: "a"})                           // within the session's 2 leases
		res, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "b", Wait: time.Second})
		require.NoError(t, err, "within the session's 2 leases and the agent's 2 waiters")
		assert.True(t, res.Acquired)
		synctest.Wait()
	})
}

// TestResumeAfterTheOldLeasesAreReleased: the new connection's try of a
// name the old connection held, its release on the way to the backend
// (by the resume itself, or by the Detach of a connection that just
// went), waits for the release instead of being denied by the old lease.
func TestResumeAfterTheOldLeasesAreReleased(t *testing.T) {
	for _, detached := range []bool{false, true} {
		t.Run(fmt.Sprint("detached=", detached), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a, f, stop := run(t, agent.Config{})
				defer stop()
				old := &conn{}
				s, err := a.Open(agent.Peer{}, agent.SessionOptions{SessionTTL: ptr(time.Minute)}, old)
				require.NoError(t, err)
				mustAcquire(t, s, agent.AcquireRequest{Name: "x"})
				f.releaseDelay.Store(int64(100 * time.Millisecond))
				if detached {
					go s.Detach(old) // the connection went; its release is on the way
					synctest.Wait()
				}
				_, err = a.Resume(agent.Peer{}, s.ID(), s.ResumeToken(), agent.SessionOptions{}, &conn{})
				require.NoError(t, err)
				mustAcquire(t, s, agent.AcquireRequest{Name: "x"})
			})
		})
	}
}

// TestTryAfterTheConnectionWent: a try of a name whose lease is on its
// way out of the backend, its connection gone, waits for the release
// instead of being denied by it: an application that reconnects at once
// gets the name its old connection held.
func TestTryAfterTheConnectionWent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		old, c := openSession(t, a)
		mustAcquire(t, old, agent.AcquireRequest{Name: "x"})
		f.releaseDelay.Store(int64(100 * time.Millisecond))
		go old.Detach(c)
		synctest.Wait() // the connection is closed; its release is on its way
		c.mu.Lock()
		require.True(t, c.closed)
		c.mu.Unlock()
		s, _ := openSession(t, a)
		start := time.Now()
		mustAcquire(t, s, agent.AcquireRequest{Name: "x"})
		assert.Equal(t, 100*time.Millisecond, time.Since(start), "once the release was done")
	})
}

// TestAcquireAfterAResumeAtTheCaps: the acquire that takes the place of
// the old connection's (cancelled at the resume, its backend call not
// yet back) is not refused by the limits, which that old acquire, being
// given up, no longer counts against.
func TestAcquireAfterAResumeAtTheCaps(t *testing.T) {
	for _, cfg := range []agent.Config{{}, {MaxLeasesPerSession: 1}, {MaxLeasesPerUID: 1}} {
		t.Run(fmt.Sprintf("session=%d,uid=%d", cfg.MaxLeasesPerSession, cfg.MaxLeasesPerUID), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a, f, stop := run(t, cfg)
				defer stop()
				peer := agent.Peer{UID: 1000}
				s, err := a.Open(peer, agent.SessionOptions{SessionTTL: ptr(30 * time.Second)}, &conn{})
				require.NoError(t, err)
				f.acquireDelay.Store(int64(time.Second)) // the old attempt is in the backend
				oldCtx, cancelOld := context.WithCancel(context.Background())
				oldDone := make(chan error, 1)
				go func() {
					_, err := s.Acquire(oldCtx, agent.AcquireRequest{Name: "n", Wait: -1})
					oldDone <- err
				}()
				time.Sleep(10 * time.Millisecond)
				_, err = a.Resume(peer, s.ID(), s.ResumeToken(), agent.SessionOptions{}, &conn{})
				require.NoError(t, err)
				cancelOld() // as socketapi does for the old connection's requests
				f.acquireDelay.Store(0)
				res, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "n", Wait: -1})
				require.NoError(t, err, "the new connection's acquire in the old one's place")
				assert.True(t, res.Acquired)
				assert.Error(t, <-oldDone)
			})
		})
	}
}

// TestRequestsOfATakenOverConnection: an acquire or a campaign that the
// old connection asks once a resume has taken the session (read just
// before its connection was closed) is refused as cancelled: it is not
// made the new connection's, and does not stand in the way of its
// requests.
func TestRequestsOfATakenOverConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _, stop := run(t, agent.Config{})
		defer stop()
		peer := agent.Peer{UID: 1000}
		old, taker := &conn{}, &conn{}
		s, err := a.Open(peer, agent.SessionOptions{SessionTTL: ptr(30 * time.Second)}, old)
		require.NoError(t, err)
		mustAcquire(t, s, agent.AcquireRequest{Name: "before", Conn: old})
		_, err = a.Resume(peer, s.ID(), s.ResumeToken(), agent.SessionOptions{}, taker)
		require.NoError(t, err)

		_, err = s.Acquire(context.Background(), agent.AcquireRequest{Name: "n", Wait: time.Minute, Conn: old})
		require.ErrorIs(t, err, context.Canceled)
		_, err = s.Campaign(agent.CampaignRequest{Name: "c", Conn: old})
		require.ErrorIs(t, err, context.Canceled)

		mustAcquire(t, s, agent.AcquireRequest{Name: "n", Conn: taker})
		_, err = s.Campaign(agent.CampaignRequest{Name: "c", Conn: taker})
		require.NoError(t, err)
	})
}

// TestCampaignAfterAResume: a connection that resumes a session may
// campaign at once for a name that the old connection campaigned for (a
// connection-scoped campaign, stopped with its connection, whose attempt
// may still be under way). The new campaign is elected, alone.
func TestCampaignAfterAResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		holder, _ := openSession(t, a)
		peer := agent.Peer{UID: 1000}
		for i := range 20 {
			name := fmt.Sprint("c", i)
			held := mustAcquire(t, holder, agent.AcquireRequest{Name: name})
			s, err := a.Open(peer, agent.SessionOptions{SessionTTL: ptr(30 * time.Second)}, &conn{})
			require.NoError(t, err)
			_, err = s.Campaign(agent.CampaignRequest{Name: name})
			require.NoError(t, err)
			synctest.Wait()
			c := &conn{}
			_, err = a.Resume(peer, s.ID(), s.ResumeToken(), agent.SessionOptions{}, c)
			require.NoError(t, err)
			_, err = s.Campaign(agent.CampaignRequest{Name: name})
			require.NoError(t, err, "the new connection's campaign")
			require.NoError(t, holder.Release(context.Background(), held.ID))
			synctest.Wait()
			evs := c.got()
			require.Len(t, evs, 1)
			assert.Equal(t, agent.EventElected, evs[0].Kind)
			info, err := f.Inspect(context.Background(), name)
			require.NoError(t, err)
			require.Len(t, info.Holders, 1)
			assert.Equal(t, evs[0].Lease, info.Holders[0].LeaseID)
		}
	})
}

// TestReleaseRetried: a release the backend was unavailable for is tried
// again until it is done, so that the name is free there long before the
// lease would expire; the retries stop with the agent.
func TestReleaseRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		s, _ := openSession(t, a)
		l := mustAcquire(t, s, agent.AcquireRequest{Name: "n", TTL: time.Minute})
		f.failRelease.Store(true)
		require.NoError(t, s.Release(context.Background(), l.ID))
		time.Sleep(time.Second)
		require.Equal(t, 1, f.holders(t, "n"), "held in the backend while releases fail")
		f.failRelease.Store(false)
		time.Sleep(3 * time.Second) // past the next try: they back off to 2s at most
		synctest.Wait()
		assert.Equal(t, 0, f.holders(t, "n"), "released by a later try")

		// A grant whose answer was lost is released, and retried, too.
		f.lostAnswer.Store(true)
		f.failRelease.Store(true)
		_, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "lost", TTL: time.Hour})
		require.Error(t, err)
		f.lostAnswer.Store(false)
		time.Sleep(time.Second)
		require.Equal(t, 1, f.holders(t, "lost"), "held in the backend while releases fail")
		f.failRelease.Store(false)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		assert.Equal(t, 0, f.holders(t, "lost"), "released by a later try")

		// The retries stop with the agent, a try in flight included.
		m := mustAcquire(t, s, agent.AcquireRequest{Name: "m", TTL: time.Hour})
		f.failRelease.Store(true)
		require.NoError(t, s.Release(context.Background(), m.ID))
		time.Sleep(10 * time.Millisecond) // its first send, owed, fails
		synctest.Wait()
		f.failRelease.Store(false)
		f.releaseDelay.Store(int64(time.Hour)) // the next try hangs
		time.Sleep(200 * time.Millisecond)     // it is in flight
		stopped := time.Now()
		stop()
		assert.Less(t, time.Since(stopped), time.Second, "the retries stop with the agent")
	})
}

// TestShutdown: every session is told, its connection closed, every lease
// released, and nothing new is accepted.
func TestShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		c := &conn{}
		s, err := a.Open(agent.Peer{}, agent.SessionOptions{SessionTTL: ptr(time.Minute)}, c)
		require.NoError(t, err)
		mustAcquire(t, s, agent.AcquireRequest{Name: "x", Scope: agent.ScopeSession})

		waiting := make(chan error)
		other, err := a.Open(agent.Peer{}, agent.SessionOptions{}, &conn{})
		require.NoError(t, err)
		go func() {
			_, err := other.Acquire(context.Background(), agent.AcquireRequest{Name: "x", Wait: agent.WaitForever})
			waiting <- err
		}()
		synctest.Wait()

		info, _ := f.Inspect(context.Background(), "x")
		require.Len(t, info.Holders, 1)
		stopDone := make(chan struct{})
		go func() { stop(); close(stopDone) }()
		synctest.Wait()
		evs := c.got()
		require.Len(t, evs, 1)
		assert.Equal(t, agent.EventShutdown, evs[0].Kind)
		assert.True(t, c.closed)
		_, err = a.Open(agent.Peer{}, agent.SessionOptions{}, &conn{})
		assert.ErrorIs(t, err, agent.ErrShuttingDown)
		<-stopDone
		assert.ErrorIs(t, <-waiting, agent.ErrShuttingDown)
		info, err = f.Inspect(context.Background(), "x")
		require.NoError(t, err)
		assert.Empty(t, info.Holders, "released at shutdown")
	})
}

func ptr[T any](v T) *T { return &v }

// TestUnknownOutcomeIsReleased: an acquire whose answer was lost may have
// been granted; the agent releases it rather than leave the name blocked.
func TestUnknownOutcomeIsReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, err := a.Open(agent.Peer{}, agent.SessionOptions{}, &conn{})
		require.NoError(t, err)
		f.lostAnswer.Store(true)
		_, err = s.Acquire(context.Background(), agent.AcquireRequest{Name: "n", TTL: time.Hour})
		require.ErrorIs(t, err, backend.ErrUnavailable)
		f.lostAnswer.Store(false)
		synctest.Wait()
		info, err := f.Inspect(context.Background(), "n")
		require.NoError(t, err)
		assert.Empty(t, info.Holders)
	})
}

// TestShutdownWaitsForGrantsInFlight: a grant that lands while the agent
// shuts down is released before Run returns.
func TestShutdownWaitsForGrantsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		s, err := a.Open(agent.Peer{}, agent.SessionOptions{}, &conn{})
		require.NoError(t, err)
		f.acquireDelay.Store(int64(200 * time.Millisecond))
		errc := make(chan error, 1)
		go func() {
			_, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: "n"})
			errc <- err
		}()
		time.Sleep(50 * time.Millisecond)
		stop() // returns only once the attempt has ended
		info, err := f.Inspect(context.Background(), "n")
		require.NoError(t, err)
		assert.Empty(t, info.Holders, "released before Run returned")
		assert.ErrorIs(t, <-errc, agent.ErrShuttingDown)
	})
}

// TestDegradedDoesNotFlap: while any lease's renewals fail the backend is
// degraded, whatever other batches do; ok comes when none fails.
func TestDegradedDoesNotFlap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, c := openSession(t, a)
		f.failPrefix.Store("bad")
		mustAcquire(t, s, agent.AcquireRequest{Name: "bad", TTL: 30 * time.Second})
		time.Sleep(777 * time.Millisecond)
		mustAcquire(t, s, agent.AcquireRequest{Name: "good", TTL: 30 * time.Second})
		time.Sleep(20 * time.Second)
		f.failPrefix.Store("")
		time.Sleep(time.Minute)
		var states []string
		for _, e := range c.got() {
			states = append(states, e.Kind+":"+e.State)
		}
		assert.Equal(t, []string{"backend:degraded", "backend:ok"}, states)
	})
}

// TestSuspendOfTheHost: the monotonic clock stops while the host is
// suspended; the boot clock does not. A lease whose deadline passed while
// the host slept is lost soon after the resume, before any renewal.
func TestSuspendOfTheHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var slept atomic.Int64
		start := time.Now()
		boot := func() time.Duration { return time.Since(start) + time.Duration(slept.Load()) }
		a, f, stop := run(t, agent.Config{BootClock: boot})
		defer stop()
		s, c := openSession(t, a)
		long := mustAcquire(t, s, agent.AcquireRequest{Name: "long", TTL: time.Minute})
		short := mustAcquire(t, s, agent.AcquireRequest{Name: "short", TTL: 10 * time.Second})

		time.Sleep(2 * time.Second)
		renewals := f.renewCalls.Load()
		slept.Store(int64(9 * time.Second)) // the host sleeps 9s, in an instant
		resumed := time.Now()
		time.Sleep(3 * time.Second)

		evs := c.got()
		require.Len(t, evs, 1, "%v", evs)
		assert.Equal(t, short.ID, evs[0].Lease)
		assert.Equal(t, agent.ReasonExpired, evs[0].Reason)
		assert.LessOrEqual(t, evs[0].at.Sub(resumed), time.Second, "noticed within a second of the resume")
		assert.Equal(t, renewals, f.renewCalls.Load(), "no renewal of the lost lease came first")
		res, err := s.Check(context.Background(), long.ID)
		require.NoError(t, err)
		assert.True(t, res.Held, "a lease with time left survives")
	})
}

// TestRequestsDuringAResume: a resume from another process of the same
// uid changes the session's peer while the old connection's requests run;
// those requests read it safely (the race detector watches).
func TestRequestsDuringAResume(t *testing.T) {
	a, _, stop := run(t, agent.Config{Access: agent.Access{AdminUIDs: []uint32{1000}}})
	defer stop()
	s, err := a.Open(agent.Peer{UID: 1000, PID: 1}, agent.SessionOptions{SessionTTL: ptr(30 * time.Second)}, &conn{})
	require.NoError(t, err)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		for i := range 200 {
			_, err := a.Resume(agent.Peer{UID: 1000, PID: int32(i + 2), GID: uint32(i), Groups: []uint32{uint32(i)}},
				s.ID(), s.ResumeToken(), agent.SessionOptions{}, &conn{})
			assert.NoError(t, err)
		}
	})
	for i := range 200 {
		_, err := s.Acquire(context.Background(), agent.AcquireRequest{Name: fmt.Sprint("n", i), TTL: time.Second})
		require.NoError(t, err)
		_, err = s.Inspect(context.Background(), "n")
		require.NoError(t, err)
		_, _, err = s.List(agent.ListRequest{All: true})
		require.NoError(t, err)
		_, err = s.Break(context.Background(), fmt.Sprint("n", i))
		require.NoError(t, err)
	}
}

// TestReleaseOutlivesItsRequest: a release whose request is given up on
// (its connection closed, or a resume took the session) while the backend
// is slow still reaches the backend: the lease is already gone from the
// agent, which would otherwise leave the name held there until its TTL.
// The same goes for a resign.
func TestReleaseOutlivesItsRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, _ := openSession(t, a)
		l := mustAcquire(t, s, agent.AcquireRequest{Name: "n", TTL: time.Minute})
		id, err := s.Campaign(agent.CampaignRequest{Name: "c", TTL: time.Minute})
		require.NoError(t, err)
		synctest.Wait()
		f.releaseDelay.Store(int64(time.Second))

		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = s.Release(ctx, l.ID)
		_ = s.Resign(ctx, id)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		for _, name := range []string{"n", "c"} {
			assert.Zero(t, f.holders(t, name), "%s left the backend", name)
		}
	})
}

// TestSessionsPerUID: one uid's sessions, detached ones included, stop at
// its cap, which other uids do not share; a session that ends makes room.
func TestSessionsPerUID(t *testing.T) {
	a, _, stop := run(t, agent.Config{MaxSessionsPerUID: 2})
	defer stop()
	ttl := agent.SessionOptions{SessionTTL: ptr(time.Hour)}
	var first *agent.Session
	for i := range 2 {
		c := &conn{}
		s, err := a.Open(agent.Peer{UID: 1000}, ttl, c)
		require.NoError(t, err)
		s.Detach(c) // waits for a resume, and still counts
		if i == 0 {
			first = s
		}
	}
	_, err := a.Open(agent.Peer{UID: 1000}, ttl, &conn{})
	require.ErrorIs(t, err, agent.ErrLimitExceeded)
	assert.ErrorContains(t, err, "2 sessions per uid")
	_, err = a.Open(agent.Peer{UID: 1001}, ttl, &conn{})
	require.NoError(t, err, "another uid")

	c := &conn{}
	resumed, err := a.Resume(agent.Peer{UID: 1000, PID: 7}, first.ID(), first.ResumeToken(), agent.SessionOptions{}, c)
	require.NoError(t, err)
	resumed.Bye(context.Background(), c)
	_, err = a.Open(agent.Peer{UID: 1000}, ttl, &conn{})
	require.NoError(t, err, "the ended session made room")
}

// parted is a faulty backend of two parts, told by a name's prefix; the
// renewals of names in hung/ hang, while hang is set, until their
// deadline.
type parted struct {
	*faulty
	hang atomic.Bool
}

func (p *parted) Part(name string) string {
	part, _, _ := strings.Cut(name, "/")
	return part
}

func (p *parted) Renew(ctx context.Context, reqs []backend.RenewRequest) []error {
	for _, r := range reqs {
		if p.hang.Load() && p.Part(r.Name) == "hung" {
			<-ctx.Done()
			errs := make([]error, len(reqs))
			for i := range errs {
				errs[i] = backend.ErrUnavailable
			}
			return errs
		}
	}
	return p.faulty.Renew(ctx, reqs)
}

// TestRenewalsByPart: the renewals of a backend of parts go as a batch per
// part. Leases of two parts, at risk (every renewal failed until late in
// their TTL), are retried in batches, and one part then hangs: the
// leases of the other part are renewed at once. In a batch with a lease
// of the hung part, their answers would have waited for its answer,
// until the batch's deadline, which is their own local deadline too:
// they would be lost. (The leases renew at times spread by a jitter, so
// that several batches mix the two parts.)
func TestRenewalsByPart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mb, err := memory.Open(filepath.Join(t.TempDir(), "state"))
		require.NoError(t, err)
		defer mb.Close()
		p := &parted{faulty: &faulty{Backend: mb}}
		a := agent.New(agent.Config{Backend: p})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { a.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }()

		s, c := openSession(t, a)
		part := map[string]string{} // by lease id
		for i := range 8 {
			for _, prefix := range []string{"hung", "ok"} {
				l := mustAcquire(t, s, agent.AcquireRequest{Name: fmt.Sprintf("%s/%d", prefix, i), TTL: 3 * time.Second})
				part[l.ID] = prefix
			}
		}
		time.Sleep(500 * time.Millisecond)
		p.failRenew.Store(true) // the renewals from 0.9–1.1 s on fail, retried every 300 ms
		time.Sleep(2100 * time.Millisecond)
		p.failRenew.Store(false)
		p.hang.Store(true) // the retries at 2.7–2.9 s: one part hangs, until the deadlines at 2.92 s
		time.Sleep(5 * time.Second)
		synctest.Wait()

		lost := map[string]int{}
		for _, ev := range c.got() {
			if ev.Kind == "lost" {
				lost[part[ev.Lease]]++
			}
		}
		assert.Equal(t, map[string]int{"hung": 8}, lost, "only the hung part's leases are lost")
	})
}
