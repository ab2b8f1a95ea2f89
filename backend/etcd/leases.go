package etcd

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockagent/lockagent/backend"
)

// An agent's holders of one TTL share one etcd lease, which the agent's
// renewals keep alive: a renewal costs a keep-alive per TTL, not per
// holder. Etcd never ends a holder before the agent's local deadline: a
// grant or a renewal sent at t waits, if need be, for a keep-alive sent
// at t or later that makes the lease last until t+TTL, and etcd counts a
// lease's time from when it receives the keep-alive (or gives it its
// whole time again: a new leader does). An etcd lease lasts a third more
// than its holders' TTL (in whole seconds, rounded up), so that the
// keep-alives of the renewals, every third of the TTL, are enough: a
// grant seldom waits for one. Etcd ends the holders of an agent that
// died 4/3 of their TTL after its last renewal, at most.

// etcdLease is one etcd lease of the agent: a TTL's, or a ticket's.
type etcdLease struct {
	id   clientv3.LeaseID
	secs int64

	mu sync.Mutex
	// sent is when the last keep-alive that succeeded was sent (or the
	// grant): etcd keeps the lease until sent+secs at least.
	sent time.Time
	ka   *keepAlive // the keep-alive in flight, if any
	gone bool       // etcd said the lease is gone
}

// keepAlive is one keep-alive in flight, which concurrent callers share.
type keepAlive struct {
	sent time.Time
	done chan struct{} // closed when err is set
	err  error
}

// errLeaseGone: etcd no longer has the lease (it expired, or was
// revoked): every key attached to it is gone.
var errLeaseGone = errors.New("etcd lease gone")

// leaseGone tells an error of etcd saying so.
func leaseGone(err error) bool {
	return errors.Is(err, errLeaseGone) || errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound)
}

// refresh makes sure that etcd keeps l until until at least: that a
// keep-alive sent late enough succeeded. It returns at once if one has,
// waits for one in flight that was sent late enough, or sends one.
// Concurrent callers share a keep-alive: acquires and renewals at a high
// rate cost etcd a few.
func (b *Backend) refresh(ctx context.Context, l *etcdLease, until time.Time) error {
	notBefore := until.Add(-time.Duration(l.secs) * time.Second)
	for {
		l.mu.Lock()
		switch {
		case l.gone:
			l.mu.Unlock()
			return errLeaseGone
		case !l.sent.Before(notBefore):
			l.mu.Unlock()
			return nil
		}
		if ka := l.ka; ka != nil && !ka.sent.Before(notBefore) {
			l.mu.Unlock()
			select {
			case <-ka.done:
				if ka.err == nil || leaseGone(ka.err) {
					return ka.err
				}
				// The one who sent it gave up (its context): try again,
				// sending one if need be.
				if err := ctx.Err(); err != nil {
					return err
				}
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		ka := &keepAlive{sent: time.Now(), done: make(chan struct{})}
		l.ka = ka
		l.mu.Unlock()

		_, err := b.c.KeepAliveOnce(ctx, l.id)
		l.mu.Lock()
		switch {
		case err == nil:
			if ka.sent.After(l.sent) {
				l.sent = ka.sent
			}
		case leaseGone(err):
			l.gone = true
			err = errLeaseGone
		}
		if l.ka == ka {
			l.ka = nil
		}
		l.mu.Unlock()
		ka.err = err
		close(ka.done)
		return err
	}
}

// leaseSecs is the whole seconds, rounded up, of an etcd lease for
// holders (or a ticket) of TTL d: 4/3 of it (see above).
func leaseSecs(d time.Duration) int64 {
	d += d / 3
	return max(int64((d+time.Second-1)/time.Second), 1)
}

// classes holds the current etcd lease of each TTL (in seconds).
type classes struct {
	mu       sync.Mutex
	current  map[int64]*etcdLease
	granting map[int64]chan struct{} // closed when a grant in flight ends
}

// classLease returns the current etcd lease for holders of ttl, granting
// one if there is none (or the last one is gone).
func (b *Backend) classLease(ctx context.Context, ttl time.Duration) (*etcdLease, error) {
	secs := leaseSecs(ttl)
	cs := &b.classes
	for {
		cs.mu.Lock()
		if l := cs.current[secs]; l != nil && !l.isGone() {
			cs.mu.Unlock()
			return l, nil
		}
		if ch := cs.granting[secs]; ch != nil {
			cs.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ch := make(chan struct{})
		cs.granting[secs] = ch
		cs.mu.Unlock()

		l, err := b.grantLease(ctx, secs)
		cs.mu.Lock()
		if err == nil {
			cs.current[secs] = l
		}
		delete(cs.granting, secs)
		close(ch)
		cs.mu.Unlock()
		return l, err
	}
}

// grantLease grants an etcd lease of secs seconds.
func (b *Backend) grantLease(ctx context.Context, secs int64) (*etcdLease, error) {
	sent := time.Now()
	resp, err := b.c.Grant(ctx, secs)
	if err != nil {
		return nil, err
	}
	return &etcdLease{id: resp.ID, secs: secs, sent: sent}, nil
}

func (l *etcdLease) isGone() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gone
}

// markGone records that etcd no longer has l.
func (l *etcdLease) markGone() {
	l.mu.Lock()
	l.gone = true
	l.mu.Unlock()
}

// all returns the agent's current TTL leases.
func (cs *classes) all() []*etcdLease {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	out := make([]*etcdLease, 0, len(cs.current))
	for _, l := range cs.current {
		out = append(out, l)
	}
	return out
}

// A waiter's ticket has an etcd lease of its own, of 4/3 of the ticket's
// life (its TTL, backend.TicketLife at most), kept alive by its attempts
// as holders' are by renewals: a waiter that stops asking leaves the queue
// when it expires, even while its agent runs on.

// ticketKey identifies a ticket of this agent.
type ticketKey struct{ name, ticket string }

// tickets holds the etcd leases of the agent's tickets.
type tickets struct {
	mu     sync.Mutex
	leases map[ticketKey]*ticketLease
	// sweepAt: adding a ticket to a map of this size first drops the
	// tickets not asked for in a while (their waiters never left).
	sweepAt int
}

type ticketLease struct {
	*etcdLease
	mode   backend.Mode
	used   time.Time // the last attempt
	create int64     // the ticket key's create revision; 0 until known
	// before is how many tickets were before it when it was last seen
	// queued; -1 until it is.
	before int
}

// minTicketSweep is the smallest map of tickets that is swept.
const minTicketSweep = 1024

// ticketLease returns the etcd lease of a ticket, or nil if it has none.
func (ts *tickets) get(k ticketKey) *etcdLease {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if t := ts.leases[k]; t != nil && !t.isGone() {
		t.used = time.Now()
		return t.etcdLease
	}
	return nil
}

// place returns what is known of a ticket's place, and whether it is
// queued as far as this agent knows.
func (ts *tickets) place(k ticketKey) (ticketLease, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.leases[k]
	if t == nil || t.create == 0 || t.isGone() {
		return ticketLease{}, false
	}
	return *t, true
}

// seen records a ticket's create revision and how many tickets are before
// it (-1: unknown).
func (ts *tickets) seen(k ticketKey, create int64, before int) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if t := ts.leases[k]; t != nil {
		t.create, t.before = create, before
	}
}

// put records the etcd lease of a ticket.
func (ts *tickets) put(k ticketKey, mode backend.Mode, l *etcdLease) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	now := time.Now()
	if len(ts.leases) >= ts.sweepAt {
		for k, t := range ts.leases {
			if now.Sub(t.used) > 2*time.Duration(t.secs)*time.Second {
				delete(ts.leases, k)
			}
		}
		ts.sweepAt = max(minTicketSweep, 2*len(ts.leases))
	}
	ts.leases[k] = &ticketLease{etcdLease: l, mode: mode, used: now, before: -1}
}

// take forgets a ticket and returns its lease, or nil.
func (ts *tickets) take(k ticketKey) *etcdLease {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.leases[k]
	delete(ts.leases, k)
	if t == nil {
		return nil
	}
	return t.etcdLease
}

// all returns every ticket lease.
func (ts *tickets) all() []*etcdLease {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	out := make([]*etcdLease, 0, len(ts.leases))
	for _, t := range ts.leases {
		out = append(out, t.etcdLease)
	}
	return out
}
