package agent_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend/memory"
)

// TestFreezeStopsTheBackend: a frozen agent neither renews nor asks the
// backend for a waiter, however long it stays frozen; thawed, it goes on,
// and nothing was lost.
func TestFreezeStopsTheBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, c := openSession(t, a)
		mustAcquire(t, s, agent.AcquireRequest{Name: "n", TTL: 3 * time.Second})
		other, _ := openSession(t, a)
		granted := make(chan agent.AcquireResult, 1)
		wctx, wcancel := context.WithCancel(context.Background())
		defer wcancel()
		go func() {
			res, _ := other.Acquire(wctx, agent.AcquireRequest{Name: "n", Wait: agent.WaitForever})
			if res.Acquired {
				granted <- res
			}
		}()
		synctest.Wait()
		require.NoError(t, a.Freeze(context.Background()))
		renewals, attempts := f.renewCalls.Load(), f.acquireCalls.Load()
		time.Sleep(2 * time.Second) // past the lease's next renewal, and the waiter's next poll
		synctest.Wait()
		assert.Equal(t, renewals, f.renewCalls.Load(), "renewed while frozen")
		assert.Equal(t, attempts, f.acquireCalls.Load(), "asked the backend while frozen")
		a.Thaw()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		assert.Greater(t, f.renewCalls.Load(), renewals, "renewals go on once thawed")
		assert.Empty(t, c.got(), "nothing lost")
		assert.Empty(t, granted)
	})
}

// TestSlackIsUntilTheFirstDeadline: how long a frozen agent may stay so is
// until the first lease's local deadline, which no renewal moves while it
// is frozen.
func TestSlackIsUntilTheFirstDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _, stop := run(t, agent.Config{})
		defer stop()
		_, ok := a.Slack()
		require.False(t, ok, "no lease, no slack")
		s, _ := openSession(t, a)
		mustAcquire(t, s, agent.AcquireRequest{Name: "long", TTL: 30 * time.Second})
		mustAcquire(t, s, agent.AcquireRequest{Name: "short", TTL: 3 * time.Second})
		synctest.Wait()
		require.NoError(t, a.Freeze(context.Background()))
		slack, ok := a.Slack()
		require.True(t, ok)
		require.Greater(t, slack, 2*time.Second, "the short lease's deadline, less its margin")
		require.LessOrEqual(t, slack, 3*time.Second)
		time.Sleep(time.Second)
		later, _ := a.Slack()
		require.Equal(t, slack-time.Second, later, "frozen: nothing renews")
		time.Sleep(slack)
		later, _ = a.Slack()
		require.Zero(t, later, "past the deadline")
		a.Thaw()
	})
}

// TestFreezeWaitsForTheSteps: Freeze returns once the step under way (an
// acquire's attempt, here slow) has ended; if it does not end in time, the
// agent goes on, unfrozen.
func TestFreezeWaitsForTheSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, f, stop := run(t, agent.Config{})
		defer stop()
		s, _ := openSession(t, a)
		f.acquireDelay.Store(int64(time.Second))
		begun := time.Now()
		go mustAcquire(t, s, agent.AcquireRequest{Name: "n"})
		time.Sleep(time.Millisecond) // the attempt is under way
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, a.Freeze(ctx), context.DeadlineExceeded, "the attempt takes a second")
		require.NoError(t, a.Freeze(context.Background()))
		assert.Equal(t, begun.Add(time.Second), time.Now(), "frozen once the attempt ended")
		a.Thaw()
	})
}

// TestSnapshotRestore: an agent restored from the snapshot of a frozen
// one goes on as the first would have: its sessions, leases and tokens, a
// waiter with its place in line, a campaign's leader and its candidate, a
// detached session with its backlog; no local deadline is later than it
// was, and the leases handed over keep renewing.
func TestSnapshotRestore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		mb, err := memory.Open(dir)
		require.NoError(t, err)
		old := agent.New(agent.Config{Backend: mb})
		ctx, cancel := context.WithCancel(context.Background())
		oldDone := make(chan struct{})
		go func() { old.Run(ctx); close(oldDone) }()
		open := func(uid uint32, opts agent.SessionOptions) (*agent.Session, *conn) {
			c := &conn{}
			s, err := old.Open(agent.Peer{UID: uid}, opts, c)
			require.NoError(t, err)
			return s, c
		}

		holder, _ := open(7, agent.SessionOptions{})
		x := mustAcquire(t, holder, agent.AcquireRequest{Name: "x", TTL: 3 * time.Second})
		waiter, _ := open(8, agent.SessionOptions{})
		w := waiter.Begin(agent.AcquireRequest{Name: "x", Wait: agent.WaitForever})
		go w.Run(context.Background()) // the old process answers nothing
		leader, _ := open(9, agent.SessionOptions{})
		_, err = leader.Campaign(agent.CampaignRequest{Name: "L", TTL: 3 * time.Second})
		require.NoError(t, err)
		synctest.Wait()
		candidate, _ := open(10, agent.SessionOptions{})
		cand, err := candidate.Campaign(agent.CampaignRequest{Name: "L", TTL: 3 * time.Second})
		require.NoError(t, err)
		ttl := time.Hour
		away, awayConn := open(11, agent.SessionOptions{SessionTTL: &ttl})
		y := mustAcquire(t, away, agent.AcquireRequest{Name: "y", Scope: agent.ScopeSession, TTL: 3 * time.Second})
		away.Detach(awayConn)
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()

		require.NoError(t, old.Freeze(context.Background()))
		before, _, err := holder.List(agent.ListRequest{})
		require.NoError(t, err)
		ast, err := old.Snapshot()
		require.NoError(t, err)
		bst, err := mb.Snapshot(time.Now())
		require.NoError(t, err)
		raw, err := json.Marshal(ast)
		require.NoError(t, err)
		var st agent.State
		require.NoError(t, json.Unmarshal(raw, &st))
		// The old agent ends as if its process had: nothing of it is seen
		// again (its backend is its own).
		old.Thaw()
		cancel()
		<-oldDone
		mb.Close()

		const elapsed = 100 * time.Millisecond
		time.Sleep(elapsed) // the handover
		nb, err := memory.Restore(dir, bst, elapsed)
		require.NoError(t, err)
		defer nb.Close()
		conns := map[string]*conn{}
		na, pending, err := agent.Restore(agent.Config{Backend: nb}, st, elapsed, func(id string) agent.Conn {
			conns[id] = &conn{}
			return conns[id]
		})
		require.NoError(t, err)
		na.Thaw()
		ctx, cancel = context.WithCancel(context.Background())
		newDone := make(chan struct{})
		go func() { na.Run(ctx); close(newDone) }()
		defer func() { cancel(); <-newDone }()

		require.Len(t, pending, 1, "the waiting acquire")
		var got agent.Lease
		for key, p := range pending {
			require.Equal(t, w.Key(), key)
			p.Granted(func(l agent.Lease) { got = l })
			go p.Run(context.Background())
		}
		// The holder's lease, as it was, and not one instant longer.
		h := na.Session(holder.ID())
		require.NotNil(t, h)
		after, _, err := h.List(agent.ListRequest{})
		require.NoError(t, err)
		require.Equal(t, before[0].Leases[0].Lease, after[0].Leases[0].Lease)
		assert.Equal(t, before[0].Leases[0].ExpiresIn-elapsed, after[0].Leases[0].ExpiresIn, "the local deadline")
		// It renews in the new agent: half an hour later it is still held.
		time.Sleep(30 * time.Minute)
		res, err := h.Check(context.Background(), x.ID)
		require.NoError(t, err)
		require.True(t, res.Held)
		// Released, the waiter gets it, behind nobody, with a larger token.
		require.NoError(t, h.Release(context.Background(), x.ID))
		synctest.Wait()
		require.Equal(t, "x", got.Name)
		assert.Greater(t, got.Token, x.Token)

		// The leader resigns: the candidate is elected, in the new agent.
		ls := na.Session(leader.ID())
		infos, _, err := ls.List(agent.ListRequest{})
		require.NoError(t, err)
		require.True(t, infos[0].Campaigns[0].Leader)
		require.NoError(t, ls.Resign(context.Background(), infos[0].Campaigns[0].ID))
		synctest.Wait()
		evs := conns[candidate.ID()].got()
		require.NotEmpty(t, evs)
		assert.Equal(t, agent.EventElected, evs[len(evs)-1].Kind)
		assert.Equal(t, cand, evs[len(evs)-1].Campaign)

		// The detached session resumes with its lease, which renewed.
		back := &conn{}
		s, err := na.Resume(agent.Peer{UID: 11}, away.ID(), away.ResumeToken(), agent.SessionOptions{}, back)
		require.NoError(t, err)
		res, err = s.Check(context.Background(), y.ID)
		require.NoError(t, err)
		assert.True(t, res.Held)
		assert.Empty(t, back.got(), "nothing was lost")
	})
}
