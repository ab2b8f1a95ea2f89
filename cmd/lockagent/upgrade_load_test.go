package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
)

// upgradeLoad is what an agent serves while it is upgraded: connections
// holding connection- and session-scoped leases, shared leases at their
// limit, a waiter behind a holder, a leader and a candidate, a session
// that pings to keep its heartbeat, a detached session, a client making
// acquire and release pairs and one pipelining pings. verify checks, after
// the upgrade, that nobody noticed.
type upgradeLoad struct {
	socket string
	conns  int // connections in all, the loops' aside

	held   []heldLease // the leases of the bulk, the shared and the holder
	shared [4]*client.Client

	holder  *client.Lease // holds "queue", which waiter waits for
	waiter  chan result   // its acquire's outcome
	waitCli *client.Client

	leader    *client.Campaign
	term      *client.Term
	candidate *client.Campaign

	hb      *client.Client
	hbLease *client.Lease
	hbErr   atomic.Pointer[error]

	detached      *client.Session // closed; its lease lives on
	detachedLease string

	pairs *pairLoop
	pipe  *pipeLoop

	mu      sync.Mutex
	clients []*client.Client // every connection, to check none closed
	stop    chan struct{}
	wg      sync.WaitGroup
}

// heldLease is a lease of the load and the client that holds it.
type heldLease struct {
	c *client.Client
	l *client.Lease
}

// result is an acquire's outcome.
type result struct {
	l   *client.Lease
	err error
}

// startLoad connects n connections to the agent at socket and sets the
// load up; it runs until the test ends.
func startLoad(t *testing.T, socket string, n int) *upgradeLoad {
	t.Helper()
	ld := &upgradeLoad{socket: socket, stop: make(chan struct{}), waiter: make(chan result, 1)}
	t.Cleanup(func() { ld.halt() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The bulk: one lease per connection, every third one session-scoped.
	special := 4 + 2 + 2 + 1 + 2 // shared, queue, campaign, heartbeat, loops
	bulk := n - special
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, bulk)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < bulk; i += 8 {
				scope, name, ttl := client.ScopeConnection, fmt.Sprintf("conn/%d", i), time.Duration(0)
				if i%3 == 0 {
					scope, name, ttl = client.ScopeSession, fmt.Sprintf("sess/%d", i), time.Minute
				}
				c, err := ld.dial(ctx, client.HelloOptions{Client: "bulk", SessionTTL: ttl})
				if err == nil {
					var l *client.Lease
					if l, err = c.Acquire(ctx, name, client.AcquireOptions{Scope: scope, TTL: 5 * time.Second}); err == nil {
						mu.Lock()
						ld.held = append(ld.held, heldLease{c, l})
						mu.Unlock()
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	require.NoError(t, <-errs, "setting the bulk up")

	// Shared leases at their limit, and a fourth that is refused.
	for i := range ld.shared {
		c, err := ld.dial(ctx, client.HelloOptions{Client: "shared"})
		require.NoError(t, err)
		ld.shared[i] = c
		if i < 3 {
			l, err := c.Acquire(ctx, "sem", client.AcquireOptions{Mode: client.ModeShared, Limit: 3})
			require.NoError(t, err)
			ld.held = append(ld.held, heldLease{c, l})
		}
	}
	ld.requireSemFull(t)

	// A holder, and a waiter queued behind it.
	hc, err := ld.dial(ctx, client.HelloOptions{Client: "holder"})
	require.NoError(t, err)
	ld.holder, err = hc.Acquire(ctx, "queue", client.AcquireOptions{})
	require.NoError(t, err)
	ld.held = append(ld.held, heldLease{hc, ld.holder})
	ld.waitCli, err = ld.dial(ctx, client.HelloOptions{Client: "waiter"})
	require.NoError(t, err)
	go func() {
		l, err := ld.waitCli.Acquire(context.Background(), "queue", client.AcquireOptions{Wait: client.WaitForever})
		ld.waiter <- result{l, err}
	}()
	eventually(t, callTimeout, "the waiter queues", func() bool {
		in, err := hc.Inspect(ctx, "queue")
		return err == nil && in.Queued == 1
	})

	// A leader and a candidate.
	lc, err := ld.dial(ctx, client.HelloOptions{Client: "leader"})
	require.NoError(t, err)
	ld.leader, err = lc.Campaign(ctx, "leadership", client.CampaignOptions{})
	require.NoError(t, err)
	ld.term = receive(t, ld.leader.Elected(), "the leader is elected")
	cc, err := ld.dial(ctx, client.HelloOptions{Client: "candidate"})
	require.NoError(t, err)
	ld.candidate, err = cc.Campaign(ctx, "leadership", client.CampaignOptions{})
	require.NoError(t, err)
	eventually(t, callTimeout, "the candidate queues", func() bool {
		in, err := cc.Inspect(ctx, "leadership")
		return err == nil && in.Queued == 1
	})

	// A session with a heartbeat, pinging at a third of it.
	ld.hb, err = ld.dial(ctx, client.HelloOptions{Client: "heartbeat", Heartbeat: 600 * time.Millisecond})
	require.NoError(t, err)
	ld.hbLease, err = ld.hb.Acquire(ctx, "heartbeat", client.AcquireOptions{})
	require.NoError(t, err)
	ld.held = append(ld.held, heldLease{ld.hb, ld.hbLease})
	ld.wg.Add(1)
	go func() {
		defer ld.wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ld.stop:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			err := ld.hb.Ping(ctx)
			cancel()
			if err != nil {
				ld.hbErr.CompareAndSwap(nil, &err)
				return
			}
		}
	}()

	// A detached session within its TTL, with its lease.
	dc, err := client.Dial(ctx, socket)
	require.NoError(t, err)
	ld.detached, err = dc.Hello(ctx, client.HelloOptions{Client: "detached", SessionTTL: time.Minute})
	require.NoError(t, err)
	dl, err := dc.Acquire(ctx, "detached", client.AcquireOptions{Scope: client.ScopeSession})
	require.NoError(t, err)
	ld.detachedLease = dl.ID
	dc.Close()
	eventually(t, callTimeout, "the session is detached", func() bool {
		sessions, err := hc.List(ctx, client.ListOptions{All: true})
		if err != nil {
			return false
		}
		for _, s := range sessions {
			if s.ID == ld.detached.ID {
				return !s.Attached
			}
		}
		return false
	})

	// The loops.
	ld.pairs = startPairLoop(t, socket, "pairs", ld.stop, &ld.wg)
	ld.pipe = startPipeLoop(t, socket, ld.stop, &ld.wg)
	ld.conns = len(ld.clients) + 2
	return ld
}

// dial connects a client of the load and says hello.
func (ld *upgradeLoad) dial(ctx context.Context, opts client.HelloOptions) (*client.Client, error) {
	c, err := client.Dial(ctx, ld.socket)
	if err != nil {
		return nil, err
	}
	if _, err := c.Hello(ctx, opts); err != nil {
		c.Close()
		return nil, err
	}
	ld.mu.Lock()
	ld.clients = append(ld.clients, c)
	ld.mu.Unlock()
	return c, nil
}

// requireSemFull checks that "sem" is at its limit.
func (ld *upgradeLoad) requireSemFull(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	_, err := ld.shared[3].Acquire(ctx, "sem", client.AcquireOptions{Mode: client.ModeShared, Limit: 3})
	require.ErrorIs(t, err, client.ErrNotAcquired, "a fourth shared lease of a limit of 3")
}

// halt stops the loops and closes every connection.
func (ld *upgradeLoad) halt() {
	select {
	case <-ld.stop:
		return
	default:
	}
	close(ld.stop)
	ld.wg.Wait()
	for _, c := range ld.clients {
		c.Close()
	}
}

// tokens are the tokens of the load's leases, by name.
func (ld *upgradeLoad) tokens() map[string]uint64 {
	m := make(map[string]uint64, len(ld.held))
	for _, h := range ld.held {
		m[h.l.Name] = max(m[h.l.Name], h.l.Token)
	}
	return m
}

// verify checks, after an upgrade, that the load noticed nothing: no
// connection closed, no event but the leader's election, every lease held
// with its token, the waiter granted once the holder releases, the leader
// unchanged and the candidate next, the detached session resumable with
// its lease, the heartbeat kept, and the loops never failing. Tokens after
// it are larger than before.
func (ld *upgradeLoad) verify(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Let the loops run on across the upgrade for a while.
	pairsBefore, pipeBefore := ld.pairs.done.Load(), ld.pipe.done.Load()
	eventually(t, 10*time.Second, "the loops go on after the upgrade", func() bool {
		return ld.pairs.done.Load() > pairsBefore+20 && ld.pipe.done.Load() > pipeBefore+20 || ld.pairs.failed() != nil || ld.pipe.failed() != nil
	})
	require.NoError(t, ld.pairs.failed(), "the acquire and release loop")
	require.NoError(t, ld.pipe.failed(), "the pipelined pings")

	for i, c := range ld.clients {
		select {
		case <-c.Done():
			t.Fatalf("connection %d closed", i)
		default:
		}
		for drained := false; !drained; {
			select {
			case ev := <-c.Events():
				t.Errorf("connection %d was sent %+v", i, ev)
			default:
				drained = true
			}
		}
	}
	before := ld.tokens()
	for _, h := range ld.held {
		select {
		case <-h.l.Done():
			t.Fatalf("lease %s of %s ended: %s", h.l.ID, h.l.Name, h.l.Reason())
		default:
		}
		var r struct {
			Held  bool   `json:"held"`
			Token uint64 `json:"token"`
		}
		require.NoError(t, h.c.Call(ctx, "check", map[string]any{"lease": h.l.ID}, &r), "check %s", h.l.Name)
		require.True(t, r.Held, "%s is held", h.l.Name)
		require.Equal(t, h.l.Token, r.Token, "the token of %s", h.l.Name)
	}
	ld.requireSemFull(t)
	require.Nil(t, ld.hbErr.Load(), "the heartbeat's pings")

	// The leader leads on; the candidate is next.
	select {
	case <-ld.term.Done():
		t.Fatalf("the leader's term ended: %s", ld.term.Reason())
	default:
	}
	select {
	case term := <-ld.candidate.Elected():
		t.Fatalf("the candidate was elected (token %d) while the leader leads", term.Token)
	default:
	}
	require.NoError(t, ld.leader.Resign(ctx))
	next := receive(t, ld.candidate.Elected(), "the candidate is elected once the leader resigns")
	require.Greater(t, next.Token, ld.term.Token, "the next term's token")

	// The waiter is granted once the holder releases.
	select {
	case r := <-ld.waiter:
		t.Fatalf("the waiter's acquire ended while the holder holds: %v", r.err)
	default:
	}
	require.NoError(t, ld.holder.Release(ctx))
	r := receive(t, ld.waiter, "the waiter is granted once the holder releases")
	require.NoError(t, r.err, "the waiter's acquire")
	require.Greater(t, r.l.Token, before["queue"], "the waiter's token")

	// A name released and taken again gets a larger token.
	h := ld.held[0]
	require.NoError(t, h.l.Release(ctx))
	again, err := h.c.Acquire(ctx, h.l.Name, client.AcquireOptions{Scope: h.l.Scope})
	require.NoError(t, err)
	require.Greater(t, again.Token, h.l.Token, "the token of %s taken again", h.l.Name)

	// The detached session resumes with its lease.
	dc, err := client.Dial(ctx, ld.socket)
	require.NoError(t, err)
	defer dc.Close()
	sess, err := dc.Hello(ctx, client.HelloOptions{Resume: ld.detached})
	require.NoError(t, err)
	require.True(t, sess.Resumed, "the detached session resumed")
	var chk struct {
		Held bool `json:"held"`
	}
	require.NoError(t, dc.Call(ctx, "check", map[string]any{"lease": ld.detachedLease}, &chk))
	require.True(t, chk.Held, "the detached session's lease")

	require.True(t, ld.pairs.risen(), "the loop's tokens rise, across the upgrade")
	t.Logf("%d connections; acquire+release pairs: %d, the longest call %s; pipelined pings: %d, the longest wait %s",
		ld.conns, ld.pairs.done.Load(), time.Duration(ld.pairs.longest.Load()), ld.pipe.done.Load(), time.Duration(ld.pipe.longest.Load()))
}

// pairLoop acquires and releases a name over and over, on a connection of
// its own, reading every answer on the wire: an answer missing, doubled
// or out of order fails it.
type pairLoop struct {
	loop

	mu     sync.Mutex
	tokens []uint64
}

func startPairLoop(t *testing.T, socket, name string, stop <-chan struct{}, wg *sync.WaitGroup) *pairLoop {
	t.Helper()
	nc, err := net.Dial("unix", socket)
	require.NoError(t, err)
	p := &pairLoop{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer nc.Close()
		rd := bufio.NewReader(nc)
		id := 0
		call := func(op string, args map[string]any) (map[string]any, error) {
			id++
			args["id"], args["op"] = id, op
			line, _ := json.Marshal(args)
			began := time.Now()
			nc.SetDeadline(began.Add(callTimeout))
			if _, err := nc.Write(append(line, '\n')); err != nil {
				return nil, fmt.Errorf("%s %d: %w", op, id, err)
			}
			resp, err := rd.ReadBytes('\n')
			if err != nil {
				return nil, fmt.Errorf("%s %d: %w", op, id, err)
			}
			p.took(time.Since(began))
			var m map[string]any
			if err := json.Unmarshal(resp, &m); err != nil {
				return nil, fmt.Errorf("%s %d: %w", op, id, err)
			}
			if got, _ := m["id"].(float64); int(got) != id || m["ok"] != true {
				return nil, fmt.Errorf("%s %d: answered %s", op, id, resp)
			}
			return m, nil
		}
		if _, err := call("hello", map[string]any{"client": name}); err != nil {
			p.fail(err)
			return
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			m, err := call("acquire", map[string]any{"name": name, "wait_ms": 5000})
			if err == nil && m["acquired"] != true {
				err = fmt.Errorf("acquire %d: not acquired: %v", id, m)
			}
			if err == nil {
				p.mu.Lock()
				p.tokens = append(p.tokens, uint64(m["token"].(float64)))
				p.mu.Unlock()
				_, err = call("release", map[string]any{"lease": m["lease"]})
			}
			if err != nil {
				p.fail(err)
				return
			}
			p.done.Add(1)
		}
	}()
	return p
}

// risen tells whether every token was larger than the one before.
func (p *pairLoop) risen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 1; i < len(p.tokens); i++ {
		if p.tokens[i] <= p.tokens[i-1] {
			return false
		}
	}
	return len(p.tokens) > 1
}

// pipeLoop writes pings in batches of 50 without waiting for answers, and
// requires every answer, once each, in order.
type pipeLoop struct{ loop }

// loop is what a loop of the load counts, and its first error.
type loop struct {
	done    atomic.Int64 // rounds made
	longest atomic.Int64 // the longest wait for an answer, in nanoseconds
	err     atomic.Pointer[error]
}

// took counts a round that took d.
func (l *loop) took(d time.Duration) {
	if d.Nanoseconds() > l.longest.Load() {
		l.longest.Store(d.Nanoseconds())
	}
}

// fail records err, unless an error came before.
func (l *loop) fail(err error) { l.err.CompareAndSwap(nil, &err) }

// failed is the loop's first error.
func (l *loop) failed() error {
	if e := l.err.Load(); e != nil {
		return *e
	}
	return nil
}

func startPipeLoop(t *testing.T, socket string, stop <-chan struct{}, wg *sync.WaitGroup) *pipeLoop {
	t.Helper()
	nc, err := net.Dial("unix", socket)
	require.NoError(t, err)
	p := &pipeLoop{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer nc.Close()
		rd := bufio.NewReader(nc)
		id := 0
		for {
			select {
			case <-stop:
				return
			default:
			}
			var batch []byte
			first := id + 1
			for range 50 {
				id++
				batch = fmt.Appendf(batch, `{"id":%d,"op":"ping"}`+"\n", id)
			}
			began := time.Now()
			nc.SetDeadline(began.Add(callTimeout))
			err := func() error {
				if _, err := nc.Write(batch); err != nil {
					return err
				}
				for want := first; want <= id; want++ {
					line, err := rd.ReadBytes('\n')
					if err != nil {
						return fmt.Errorf("waiting for ping %d: %w", want, err)
					}
					var r struct {
						ID int  `json:"id"`
						OK bool `json:"ok"`
					}
					if err := json.Unmarshal(line, &r); err != nil || r.ID != want || !r.OK {
						return fmt.Errorf("ping %d answered %s", want, line)
					}
				}
				return nil
			}()
			if err != nil {
				p.fail(err)
				return
			}
			p.took(time.Since(began))
			p.done.Add(1)
		}
	}()
	return p
}
