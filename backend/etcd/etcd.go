// Package etcd is the backend that keeps locks in an etcd cluster, whose
// writes are linearizable and survive the loss of a minority of its
// members: a grant is made by a transaction that Raft has committed on a
// quorum, so no failover or member restart can lose it and grant the
// name twice. Every host's agent points at the same cluster.
//
// A name's holders and waiters' tickets are keys of their own under the
// name's directory (see state.go). A grant is one transaction that checks
// that nothing in the directory changed since the state it decided on,
// and writes the holder key; its revision, plus the name's offset (0
// unless an operator set one), is the fencing token: etcd's revisions
// increase with every write of the cluster, and never go back across
// restarts and leader changes. A token of 2^53-1 or more is never
// granted (backend.ErrTokensExhausted).
//
// The holders of one agent and one TTL share an etcd lease that the
// agent's renewals keep alive, and each waiter's ticket has a lease of its
// own, kept alive by its attempts: an agent that dies leaves nothing
// behind once they expire. Waiters are woken by etcd watches of the names
// they wait for. The package knows nothing of sessions or sockets.
package etcd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockagent/lockagent/backend"
)

// Options configure a Backend.
type Options struct {
	// Client is the connection to etcd; the Backend closes it.
	Client *clientv3.Client
	// KeyPrefix starts every key, followed by "/"; default "lockagent".
	KeyPrefix string
	// RequestTimeout bounds a request whose context has no deadline;
	// default 5 s.
	RequestTimeout time.Duration
	Logger         hclog.Logger
}

// Backend stores locks in etcd. Create it with Open.
type Backend struct {
	c       *clientv3.Client
	prefix  string // KeyPrefix + "/"
	timeout time.Duration
	log     hclog.Logger
	w       *watches

	classes classes
	tickets tickets
	turn    atomic.Uint64 // see pick

	mu     sync.Mutex // guards the fields below
	closed bool
	// held is what this agent holds, as granted: the renewals of these go
	// by their etcd lease's keep-alive alone.
	held map[heldKey]*heldLease
	// fences caches each name's fence, for the first guess of an
	// acquire (see guess).
	fences map[string]fence
	// pending are releases that failed, sent again before each renewal
	// until done: a holder key stays while its TTL's etcd lease lives,
	// which the agent's other holders keep alive.
	pending map[heldKey]backend.LeaseKey
	// lastRev is the highest revision etcd has answered with.
	lastRev int64
}

// heldKey identifies a grant.
type heldKey struct{ name, id string }

// heldLease is a grant of this agent.
type heldLease struct {
	key    string // its holder key
	mode   backend.Mode
	create int64 // the holder key's create revision
	lease  *etcdLease
}

// maxFences bounds the cache of fences; it is emptied when full.
const maxFences = 1 << 16

var _ backend.Backend = (*Backend)(nil)

// Open checks that etcd answers (a read of the key prefix) and returns
// the backend.
func Open(ctx context.Context, o Options) (*Backend, error) {
	if o.KeyPrefix == "" {
		o.KeyPrefix = "lockagent"
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	b := &Backend{
		c: o.Client, prefix: o.KeyPrefix + "/", timeout: o.RequestTimeout, log: o.Logger,
		classes: classes{current: map[int64]*etcdLease{}, granting: map[int64]chan struct{}{}},
		tickets: tickets{leases: map[ticketKey]*ticketLease{}, sweepAt: minTicketSweep},
		held:    map[heldKey]*heldLease{}, fences: map[string]fence{}, pending: map[heldKey]backend.LeaseKey{},
	}
	ctx, cancel := b.bound(ctx, time.Time{})
	defer cancel()
	if _, err := b.c.Get(ctx, b.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		o.Client.Close()
		return nil, fmt.Errorf("etcd: %w: %w", backend.ErrUnavailable, err)
	}
	b.turn.Store(rand.Uint64())
	b.w = newWatches(b)
	return b, nil
}

// Name is "etcd".
func (b *Backend) Name() string { return "etcd" }

// begin fails an operation on a closed backend or with a context done.
func (b *Backend) begin(ctx context.Context) error {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return backend.ErrClosed
	}
	return ctx.Err()
}

// bound gives ctx the deadline, if set, or the request timeout if ctx has
// none, and asks etcd to answer only from a member that has a leader: a
// member cut off from the others fails the request at once rather than
// hold it.
func (b *Backend) bound(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	ctx = clientv3.WithRequireLeader(ctx)
	if !deadline.IsZero() {
		return context.WithDeadline(ctx, deadline)
	}
	if _, ok := ctx.Deadline(); !ok {
		return context.WithTimeout(ctx, b.timeout)
	}
	return context.WithCancel(ctx)
}

// fail wraps an error of etcd: a cancelled request stays a cancellation,
// a closed backend says so, anything else means the outcome is unknown.
func (b *Backend) fail(op, name string, err error) error {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("etcd: %s %q: %w", op, name, backend.ErrClosed)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("etcd: %s %q: %w", op, name, err)
	}
	return fmt.Errorf("etcd: %s %q: %w: %w", op, name, backend.ErrUnavailable, err)
}

// seen records a revision etcd answered with.
func (b *Backend) seen(rev int64) {
	b.mu.Lock()
	b.lastRev = max(b.lastRev, rev)
	b.mu.Unlock()
}

// guess is the state an acquire first assumes, so that it costs one
// round trip when the guess is right: nobody holds the name, the fence
// is as this agent last saw it, and a waiter's ticket has no more tickets
// before it than its last attempt saw (there cannot be more: tickets only
// join at the tail). The grant's transaction checks what the guess
// assumed, and brings back the name's state when it is wrong. ok is false
// when there is nothing to guess: a waiter whose place is not known yet.
func (b *Backend) guess(req backend.AcquireRequest) (st state, ok bool) {
	b.mu.Lock()
	st.fence = b.fences[req.Name]
	b.mu.Unlock()
	if req.Ticket == "" {
		return st, true
	}
	t, queued := b.tickets.place(ticketKey{req.Name, req.Ticket})
	if !queued {
		return st, true
	}
	if t.before < 0 || t.mode != req.Mode {
		return state{}, false
	}
	for range t.before {
		st.queue = append(st.queue, ticket{mode: backend.Shared})
	}
	st.queue = append(st.queue, ticket{id: req.Ticket, mode: t.mode, create: t.create})
	return st, true
}

// remember caches a name's fence.
func (b *Backend) remember(name string, f fence) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.fences) >= maxFences {
		clear(b.fences)
	}
	b.fences[name] = f
}

// read returns a name's state.
func (b *Backend) read(ctx context.Context, k keys) (state, error) {
	resp, err := b.c.Get(ctx, k.dir, clientv3.WithPrefix())
	if err != nil {
		return state{}, err
	}
	b.seen(resp.Header.Revision)
	return k.parse(resp.Kvs, resp.Header.Revision)
}

// Acquire makes one attempt; see backend.Backend.
func (b *Backend) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Grant, error) {
	if err := req.Validate(); err != nil {
		return backend.Grant{}, err
	}
	if err := b.begin(ctx); err != nil {
		return backend.Grant{}, fmt.Errorf("etcd: acquire %q: %w", req.Name, err)
	}
	sent := time.Now()
	ctx, cancel := b.bound(ctx, req.Deadline)
	defer cancel()
	b.flushPending(ctx)
	k := b.keys(req.Name)
	// The releases first, each a transaction of its own: a grant's
	// transaction checks the directory it decided on, which they change.
	for _, l := range req.Releases {
		if err := b.release(ctx, l); err != nil && !errors.Is(err, backend.ErrNotHeld) {
			return backend.Grant{}, err
		}
	}

	// A waiter's attempt keeps its ticket alive, if it has one, while the
	// name's state is read.
	var ticketKA chan error
	tk := ticketKey{req.Name, req.Ticket}
	if req.Ticket != "" {
		if l := b.tickets.get(tk); l != nil {
			ticketKA = make(chan error, 1)
			life := min(req.TTL, backend.TicketLife)
			go func() { ticketKA <- b.refresh(ctx, l, sent.Add(life)) }()
		}
	}
	g, err := b.acquire(ctx, k, req, sent)
	if ticketKA != nil {
		if kaErr := <-ticketKA; leaseGone(kaErr) {
			// The ticket expired: the next attempt queues again.
			b.tickets.take(tk)
		}
	}
	return g, err
}

// acquire runs an attempt: a transaction per state, starting from the
// guess, until one applies or the request is denied. Only a grant is
// tried on a guess: a denial, or anything else, needs the real state.
func (b *Backend) acquire(ctx context.Context, k keys, req backend.AcquireRequest, sent time.Time) (backend.Grant, error) {
	st, ok := b.guess(req)
	for {
		if !ok {
			var err error
			if st, err = b.read(ctx, k); err != nil {
				return backend.Grant{}, b.fail("acquire", req.Name, err)
			}
		}
		out, retryIn, ahead := st.decide(req)
		if st.rev == 0 && out != grant {
			ok = false
			continue
		}
		if mine := st.ticketOf(req.Ticket); mine != nil && st.rev != 0 {
			// Its place for the next attempt's guess, once it is at the
			// head, where it stays.
			before := slices.Index(st.queue, *mine)
			if before >= len(st.head()) {
				before = -1
			}
			b.tickets.seen(ticketKey{req.Name, req.Ticket}, mine.create, before)
		}
		var applied bool
		var g backend.Grant
		var err error
		switch out {
		case otherMode:
			return backend.Grant{}, fmt.Errorf("etcd: acquire %q: %w", req.Name, backend.ErrOtherMode)
		case deny:
			if req.Ticket != "" && st.ticketOf(req.Ticket) == nil {
				if err := b.queue(ctx, k, req); err != nil {
					return backend.Grant{}, b.fail("acquire", req.Name, err)
				}
			}
			return backend.Grant{}, &backend.HeldError{RetryIn: max(retryIn, time.Millisecond)}
		case repeat:
			g, applied, st, err = b.repeat(ctx, k, req, st, sent)
		default:
			g, applied, st, err = b.grant(ctx, k, req, st, ahead, sent)
		}
		if err != nil || applied {
			return g, err
		}
		ok = true // st is the real state, as the transaction brought it back
		if err := ctx.Err(); err != nil {
			return backend.Grant{}, b.fail("acquire", req.Name, err)
		}
	}
}

// grant writes the holder key if what decided it on st still holds. It
// returns whether it did, and otherwise the name's state now.
func (b *Backend) grant(ctx context.Context, k keys, req backend.AcquireRequest, st state, ahead int, sent time.Time) (backend.Grant, bool, state, error) {
	offset := st.fence.offset
	b.mu.Lock()
	last := max(st.rev, b.lastRev)
	b.mu.Unlock()
	if offset >= backend.MaxToken || uint64(last)+1 >= backend.MaxToken-offset {
		if st.rev == 0 {
			// A guess: the name's real state says.
			st, err := b.read(ctx, k)
			if err != nil {
				return backend.Grant{}, false, state{}, b.fail("acquire", req.Name, err)
			}
			return backend.Grant{}, false, st, nil
		}
		return backend.Grant{}, false, state{}, b.exhausted(req.Name, offset)
	}
	l, err := b.classLease(ctx, req.TTL)
	if err != nil {
		return backend.Grant{}, false, state{}, b.fail("acquire", req.Name, err)
	}
	// The holder's etcd lease must last until the grant's local deadline
	// (sent+TTL) at least: if need be, a keep-alive sent now, with the
	// transaction.
	ka := make(chan error, 1)
	go func() { ka <- b.refresh(ctx, l, sent.Add(req.TTL)) }()

	v := holderValue{Version: valueVersion, Offset: offset, TTL: req.TTL.Milliseconds(), Host: req.Host, Meta: req.Meta}
	mine := st.ticketOf(req.Ticket)
	key := k.exclusive() + req.LeaseID
	var slots []int64
	beside := false
	switch {
	case req.Mode == backend.Shared && req.Limit > 0:
		slots, beside = st.slotsFor(req.Limit, ahead, mine != nil, b.pick)
		key, v.ID = k.slot(slots[len(slots)-1]), req.LeaseID
	case req.Mode == backend.Shared:
		key = k.shared() + req.LeaseID
	}
	then := []clientv3.Op{clientv3.OpPut(key, encode(v), clientv3.WithLease(l.id)), clientv3.OpPut(k.fence(offset), "")}
	if mine != nil {
		then = append(then, clientv3.OpDelete(k.ticket(mine.mode, mine.id)))
	}
	resp, err := b.c.Txn(ctx).If(grantConditions(k, req, st, mine, slots, beside)...).
		Then(then...).Else(clientv3.OpGet(k.dir, clientv3.WithPrefix())).Commit()
	kaErr := <-ka
	if err != nil {
		if leaseGone(err) {
			// The TTL's etcd lease expired meanwhile: the next try
			// grants another.
			l.markGone()
			return backend.Grant{}, false, st, nil
		}
		return backend.Grant{}, false, state{}, b.fail("acquire", req.Name, err)
	}
	b.seen(resp.Header.Revision)
	if !resp.Succeeded {
		st, err := k.parse(resp.Responses[0].GetResponseRange().Kvs, resp.Header.Revision)
		if err != nil {
			return backend.Grant{}, false, state{}, fmt.Errorf("etcd: acquire %q: %w", req.Name, err)
		}
		b.remember(req.Name, st.fence)
		return backend.Grant{}, false, st, nil
	}
	if mine != nil {
		b.tickets.take(ticketKey{req.Name, req.Ticket})
	}
	rev := resp.Header.Revision
	b.remember(req.Name, fence{mod: rev, offset: offset})
	tok := uint64(rev) + offset
	h := &heldLease{key: key, mode: req.Mode, create: rev, lease: l}
	switch {
	case kaErr != nil:
		// Granted, on an etcd lease that may end before the grant's
		// local deadline: given back, and the outcome is unknown.
		b.giveBack(req, h)
		return backend.Grant{}, true, state{}, b.fail("acquire", req.Name, kaErr)
	case tok >= backend.MaxToken:
		b.giveBack(req, h)
		return backend.Grant{}, true, state{}, b.exhausted(req.Name, offset)
	}
	b.mu.Lock()
	b.held[heldKey{req.Name, req.LeaseID}] = h
	b.mu.Unlock()
	return backend.Grant{Token: tok}, true, state{}, nil
}

// grantConditions are what decided a grant on st, checked when it
// applies: facts about the keys, not that nothing changed since st, so
// that grants that do not conflict do not fail each other, and a grant
// decided on a guess is as sound as one decided on a read:
//
//   - the name's offset is the same: no fence of a higher one;
//   - an exclusive grant: no holder;
//   - a shared grant: no exclusive holder; under a limit, its slots free
//     (see state.slotsFor) and no shared holder but in the slots below
//     the limit, so that its holders, one per slot, stay within it;
//   - a request whose ticket is queued: the ticket is still there; for
//     any other, nobody queues. A ticket that st shows at the head of the
//     queue (alone, or in the run of shared tickets there) stays there:
//     tickets only join at the tail.
//
// A grant under a limit whose state has shared holders outside the slots
// below it (holders without a limit, or under a larger one) checks instead
// that no holder came or went since st, a read: it goes alone.
//
// Shared grants under a limit take slots below it, so that concurrent
// grants in different slots never exceed the limit together: they go at
// once, not a round trip at a time. A shared waiter at the head counts
// the shared tickets ahead of it as holders: it checks that one more
// slot than those is free, and takes the last, leaving the others to
// them.
func grantConditions(k keys, req backend.AcquireRequest, st state, mine *ticket, slots []int64, beside bool) []clientv3.Cmp {
	// No fence of a higher offset: one that an operator set meanwhile.
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k.fence(st.fence.offset+1)), "=", 0).
		WithRange(clientv3.GetPrefixRangeEnd(k.fences))}
	none := func(dir string) clientv3.Cmp {
		return clientv3.Compare(clientv3.CreateRevision(dir), "=", 0).WithPrefix()
	}
	switch {
	case req.Mode == backend.Exclusive:
		cmps = append(cmps, none(k.holders()))
	case len(slots) > 0 && beside:
		cmps = append(cmps, none(k.exclusive()), none(k.shared()),
			clientv3.Compare(clientv3.CreateRevision(k.slot(int64(req.Limit))), "=", 0).WithRange(clientv3.GetPrefixRangeEnd(k.slots())))
		for _, n := range slots {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k.slot(n)), "=", 0))
		}
	case len(slots) > 0:
		cmps = append(cmps, none(k.exclusive()), clientv3.Compare(clientv3.CreateRevision(k.slot(slots[0])), "=", 0),
			clientv3.Compare(clientv3.ModRevision(k.holders()), "<", st.rev+1).WithPrefix())
	default:
		cmps = append(cmps, none(k.exclusive()))
	}
	if mine == nil {
		cmps = append(cmps, none(k.queue()))
	} else {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k.ticket(mine.mode, mine.id)), "=", mine.create))
	}
	return cmps
}

// pick picks one of n free slots for a request that does not queue:
// each in turn, from a random start, so that the tries of this agent at
// once take different slots, and those of agents at once mostly do.
func (b *Backend) pick(n int) int {
	return int(b.turn.Add(1) % uint64(n))
}

// giveBack deletes a grant that cannot be handed out.
func (b *Backend) giveBack(req backend.AcquireRequest, h *heldLease) {
	b.mu.Lock()
	b.held[heldKey{req.Name, req.LeaseID}] = h
	b.mu.Unlock()
	l := backend.LeaseKey{Name: req.Name, LeaseID: req.LeaseID, Mode: req.Mode}
	if err := b.Release(context.Background(), l); err != nil && !errors.Is(err, backend.ErrNotHeld) {
		b.log.Debug("giving back a grant", "name", req.Name, "error", err)
	}
}

func (b *Backend) exhausted(name string, offset uint64) error {
	if offset >= backend.MaxToken {
		return fmt.Errorf("etcd: acquire %q: %w: the name's offset %d leaves no token below 2^53-1", name, backend.ErrTokensExhausted, offset)
	}
	return fmt.Errorf("etcd: acquire %q: %w: etcd's revision plus the name's offset %d reaches 2^53-1", name, backend.ErrTokensExhausted, offset)
}

// repeat answers an acquire by the lease id that holds the name: the same
// token, its etcd lease kept alive or, for another TTL, the key moved to
// that TTL's etcd lease; a waiter's ticket left behind is taken out.
func (b *Backend) repeat(ctx context.Context, k keys, req backend.AcquireRequest, st state, sent time.Time) (backend.Grant, bool, state, error) {
	h := *st.holderOf(req.LeaseID)
	key := h.key
	l, err := b.classLease(ctx, req.TTL)
	if err != nil {
		return backend.Grant{}, false, state{}, b.fail("acquire", req.Name, err)
	}
	var then []clientv3.Op
	if h.lease != l.id || h.v.TTL != req.TTL.Milliseconds() {
		v := h.v
		v.TTL = req.TTL.Milliseconds()
		then = append(then, clientv3.OpPut(key, encode(v), clientv3.WithLease(l.id)))
	}
	if t := st.ticketOf(req.Ticket); t != nil {
		then = append(then, clientv3.OpDelete(k.ticket(t.mode, t.id)))
		defer b.tickets.take(ticketKey{req.Name, req.Ticket})
	}
	ka := make(chan error, 1)
	go func() { ka <- b.refresh(ctx, l, sent.Add(req.TTL)) }()
	if len(then) > 0 {
		resp, err := b.c.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(key), "=", h.mod),
		).Then(then...).Else(clientv3.OpGet(k.dir, clientv3.WithPrefix())).Commit()
		kaErr := <-ka
		switch {
		case err != nil && leaseGone(err):
			l.markGone()
			return backend.Grant{}, false, st, nil
		case err != nil:
			return backend.Grant{}, false, state{}, b.fail("acquire", req.Name, err)
		case !resp.Succeeded:
			st, err := k.parse(resp.Responses[0].GetResponseRange().Kvs, resp.Header.Revision)
			if err != nil {
				return backend.Grant{}, false, state{}, fmt.Errorf("etcd: acquire %q: %w", req.Name, err)
			}
			return backend.Grant{}, false, st, nil
		case kaErr != nil:
			return backend.Grant{}, true, state{}, b.fail("acquire", req.Name, kaErr)
		}
	} else if err := <-ka; err != nil {
		if leaseGone(err) {
			// The holder went with its etcd lease: the name's state says
			// what now.
			st, err := b.read(ctx, k)
			if err != nil {
				return backend.Grant{}, false, state{}, b.fail("acquire", req.Name, err)
			}
			return backend.Grant{}, false, st, nil
		}
		return backend.Grant{}, true, state{}, b.fail("acquire", req.Name, err)
	}
	b.mu.Lock()
	b.held[heldKey{req.Name, req.LeaseID}] = &heldLease{key: key, mode: h.mode, create: h.create, lease: l}
	b.mu.Unlock()
	return backend.Grant{Token: h.token()}, true, state{}, nil
}

// queue puts a denied waiter's ticket at the tail of the name's queue,
// on an etcd lease of its own.
func (b *Backend) queue(ctx context.Context, k keys, req backend.AcquireRequest) error {
	tk := ticketKey{req.Name, req.Ticket}
	life := min(req.TTL, backend.TicketLife)
	v := encode(ticketValue{Version: valueVersion, Life: life.Milliseconds()})
	key := k.ticket(req.Mode, req.Ticket)
	for range 2 {
		l := b.tickets.get(tk)
		if l == nil {
			var err error
			if l, err = b.grantLease(ctx, leaseSecs(life)); err != nil {
				return err
			}
			b.tickets.put(tk, req.Mode, l)
		}
		resp, err := b.c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, v, clientv3.WithLease(l.id))).Commit()
		if err == nil && resp.Succeeded {
			b.tickets.seen(tk, resp.Header.Revision, -1)
		}
		if !leaseGone(err) {
			return err
		}
		l.markGone()
	}
	return errLeaseGone
}

// Release ends a lease and, through the watches, wakes the waiters of its
// name. A break (the release of another agent's holder) also leaves a
// marker on that holder's etcd lease, which that agent's next renewal
// finds.
func (b *Backend) Release(ctx context.Context, l backend.LeaseKey) error {
	if err := b.begin(ctx); err != nil {
		return fmt.Errorf("etcd: release %q: %w", l.Name, err)
	}
	ctx, cancel := b.bound(ctx, time.Time{})
	defer cancel()
	err := b.release(ctx, l)
	if err != nil && !errors.Is(err, backend.ErrNotHeld) && !errors.Is(err, context.Canceled) {
		b.mu.Lock()
		b.pending[heldKey{l.Name, l.LeaseID}] = l
		b.mu.Unlock()
	}
	return err
}

func (b *Backend) release(ctx context.Context, l backend.LeaseKey) error {
	k := b.keys(l.Name)
	hk := heldKey{l.Name, l.LeaseID}
	b.mu.Lock()
	h := b.held[hk]
	b.mu.Unlock()
	if h != nil && h.mode == l.Mode {
		resp, err := b.c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.create)).
			Then(clientv3.OpDelete(h.key)).Commit()
		if err != nil {
			return b.fail("release", l.Name, err)
		}
		b.forget(hk)
		if !resp.Succeeded {
			return fmt.Errorf("etcd: release %q: %w", l.Name, backend.ErrNotHeld)
		}
		return nil
	}
	// Not granted here, or asked in another mode: as etcd has it.
	hv, err := b.readHolder(ctx, k, l)
	if err != nil {
		return b.fail("release", l.Name, err)
	}
	if hv == nil {
		return fmt.Errorf("etcd: release %q: %w", l.Name, backend.ErrNotHeld)
	}
	key := hv.key
	then := []clientv3.Op{clientv3.OpDelete(key)}
	if hv.lease != 0 && !b.ownLease(hv.lease) {
		then = append(then, clientv3.OpPut(b.marker(hv.lease, l.Name, l.LeaseID), "", clientv3.WithLease(hv.lease)))
	}
	tr, err := b.c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", hv.create)).Then(then...).Commit()
	switch {
	case err != nil && leaseGone(err):
		// Its etcd lease expired meanwhile, and took the key.
		return fmt.Errorf("etcd: release %q: %w", l.Name, backend.ErrNotHeld)
	case err != nil:
		return b.fail("release", l.Name, err)
	case !tr.Succeeded:
		return fmt.Errorf("etcd: release %q: %w", l.Name, backend.ErrNotHeld)
	}
	b.forget(hk)
	return nil
}

// readHolder returns the holder key of a lease as etcd has it, or nil
// when that lease does not hold the name in its mode.
func (b *Backend) readHolder(ctx context.Context, k keys, l backend.LeaseKey) (*holder, error) {
	dir := k.exclusive()
	if l.Mode == backend.Shared {
		dir = k.shared()
	}
	resp, err := b.c.Txn(ctx).Then(clientv3.OpGet(dir+l.LeaseID), clientv3.OpGet(k.slots(), clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, err
	}
	var kvs []*mvccpb.KeyValue
	for _, r := range resp.Responses {
		kvs = append(kvs, r.GetResponseRange().Kvs...)
	}
	st, err := k.parse(kvs, resp.Header.Revision)
	if err != nil {
		// A foreign key among the slots: none of them is this lease's
		// holder, unless its own key is lockagent's.
		st, err = k.parse(resp.Responses[0].GetResponseRange().Kvs, resp.Header.Revision)
		if err != nil {
			return nil, nil
		}
	}
	if h := st.holderOf(l.LeaseID); h != nil && h.mode == l.Mode {
		return h, nil
	}
	return nil, nil
}

// ownLease tells an etcd lease of this agent's holders.
func (b *Backend) ownLease(id clientv3.LeaseID) bool {
	for _, l := range b.classes.all() {
		if l.id == id {
			return true
		}
	}
	return false
}

// forget drops a grant that ended.
func (b *Backend) forget(hk heldKey) {
	b.mu.Lock()
	delete(b.held, hk)
	delete(b.pending, hk)
	b.mu.Unlock()
}

// flushPending sends again the releases that failed. One call at a time
// does it; the others go on.
func (b *Backend) flushPending(ctx context.Context) {
	b.mu.Lock()
	if len(b.pending) == 0 {
		b.mu.Unlock()
		return
	}
	ls := make([]backend.LeaseKey, 0, len(b.pending))
	for hk, l := range b.pending {
		ls = append(ls, l)
		delete(b.pending, hk)
	}
	b.mu.Unlock()
	for _, l := range ls {
		if err := b.release(ctx, l); err != nil && !errors.Is(err, backend.ErrNotHeld) {
			b.mu.Lock()
			b.pending[heldKey{l.Name, l.LeaseID}] = l
			b.mu.Unlock()
		}
	}
}

// Leave takes a ticket out of the name's queue: its etcd lease is
// revoked, which deletes it.
func (b *Backend) Leave(ctx context.Context, name, ticket string) error {
	if err := b.begin(ctx); err != nil {
		return fmt.Errorf("etcd: leave %q: %w", name, err)
	}
	ctx, cancel := b.bound(ctx, time.Time{})
	defer cancel()
	if l := b.tickets.take(ticketKey{name, ticket}); l != nil {
		if _, err := b.c.Revoke(ctx, l.id); err != nil && !leaseGone(err) {
			return b.fail("leave", name, err)
		}
		return nil
	}
	k := b.keys(name)
	x, sh := k.ticket(backend.Exclusive, ticket), k.ticket(backend.Shared, ticket)
	resp, err := b.c.Txn(ctx).Then(clientv3.OpGet(x), clientv3.OpGet(sh)).Commit()
	if err != nil {
		return b.fail("leave", name, err)
	}
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			if _, ok := k.parseTicket(kv); !ok {
				continue
			}
			key := string(kv.Key)
			_, err := b.c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", kv.CreateRevision)).
				Then(clientv3.OpDelete(key)).Commit()
			if err != nil {
				return b.fail("leave", name, err)
			}
		}
	}
	return nil
}

// Inspect reports the live holders of a name, its last token and its
// queue. A holder's ExpiresIn is what its etcd lease has left, its TTL at
// most.
func (b *Backend) Inspect(ctx context.Context, name string) (backend.LockInfo, error) {
	if err := b.begin(ctx); err != nil {
		return backend.LockInfo{}, fmt.Errorf("etcd: inspect %q: %w", name, err)
	}
	ctx, cancel := b.bound(ctx, time.Time{})
	defer cancel()
	k := b.keys(name)
	st, err := b.read(ctx, k)
	if errors.Is(err, backend.ErrForeignKey) {
		return backend.LockInfo{}, fmt.Errorf("etcd: inspect %q: %w", name, err)
	}
	if err != nil {
		return backend.LockInfo{}, b.fail("inspect", name, err)
	}
	info := backend.LockInfo{Holders: []backend.Holder{}, Queued: len(st.queue)}
	if st.fence.mod != 0 {
		info.LastToken = uint64(st.fence.mod) + st.fence.offset
	}
	left := map[clientv3.LeaseID]time.Duration{}
	for _, h := range st.holders {
		left[h.lease] = 0
	}
	delete(left, 0)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	for _, id := range slices.Collect(maps.Keys(left)) {
		wg.Go(func() {
			resp, err := b.c.TimeToLive(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				firstErr = cmpOr(firstErr, err)
			case resp.TTL >= 0:
				left[id] = time.Duration(resp.TTL) * time.Second
			default: // -1: expired since the read
				left[id] = -1
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return backend.LockInfo{}, b.fail("inspect", name, firstErr)
	}
	for _, h := range st.holders {
		d := left[h.lease]
		if d < 0 {
			continue // gone since the read
		}
		// Etcd keeps a holder a third longer than its TTL (see leases.go):
		// what is said is what the agent counts on, at most.
		info.Holders = append(info.Holders, backend.Holder{LeaseID: h.id, Mode: h.mode, Token: h.token(), Meta: h.v.Meta, Host: h.v.Host, ExpiresIn: min(d, h.ttl())})
	}
	return info, nil
}

// cmpOr returns the first of errs that is not nil.
func cmpOr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Watch wakes the waiters of a name; see backend.Backend and watch.go.
func (b *Backend) Watch(ctx context.Context, name, ticket string) (<-chan struct{}, func(), error) {
	if err := b.begin(ctx); err != nil {
		return nil, nil, fmt.Errorf("etcd: watch %q: %w", name, err)
	}
	return b.w.watch(ctx, name, ticket)
}

// closeWait bounds the revocations of Close.
const closeWait = 2 * time.Second

// Close ends the watches, revokes the agent's etcd leases (which deletes
// whatever holder or ticket is left on them) and closes the client.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return backend.ErrClosed
	}
	b.closed = true
	b.mu.Unlock()
	b.w.close()
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	var wg sync.WaitGroup
	for _, l := range append(b.classes.all(), b.tickets.all()...) {
		wg.Go(func() { _, _ = b.c.Revoke(ctx, l.id) })
	}
	wg.Wait()
	if err := b.c.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("etcd: %w", err)
	}
	return nil
}
