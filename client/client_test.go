package client_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/client"
)

// typedClient returns a client that said hello with the typed API.
func (ta *testAgent) typedClient(t *testing.T, opts client.HelloOptions) (*client.Client, *client.Session) {
	t.Helper()
	c, err := client.Dial(context.Background(), ta.path)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	s, err := c.Hello(context.Background(), opts)
	require.NoError(t, err)
	return c, s
}

// requireDone requires the lease to have ended, within 5s, for reason.
func requireDone(t *testing.T, l *client.Lease, reason string) {
	t.Helper()
	select {
	case <-l.Done():
		assert.Equal(t, reason, l.Reason())
	case <-time.After(5 * time.Second):
		t.Fatalf("lease %s still live after 5s", l.ID)
	}
}

// TestClientLeaseLost: a lost event goes to its lease, not to Events; a
// dead lease cannot be released, and checks as not held.
func TestClientLeaseLost(t *testing.T) {
	ta := startAgent(t)
	ctx := context.Background()
	c, _ := ta.typedClient(t, client.HelloOptions{Client: "worker"})
	admin, _ := ta.typedClient(t, client.HelloOptions{Client: "admin"})

	l, err := c.Acquire(ctx, "lost/1", client.AcquireOptions{Meta: "m", TTL: 2 * time.Second})
	require.NoError(t, err)
	assert.Equal(t, "lost/1", l.Name)
	assert.Equal(t, client.ModeExclusive, l.Mode)
	assert.Equal(t, client.ScopeConnection, l.Scope)
	assert.Equal(t, 2*time.Second, l.TTL)
	require.NotZero(t, l.Token)
	held, expiresIn, err := l.Check(ctx)
	require.NoError(t, err)
	assert.True(t, held)
	assert.Positive(t, expiresIn)

	n, err := admin.Break(ctx, "lost/1")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	requireDone(t, l, "broken")

	err = l.Release(ctx)
	require.ErrorIs(t, err, client.ErrNotHeld)
	var e *client.Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, client.CodeNotHeld, e.Code)
	assert.Equal(t, "broken", l.Reason(), "a failed release leaves the reason")
	held, expiresIn, err = l.Check(ctx)
	require.NoError(t, err)
	assert.False(t, held)
	assert.Zero(t, expiresIn)

	// The first event on Events is the lost event of a lease taken with
	// Call: the typed lease's went to it alone.
	var raw struct {
		Lease string `json:"lease"`
	}
	require.NoError(t, c.Call(ctx, "acquire", map[string]any{"name": "lost/2"}, &raw))
	_, err = admin.Break(ctx, "lost/2")
	require.NoError(t, err)
	ev := nextEvent(t, c)
	assert.Equal(t, "lost", ev.Event)
	assert.Equal(t, raw.Lease, ev.Lease)
}

// TestClientReleaseTwice: Release ends the lease; a second one gets
// ErrNotHeld and the reason stays.
func TestClientReleaseTwice(t *testing.T) {
	ta := startAgent(t)
	ctx := context.Background()
	c, _ := ta.typedClient(t, client.HelloOptions{})
	l, err := c.Acquire(ctx, "rel/1", client.AcquireOptions{})
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	select {
	case <-l.Done():
	default:
		t.Fatal("Done is not closed when Release returns")
	}
	assert.Equal(t, "released", l.Reason())
	require.ErrorIs(t, l.Release(ctx), client.ErrNotHeld)
	assert.Equal(t, "released", l.Reason())
	in, err := c.Inspect(ctx, "rel/1")
	require.NoError(t, err)
	assert.False(t, in.Locked)
}

// TestClientCheckLoses: a check that finds the lease gone in the backend
// ends the lease before it returns.
func TestClientCheckLoses(t *testing.T) {
	ta := startAgent(t)
	ctx := context.Background()
	c, _ := ta.typedClient(t, client.HelloOptions{})
	l, err := c.Acquire(ctx, "chk/1", client.AcquireOptions{})
	require.NoError(t, err)
	require.NoError(t, ta.backend.Release(ctx, backend.LeaseKey{Name: l.Name, LeaseID: l.ID, Mode: backend.Exclusive}))
	held, _, err := l.Check(ctx)
	require.NoError(t, err)
	assert.False(t, held)
	select {
	case <-l.Done():
		assert.Equal(t, "expired", l.Reason())
	default:
		t.Fatal("Done is not closed when Check returns false")
	}
}

// TestClientErrors: refusals are *Error values with their code, matched
// by the sentinels; a denial is a *NotAcquiredError with the holders.
func TestClientErrors(t *testing.T) {
	ta := startAgent(t, func(o *options) { o.Agent.Access.AdminUIDs = []uint32{uint32(os.Getuid()) + 1} })
	ctx := context.Background()
	a, _ := ta.typedClient(t, client.HelloOptions{})
	b, _ := ta.typedClient(t, client.HelloOptions{})

	held, err := a.Acquire(ctx, "e/1", client.AcquireOptions{Meta: "first"})
	require.NoError(t, err)

	_, err = a.Acquire(ctx, "e/1", client.AcquireOptions{Mode: client.ModeShared})
	require.ErrorIs(t, err, client.ErrAlreadyHeld)
	assert.NotErrorIs(t, err, client.ErrNotHeld)
	var e *client.Error
	require.ErrorAs(t, err, &e)
	require.NotNil(t, e.Lease)
	assert.Equal(t, held.LeaseInfo, *e.Lease, "already_held carries the existing lease")

	for _, tc := range []struct {
		name string
		opts client.AcquireOptions
		code string
	}{
		{"bad name", client.AcquireOptions{}, client.CodeInvalidName},
		{"", client.AcquireOptions{}, client.CodeInvalidName},
		{"e/2", client.AcquireOptions{Limit: 2}, client.CodeInvalidArgument},
		{"e/2", client.AcquireOptions{Mode: "both"}, client.CodeInvalidArgument},
		{"e/2", client.AcquireOptions{TTL: time.Millisecond}, client.CodeInvalidArgument},
	} {
		_, err := a.Acquire(ctx, tc.name, tc.opts)
		require.ErrorAs(t, err, &e, "%q %+v", tc.name, tc.opts)
		assert.Equal(t, tc.code, e.Code, "%q %+v", tc.name, tc.opts)
		assert.NotEmpty(t, e.Message)
	}

	_, err = a.Break(ctx, "e/1")
	require.ErrorIs(t, err, client.ErrPermissionDenied, "break by a peer that is not an admin")

	_, err = b.Acquire(ctx, "e/1", client.AcquireOptions{})
	require.ErrorIs(t, err, client.ErrNotAcquired)
	var denied *client.NotAcquiredError
	require.ErrorAs(t, err, &denied)
	assert.Equal(t, "e/1", denied.Name)
	assert.Equal(t, "held", denied.Reason)
	require.Len(t, denied.Holders, 1)
	assert.Equal(t, client.Holder{Mode: client.ModeExclusive, Token: held.Token, Meta: "first", Host: "testhost",
		ExpiresIn: denied.Holders[0].ExpiresIn}, denied.Holders[0])
	assert.Positive(t, denied.Holders[0].ExpiresIn)
	assert.Equal(t, "client: e/1 not acquired: held", err.Error())

	_, err = b.Acquire(ctx, "e/1", client.AcquireOptions{Wait: 20 * time.Millisecond})
	require.ErrorAs(t, err, &denied)
	assert.Equal(t, "timeout", denied.Reason)
}

// TestClientInspect: what Inspect and Ping answer.
func TestClientInspect(t *testing.T) {
	ta := startAgent(t)
	ctx := context.Background()
	a, _ := ta.typedClient(t, client.HelloOptions{})
	b, _ := ta.typedClient(t, client.HelloOptions{})
	require.NoError(t, a.Ping(ctx))

	in, err := a.Inspect(ctx, "i/1")
	require.NoError(t, err)
	assert.Equal(t, &client.Inspection{Holders: []client.Holder{}}, in)

	shared := client.AcquireOptions{Mode: client.ModeShared, Meta: "reader"}
	la, err := a.Acquire(ctx, "i/1", shared)
	require.NoError(t, err)
	lb, err := b.Acquire(ctx, "i/1", shared)
	require.NoError(t, err)
	in, err = a.Inspect(ctx, "i/1")
	require.NoError(t, err)
	assert.True(t, in.Locked)
	assert.Equal(t, client.ModeShared, in.Mode)
	require.Len(t, in.Holders, 2)
	assert.Equal(t, []uint64{la.Token, lb.Token}, []uint64{in.Holders[0].Token, in.Holders[1].Token})
	assert.Equal(t, lb.Token, in.LastToken)
	assert.Zero(t, in.Queued)
}

// TestClientHelloResume: Hello's answer, and a resumed session whose
// missed lost events arrive on Events.
func TestClientHelloResume(t *testing.T) {
	ta := startAgent(t)
	ctx := context.Background()
	c1, s := ta.typedClient(t, client.HelloOptions{Client: "app", SessionTTL: time.Minute, Heartbeat: 10 * time.Second})
	require.NotEmpty(t, s.ID)
	require.NotEmpty(t, s.ResumeToken)
	assert.False(t, s.Resumed)
	assert.Equal(t, client.AgentInfo{Version: "test", Backend: "memory", MaxLineBytes: 65536,
		DefaultTTL: 15 * time.Second, MinTTL: time.Second, MaxTTL: 24 * time.Hour}, s.Agent)

	l, err := c1.Acquire(ctx, "res/1", client.AcquireOptions{Scope: client.ScopeSession})
	require.NoError(t, err)
	require.NoError(t, c1.Close())
	assert.Equal(t, "connection closed", l.Reason())

	// While the session waits to be resumed, its lease is broken.
	admin, _ := ta.typedClient(t, client.HelloOptions{})
	require.Eventually(t, func() bool {
		var r struct {
			Sessions []struct {
				Session  string `json:"session"`
				Attached bool   `json:"attached"`
			} `json:"sessions"`
		}
		require.NoError(t, admin.Call(ctx, "list", map[string]any{"all": true}, &r))
		for _, x := range r.Sessions {
			if x.Session == s.ID {
				return !x.Attached
			}
		}
		return false
	}, 5*time.Second, time.Millisecond, "the session is detached")
	_, err = admin.Break(ctx, "res/1")
	require.NoError(t, err)

	c2, s2 := ta.typedClient(t, client.HelloOptions{Resume: s})
	assert.True(t, s2.Resumed)
	assert.Equal(t, s.ID, s2.ID)
	assert.Equal(t, s.ResumeToken, s2.ResumeToken)
	ev := nextEvent(t, c2)
	assert.Equal(t, "lost", ev.Event)
	assert.Equal(t, l.ID, ev.Lease)
	assert.Equal(t, "broken", ev.Reason)

	bad := *s
	bad.ResumeToken = "nope"
	c3, err := client.Dial(ctx, ta.path)
	require.NoError(t, err)
	defer c3.Close()
	_, err = c3.Hello(ctx, client.HelloOptions{Resume: &bad})
	require.ErrorIs(t, err, client.ErrSessionExpired)
}

// TestClientAcquireContext: the end of ctx cancels a waiting acquire in
// the agent; the name may be acquired again at once.
func TestClientAcquireContext(t *testing.T) {
	ta := startAgent(t)
	ctx := context.Background()
	holder, _ := ta.typedClient(t, client.HelloOptions{})
	waiter, _ := ta.typedClient(t, client.HelloOptions{})
	first, err := holder.Acquire(ctx, "ctx/1", client.AcquireOptions{})
	require.NoError(t, err)

	short, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(short, "ctx/1", client.AcquireOptions{Wait: client.WaitForever})
		errc <- err
	}()
	waitQueued(t, holder, "ctx/1", 1)
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	waitQueued(t, holder, "ctx/1", 0)

	_, err = waiter.Acquire(ctx, "ctx/1", client.AcquireOptions{})
	require.ErrorIs(t, err, client.ErrNotAcquired, "a try, not refused as already in progress")
	require.NoError(t, first.Release(ctx))
	second, err := waiter.Acquire(ctx, "ctx/1", client.AcquireOptions{Wait: 5 * time.Second})
	require.NoError(t, err)
	assert.Greater(t, second.Token, first.Token)
}

// TestClientConnectionEnds: the leases of a closed client end, and its
// calls fail with ErrClosed; so do a waiting acquire's and the leases'
// when the agent goes away.
func TestClientConnectionEnds(t *testing.T) {
	ta := startAgent(t)
	ctx := context.Background()
	c, _ := ta.typedClient(t, client.HelloOptions{})
	l, err := c.Acquire(ctx, "end/1", client.AcquireOptions{})
	require.NoError(t, err)
	require.NoError(t, c.Close())
	assert.Equal(t, "connection closed", l.Reason())
	require.ErrorIs(t, l.Release(ctx), client.ErrClosed)
	_, err = c.Acquire(ctx, "end/2", client.AcquireOptions{})
	require.ErrorIs(t, err, client.ErrClosed)

	holder, _ := ta.typedClient(t, client.HelloOptions{})
	waiter, _ := ta.typedClient(t, client.HelloOptions{})
	l, err = holder.Acquire(ctx, "end/3", client.AcquireOptions{})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, "end/3", client.AcquireOptions{Wait: client.WaitForever})
		errc <- err
	}()
	waitQueued(t, holder, "end/3", 1)
	ta.stop()
	require.Error(t, <-errc)
	requireDone(t, l, "connection closed")
}

// TestClientUnreadEventsAreDropped: a client that never calls Events
// keeps reading the connection when more events come than it can hold.
func TestClientUnreadEventsAreDropped(t *testing.T) {
	ta := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _ := ta.typedClient(t, client.HelloOptions{})
	admin, _ := ta.typedClient(t, client.HelloOptions{})
	const events = 1100 // more than the client holds
	for i := range events {
		name := fmt.Sprintf("drop/%d", i)
		require.NoError(t, c.Call(ctx, "acquire", map[string]any{"name": name}, nil))
		_, err := admin.Break(ctx, name)
		require.NoError(t, err)
	}
	pingCtx, cancelPing := context.WithTimeout(ctx, 5*time.Second)
	defer cancelPing()
	require.NoError(t, c.Ping(pingCtx), "the client still reads answers")
	assert.Equal(t, 1024, len(c.Events()), "the first events are kept")
}

// scripted is an agent played by the test on a real socket, for orders of
// events that a real agent cannot be made to produce on demand.
type scripted struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

func startScripted(t *testing.T) (path string, accept func() *scripted) {
	dir, err := os.MkdirTemp("", "la")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	path = filepath.Join(dir, "s")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return path, func() *scripted {
		nc, err := ln.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { nc.Close() })
		return &scripted{t: t, nc: nc, r: bufio.NewReader(nc)}
	}
}

// expect reads the next request, within 5s, and requires its op.
func (p *scripted) expect(op string) map[string]any {
	p.t.Helper()
	p.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := p.r.ReadBytes('\n')
	require.NoError(p.t, err)
	var m map[string]any
	require.NoError(p.t, json.Unmarshal(line, &m))
	require.Equal(p.t, op, m["op"], "request %s", line)
	return m
}

// silent requires no request within d.
func (p *scripted) silent(d time.Duration) {
	p.t.Helper()
	p.nc.SetReadDeadline(time.Now().Add(d))
	line, err := p.r.ReadBytes('\n')
	require.ErrorIs(p.t, err, os.ErrDeadlineExceeded, "unexpected request %s", line)
}

func (p *scripted) send(format string, args ...any) {
	p.t.Helper()
	_, err := fmt.Fprintf(p.nc, format+"\n", args...)
	require.NoError(p.t, err)
}

// dialScripted connects a client to a scripted agent and returns both
// ends; the client is closed at the end of the test.
func dialScripted(t *testing.T) (*client.Client, *scripted) {
	t.Helper()
	path, accept := startScripted(t)
	c, err := client.Dial(context.Background(), path)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, accept()
}

// TestClientLongAnswer: the agent's lines have no length limit, and the
// client reads one of 20 MiB (a list of many sessions).
func TestClientLongAnswer(t *testing.T) {
	c, p := dialScripted(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	meta := strings.Repeat("m", 20<<20)
	go func() {
		m := p.expect("list")
		p.send(`{"id":%v,"ok":true,"meta":%q}`, m["id"], meta)
	}()
	var res struct{ Meta string }
	require.NoError(t, c.Call(ctx, "list", nil, &res))
	require.Equal(t, len(meta), len(res.Meta))
}

// TestClientCloseReason: when the agent closes a connection and says why
// (a limit, a line too long), the calls that fail with the connection
// carry that reason, also a call whose write found the connection closed.
func TestClientCloseReason(t *testing.T) {
	ta := startAgent(t, func(o *options) {
		o.Server.MaxConnsPerUID = 1
		o.Server.MaxLineBytes = 1024
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := client.Dial(ctx, ta.path)
	require.NoError(t, err)
	defer first.Close()
	require.NoError(t, first.Ping(ctx))

	t.Run("a limit", func(t *testing.T) {
		c, err := client.Dial(ctx, ta.path)
		require.NoError(t, err)
		defer c.Close()
		// The ping's write may find the connection closed, or not yet.
		err = c.Ping(ctx)
		require.ErrorIs(t, err, client.ErrLimitExceeded)
		require.ErrorIs(t, err, client.ErrClosed)
		require.ErrorContains(t, err, "too many connections")
	})

	t.Run("a line too long", func(t *testing.T) {
		_, err := first.Inspect(ctx, strings.Repeat("n", 2000))
		var se *client.Error
		require.ErrorAs(t, err, &se)
		require.Equal(t, client.CodeLineTooLong, se.Code, "%v", err)
		require.ErrorIs(t, err, client.ErrClosed)
	})
}

// TestClientAbandonedGrant: a grant that arrives after its Acquire gave
// up is released, and a later Acquire of the name waits for that release
// (else it would be refused as already held).
func TestClientAbandonedGrant(t *testing.T) {
	c, p := dialScripted(t)
	ctx := context.Background()

	short, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Acquire(short, "ab/1", client.AcquireOptions{Wait: client.WaitForever})
		errc <- err
	}()
	acq := p.expect("acquire")
	assert.Equal(t, float64(-1), acq["wait_ms"])
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	assert.Equal(t, acq["id"], p.expect("cancel")["target"], "the cancel names the acquire")

	type result struct {
		l   *client.Lease
		err error
	}
	next := make(chan result, 1)
	go func() {
		l, err := c.Acquire(ctx, "ab/1", client.AcquireOptions{})
		next <- result{l, err}
	}()
	p.silent(100 * time.Millisecond)

	// The first acquire was granted before the cancel arrived.
	grant := `{"id":%v,"ok":true,"acquired":true,"lease":%q,"name":"ab/1","mode":"exclusive","scope":"connection","token":%d,"ttl_ms":15000}`
	p.send(grant, acq["id"], "l_late", 7)
	rel := p.expect("release")
	assert.Equal(t, "l_late", rel["lease"])
	second := p.expect("acquire")
	p.send(grant, second["id"], "l_next", 8)
	r := <-next
	require.NoError(t, r.err)
	assert.Equal(t, "l_next", r.l.ID)
	assert.Equal(t, uint64(8), r.l.Token)
}

// TestClientAbandonedCampaign: a campaign whose caller gave up before the
// answer, and which the agent started all the same, is resigned.
func TestClientAbandonedCampaign(t *testing.T) {
	c, p := dialScripted(t)
	ctx := context.Background()

	short, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Campaign(short, "ac/1", client.CampaignOptions{})
		errc <- err
	}()
	camp := p.expect("campaign")
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	p.send(`{"id":%v,"ok":true,"campaign":"c_late"}`, camp["id"])
	assert.Equal(t, "c_late", p.expect("resign")["campaign"])
}

// TestClientAbandonedResign: a resign whose caller gave up before the
// answer is carried out by the agent all the same; its answer still ends
// the campaign and its term.
func TestClientAbandonedResign(t *testing.T) {
	c, p := dialScripted(t)
	ctx := context.Background()

	cpc := make(chan *client.Campaign, 1)
	go func() {
		cp, err := c.Campaign(ctx, "ar/1", client.CampaignOptions{})
		assert.NoError(t, err)
		cpc <- cp
	}()
	p.send(`{"id":%v,"ok":true,"campaign":"c_1"}`, p.expect("campaign")["id"])
	cp := <-cpc
	p.send(`{"event":"elected","campaign":"c_1","name":"ar/1","lease":"l_1","token":1}`)
	term := <-cp.Elected()

	short, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- cp.Resign(short) }()
	resign := p.expect("resign")
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	p.send(`{"id":%v,"ok":true,"resigned":true}`, resign["id"])
	select {
	case <-term.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the term did not end with the resign's answer")
	}
	assert.Equal(t, "resigned", term.Reason())
	_, open := <-cp.Elected()
	assert.False(t, open, "the campaign ended")
}

// TestClientLateGrantOnAClosedConnection: a grant that arrives after its
// Acquire gave up is given back by a request sent on the reading
// goroutine; when the agent has closed the connection meanwhile, that
// send fails at once, without waiting for the agent's reason (which the
// same goroutine would read): the client sees the end of the connection
// at once, not a second later.
func TestClientLateGrantOnAClosedConnection(t *testing.T) {
	c, p := dialScripted(t)
	short, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Acquire(short, "late/1", client.AcquireOptions{Wait: client.WaitForever})
		errc <- err
	}()
	acq := p.expect("acquire")
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	p.expect("cancel")
	// The agent grants it and closes the connection (a shutdown).
	p.send(`{"id":%v,"ok":true,"acquired":true,"lease":"l_late","name":"late/1","mode":"exclusive","scope":"connection","token":7,"ttl_ms":15000}`, acq["id"])
	p.nc.Close()
	start := time.Now()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the client never saw the end of the connection")
	}
	// Waiting for itself, it would wait its full second.
	require.Less(t, time.Since(start), 900*time.Millisecond, "the reading goroutine waited for itself")
}
