package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/agent"
)

// kinds filters events of a kind.
func kinds(evs []stamped, kind string) []stamped {
	var out []stamped
	for _, ev := range evs {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// TestCampaignContendsAfterLoss: when renewals fail, the leader's term is
// lost at its local deadline; the campaign contends again on its own and
// wins the next term, with a larger token, once the backend let the old
// lease expire.
func TestCampaignContendsAfterLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, c := openSession(t, a)
		const ttl = 3 * time.Second
		var started string
		id, err := s.Campaign(agent.CampaignRequest{Name: "lead", TTL: ttl, Started: func(id string) { started = id }})
		require.NoError(t, err)
		assert.Equal(t, id, started)
		synctest.Wait()
		first := kinds(c.got(), agent.EventElected)
		require.Len(t, first, 1)
		assert.Equal(t, id, first[0].Campaign)

		f.failRenew.Store(true)
		time.Sleep(ttl)
		f.failRenew.Store(false)
		lost := kinds(c.got(), agent.EventLost)
		require.Len(t, lost, 1)
		assert.Equal(t, first[0].Lease, lost[0].Lease)
		assert.Equal(t, id, lost[0].Campaign)

		time.Sleep(2 * time.Second)
		elected := kinds(c.got(), agent.EventElected)
		require.Len(t, elected, 2)
		assert.Greater(t, elected[1].Token, elected[0].Token)
		assert.False(t, elected[1].at.Before(lost[0].at), "elected after the loss")
	})
}

// TestCampaignRetriesAFailingBackend: an attempt whose outcome is unknown
// does not end the campaign: it tries again after a pause.
func TestCampaignRetriesAFailingBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, c := openSession(t, a)
		f.lostAnswer.Store(true)
		_, err := s.Campaign(agent.CampaignRequest{Name: "lead", TTL: 3 * time.Second})
		require.NoError(t, err)
		time.Sleep(5 * time.Second)
		assert.Empty(t, kinds(c.got(), agent.EventElected))
		f.lostAnswer.Store(false)
		time.Sleep(time.Second + time.Millisecond)
		assert.Len(t, kinds(c.got(), agent.EventElected), 1)
	})
}

// TestResignStopsContending: after Resign returns, the name is free and
// the campaign never wins again; resign of an unknown campaign is
// not_held.
func TestResignStopsContending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _, stop := run(t, agent.Config{})
		defer stop()
		s, c := openSession(t, a)
		id, err := s.Campaign(agent.CampaignRequest{Name: "lead"})
		require.NoError(t, err)
		synctest.Wait()
		require.NoError(t, s.Resign(context.Background(), id))
		other, err := a.Open(agent.Peer{}, agent.SessionOptions{}, &conn{})
		require.NoError(t, err)
		mustAcquire(t, other, agent.AcquireRequest{Name: "lead"})
		time.Sleep(time.Minute)
		assert.Len(t, kinds(c.got(), agent.EventElected), 1)
		assert.ErrorIs(t, s.Resign(context.Background(), id), agent.ErrNotHeld)
	})
}

// TestTermsWhileAway: terms won and lost while a session-scoped campaign's
// session has no connection leave no events; on resume the session hears
// that the term it knew ended, then of the term that holds, and of
// nothing else.
func TestTermsWhileAway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _, stop := run(t, agent.Config{MaxLeasesPerSession: 2})
		defer stop()
		away := &conn{}
		s, err := a.Open(agent.Peer{}, agent.SessionOptions{SessionTTL: ptr(time.Hour)}, away)
		require.NoError(t, err)
		_, err = s.Campaign(agent.CampaignRequest{Name: "lead", Scope: agent.ScopeSession})
		require.NoError(t, err)
		synctest.Wait()
		s.Detach(away)
		admin, _ := openSession(t, a)
		for range 100 { // more terms than the backlog holds events
			_, err := admin.Break(context.Background(), "lead")
			require.NoError(t, err)
			synctest.Wait()
		}
		back := &conn{}
		_, err = a.Resume(agent.Peer{}, s.ID(), s.ResumeToken(), agent.SessionOptions{}, back)
		require.NoError(t, err)
		infos, _, err := s.List(agent.ListRequest{})
		require.NoError(t, err)
		var term string
		for _, si := range infos {
			if si.ID == s.ID() {
				require.Len(t, si.Campaigns, 1)
				term = si.Campaigns[0].Lease
			}
		}
		first := away.got()
		require.Len(t, first, 1)
		require.Equal(t, agent.EventElected, first[0].Kind)
		evs := back.got()
		require.Len(t, evs, 2, "%v", evs)
		assert.Equal(t, agent.EventLost, evs[0].Kind)
		assert.Equal(t, first[0].Lease, evs[0].Lease, "the term the session heard of ended")
		assert.Equal(t, agent.EventElected, evs[1].Kind)
		assert.Equal(t, term, evs[1].Lease, "the term that holds")
	})
}

// TestBacklogThroughBackendFlaps: renewals that fail and recover again
// and again while a session is away leave it one backend event, the
// latest, and the room of the backlog to the leases' events: a lease lost
// after many flaps is still told on resume.
func TestBacklogThroughBackendFlaps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{MaxLeasesPerSession: 2})
		defer stop()
		away := &conn{}
		s, err := a.Open(agent.Peer{}, agent.SessionOptions{SessionTTL: ptr(time.Hour)}, away)
		require.NoError(t, err)
		mustAcquire(t, s, agent.AcquireRequest{Name: "kept", Scope: agent.ScopeSession, TTL: 3 * time.Second})
		gone := mustAcquire(t, s, agent.AcquireRequest{Name: "gone", Scope: agent.ScopeSession, TTL: 3 * time.Second})
		s.Detach(away)
		degraded := func(want bool) {
			for range 500 {
				if a.Stats().Degraded == want {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Fatalf("degraded is not %t", want)
		}
		for range 40 { // 80 backend events, more than the backlog holds
			f.failRenew.Store(true)
			degraded(true)
			f.failRenew.Store(false)
			degraded(false)
		}
		admin, _ := openSession(t, a)
		_, err = admin.Break(context.Background(), "gone")
		require.NoError(t, err)

		back := &conn{}
		_, err = a.Resume(agent.Peer{}, s.ID(), s.ResumeToken(), agent.SessionOptions{}, back)
		require.NoError(t, err)
		evs := back.got()
		require.Len(t, evs, 2, "%v", evs)
		assert.Equal(t, agent.EventBackend, evs[0].Kind)
		assert.Equal(t, "ok", evs[0].State, "the backend's latest state")
		assert.Equal(t, agent.EventLost, evs[1].Kind)
		assert.Equal(t, gone.ID, evs[1].Lease)
		assert.Equal(t, agent.ReasonBroken, evs[1].Reason)
	})
}

// TestCampaignUnderReloadedRules: each term is a new grant under the rules
// of the moment. A campaign the reloaded rules no longer allow wins no new
// term, and contends again once they allow it again.
func TestCampaignUnderReloadedRules(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _, stop := run(t, agent.Config{})
		defer stop()
		c := &conn{}
		s, err := a.Open(agent.Peer{UID: 1000, GID: 1000}, agent.SessionOptions{}, c)
		require.NoError(t, err)
		_, err = s.Campaign(agent.CampaignRequest{Name: "lead"})
		require.NoError(t, err)
		synctest.Wait()
		require.Len(t, kinds(c.got(), agent.EventElected), 1)

		a.SetAccess(agent.Access{Rules: []agent.Rule{{Pattern: "other/*"}}})
		admin, _ := openSession(t, a)
		_, err = admin.Break(context.Background(), "lead")
		require.NoError(t, err)
		time.Sleep(time.Minute)
		assert.Len(t, kinds(c.got(), agent.EventElected), 1, "no new term while the rules deny it")

		a.SetAccess(agent.Access{})
		time.Sleep(2 * time.Second)
		assert.Len(t, kinds(c.got(), agent.EventElected), 2, "contends again once allowed")
	})
}

// TestQueuedCampaignUnderReloadedRules: a campaign that queued behind the
// leader before a reload that denies it does not win the next term.
func TestQueuedCampaignUnderReloadedRules(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _, stop := run(t, agent.Config{})
		defer stop()
		lc, qc := &conn{}, &conn{}
		leader, err := a.Open(agent.Peer{UID: 1000, GID: 1000}, agent.SessionOptions{}, lc)
		require.NoError(t, err)
		queued, err := a.Open(agent.Peer{UID: 1001, GID: 1001}, agent.SessionOptions{}, qc)
		require.NoError(t, err)
		_, err = leader.Campaign(agent.CampaignRequest{Name: "lead"})
		require.NoError(t, err)
		synctest.Wait()
		_, err = queued.Campaign(agent.CampaignRequest{Name: "lead"})
		require.NoError(t, err)
		synctest.Wait()

		a.SetAccess(agent.Access{Rules: []agent.Rule{{Pattern: "lead", UIDs: []uint32{1000}}}})
		admin, _ := openSession(t, a)
		_, err = admin.Break(context.Background(), "lead")
		require.NoError(t, err)
		time.Sleep(time.Minute)
		assert.Empty(t, kinds(qc.got(), agent.EventElected), "the denied campaign won a term")
		assert.Len(t, kinds(lc.got(), agent.EventElected), 2, "the allowed one leads again")
	})
}

// TestCampaignFailuresLogRateLimited: a campaign whose attempts keep
// failing (here, the agent's waiters are at their limit) says so once, and
// many such campaigns log within the peer's budget.
func TestCampaignFailuresLogRateLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs syncBuffer
		logger := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug})
		a, _, stop := run(t, agent.Config{MaxWaiters: 1, Logger: logger})
		defer stop()
		holder, _ := openSession(t, a)
		for i := range 20 {
			mustAcquire(t, holder, agent.AcquireRequest{Name: fmt.Sprint("c", i)})
		}
		waiter, _ := openSession(t, a)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go waiter.Acquire(ctx, agent.AcquireRequest{Name: "c0", Wait: agent.WaitForever})
		synctest.Wait()

		s, _ := openSession(t, a)
		failed := func() int { return strings.Count(logs.String(), "[WARN]  campaign attempt failed") }
		_, err := s.Campaign(agent.CampaignRequest{Name: "c1"})
		require.NoError(t, err)
		time.Sleep(30 * time.Second) // an attempt a second
		synctest.Wait()
		assert.Equal(t, 1, failed(), "one campaign retrying for 30 s:\n%s", logs.String())

		for i := 2; i < 20; i++ {
			_, err := s.Campaign(agent.CampaignRequest{Name: fmt.Sprint("c", i)})
			require.NoError(t, err)
		}
		time.Sleep(30 * time.Second)
		synctest.Wait()
		assert.LessOrEqual(t, failed(), 10+3, "19 campaigns retrying for 30 s:\n%s", logs.String())
		cancel()
	})
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestCampaignsAtTheUIDLimit: campaigns asked for at once count against
// max_leases_per_uid from their start, before their first attempt: the
// one past the limit is refused, not accepted to contend in vain; a
// resigned campaign's place is free again.
func TestCampaignsAtTheUIDLimit(t *testing.T) {
	a, _, stop := run(t, agent.Config{MaxLeasesPerUID: 2})
	defer stop()
	holder, err := a.Open(agent.Peer{UID: 1}, agent.SessionOptions{}, &conn{})
	require.NoError(t, err)
	for _, name := range []string{"a", "b"} {
		mustAcquire(t, holder, agent.AcquireRequest{Name: name})
	}
	s, _ := openSession(t, a)
	first, err := s.Campaign(agent.CampaignRequest{Name: "a"})
	require.NoError(t, err)
	_, err = s.Campaign(agent.CampaignRequest{Name: "b"})
	require.NoError(t, err)
	_, err = s.Campaign(agent.CampaignRequest{Name: "c"})
	require.ErrorIs(t, err, agent.ErrLimitExceeded)
	require.NoError(t, s.Resign(context.Background(), first))
	_, err = s.Campaign(agent.CampaignRequest{Name: "c"})
	require.NoError(t, err, "the resigned campaign's place")
}
