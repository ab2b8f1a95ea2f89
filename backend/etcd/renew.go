package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockagent/lockagent/backend"
)

// errLost marks, inside Renew, a lease found gone; the answer says whether
// another lease took its name.
var errLost = errors.New("lost")

// slowRenewals bounds the renewals of a batch that go one by one at once.
const slowRenewals = 16

// Renew extends a batch. The holders this agent granted, renewed with the
// TTL they have, go by their etcd lease: one keep-alive per TTL, and one
// read of the lease's markers (a break by another agent leaves one), both
// at once. A holder granted elsewhere (before a restart of the backend),
// or renewed with another TTL, is read and moved to its TTL's etcd lease.
// A lease found gone is read again, to tell whether another lease took
// its name.
func (b *Backend) Renew(ctx context.Context, reqs []backend.RenewRequest) []error {
	errs := make([]error, len(reqs))
	if len(reqs) == 0 {
		return errs
	}
	if err := b.begin(ctx); err != nil {
		for i, r := range reqs {
			errs[i] = fmt.Errorf("etcd: renew %q: %w", r.Name, err)
		}
		return errs
	}
	start := time.Now()
	ctx, cancel := b.bound(ctx, time.Time{})
	defer cancel()
	b.flushPending(ctx)

	byLease := map[*etcdLease][]int{}
	var slow []int
	b.mu.Lock()
	for i, r := range reqs {
		h := b.held[heldKey{r.Name, r.LeaseID}]
		if h != nil && h.mode == r.Mode && h.lease.secs == leaseSecs(r.TTL) {
			byLease[h.lease] = append(byLease[h.lease], i)
		} else {
			slow = append(slow, i)
		}
	}
	b.mu.Unlock()

	var wg sync.WaitGroup
	for l, idx := range byLease {
		wg.Go(func() { b.renewOn(ctx, l, start, reqs, idx, errs) })
	}
	sem := make(chan struct{}, slowRenewals)
	for _, i := range slow {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = b.renewOne(ctx, reqs[i], start)
		})
	}
	wg.Wait()
	b.tellLost(ctx, reqs, errs)
	return errs
}

// renewOn renews the holders idx of reqs, all on etcd lease l.
func (b *Backend) renewOn(ctx context.Context, l *etcdLease, start time.Time, reqs []backend.RenewRequest, idx []int, errs []error) {
	var kaErr, markErr error
	var marks map[heldKey]string
	done := make(chan struct{})
	go func() {
		defer close(done)
		marks, markErr = b.markers(ctx, l)
	}()
	var ttl time.Duration
	for _, i := range idx {
		ttl = max(ttl, reqs[i].TTL)
	}
	kaErr = b.refresh(ctx, l, start.Add(ttl))
	<-done
	for _, i := range idx {
		r := reqs[i]
		hk := heldKey{r.Name, r.LeaseID}
		switch _, broken := marks[hk]; {
		case leaseGone(kaErr):
			b.forget(hk)
			errs[i] = errLost
		case kaErr != nil:
			errs[i] = b.fail("renew", r.Name, kaErr)
		case markErr != nil:
			errs[i] = b.fail("renew", r.Name, markErr)
		case broken:
			b.forget(hk)
			errs[i] = errLost
		default:
			errs[i] = nil
		}
	}
	if len(marks) > 0 && kaErr == nil {
		ops := make([]clientv3.Op, 0, len(marks))
		for _, key := range marks {
			ops = append(ops, clientv3.OpDelete(key))
		}
		if _, err := b.c.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.log.Debug("deleting break markers", "error", err)
		}
	}
}

// markers reads the markers of etcd lease l: the holders on it that
// another agent broke, by grant, with their marker's key.
func (b *Backend) markers(ctx context.Context, l *etcdLease) (map[heldKey]string, error) {
	dir := b.markerDir(l.id)
	resp, err := b.c.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	b.seen(resp.Header.Revision)
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	marks := map[heldKey]string{}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		name, id, ok := strings.Cut(strings.TrimPrefix(key, dir), "/")
		if ok {
			marks[heldKey{unescape(name), id}] = key
		}
	}
	return marks, nil
}

// renewOne renews a holder by reading it: it is renewed if it is there,
// in its mode; it moves to the etcd lease of its TTL.
func (b *Backend) renewOne(ctx context.Context, r backend.RenewRequest, start time.Time) error {
	k := b.keys(r.Name)
	for range 2 {
		h, err := b.readHolder(ctx, k, r.LeaseKey)
		if err != nil {
			return b.fail("renew", r.Name, err)
		}
		if h == nil {
			return errLost
		}
		key := h.key
		l, err := b.classLease(ctx, r.TTL)
		if err != nil {
			return b.fail("renew", r.Name, err)
		}
		if h.lease == l.id {
			if err := b.refresh(ctx, l, start.Add(r.TTL)); err != nil {
				if leaseGone(err) {
					continue
				}
				return b.fail("renew", r.Name, err)
			}
		} else {
			v := h.v
			v.TTL = r.TTL.Milliseconds()
			ka := make(chan error, 1)
			go func() { ka <- b.refresh(ctx, l, start.Add(r.TTL)) }()
			tr, err := b.c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", h.mod)).
				Then(clientv3.OpPut(key, encode(v), clientv3.WithLease(l.id))).Commit()
			kaErr := <-ka
			switch {
			case err != nil && leaseGone(err):
				l.markGone()
				continue
			case err != nil:
				return b.fail("renew", r.Name, err)
			case !tr.Succeeded:
				continue
			case kaErr != nil:
				return b.fail("renew", r.Name, kaErr)
			}
		}
		b.mu.Lock()
		b.held[heldKey{r.Name, r.LeaseID}] = &heldLease{key: key, mode: r.Mode, create: h.create, lease: l}
		b.mu.Unlock()
		return nil
	}
	return b.fail("renew", r.Name, errors.New("the holder key changed while it was renewed"))
}

// tellLost replaces every errLost of errs by ErrTakenOver when another
// lease holds the name in a conflicting mode now, else by ErrNotHeld.
func (b *Backend) tellLost(ctx context.Context, reqs []backend.RenewRequest, errs []error) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, slowRenewals)
	for i, err := range errs {
		if err != errLost {
			continue
		}
		r := reqs[i]
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = fmt.Errorf("etcd: renew %q: %w", r.Name, backend.ErrNotHeld)
			if st, err := b.read(ctx, b.keys(r.Name)); err == nil && st.conflicting(r.LeaseID, r.Mode) {
				errs[i] = fmt.Errorf("etcd: renew %q: %w", r.Name, backend.ErrTakenOver)
			}
		})
	}
	wg.Wait()
}
