package etcd

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockagent/lockagent/backend"
)

// confirmWait bounds how long Watch waits for its etcd watch to be in
// place. Past it the watch still works once it is; until then the
// caller's poll is the backstop.
const confirmWait = 2 * time.Second

// resyncPause is how long a watch whose etcd watch failed waits before it
// reads the name again and watches anew.
const resyncPause = 100 * time.Millisecond

// watches gives each name that this agent's waiters wait for one etcd
// watch of the name's holders and tickets, shared by its waiters. The
// watch follows the name's queue, so that a release wakes only the
// waiters at its head, and so does a change of the head (a waiter that
// leaves, or whose ticket expires).
type watches struct {
	b      *Backend
	ctx    context.Context // ends every watch
	cancel context.CancelFunc
	wg     sync.WaitGroup // one goroutine per name watched

	mu     sync.Mutex // guards the fields below, and every nameWatch's watchers
	names  map[string]*nameWatch
	closed bool
}

// nameWatch is the etcd watch of one name.
type nameWatch struct {
	name     string
	stop     context.CancelFunc
	ready    chan struct{}            // closed once the etcd watch is in place
	watchers map[chan struct{}]string // each watcher's ticket
}

func newWatches(b *Backend) *watches {
	ctx, cancel := context.WithCancel(context.Background())
	return &watches{b: b, ctx: ctx, cancel: cancel, names: map[string]*nameWatch{}}
}

// watch adds a watcher of name for ticket, and waits, a bounded time,
// until the name's etcd watch is in place.
func (w *watches) watch(ctx context.Context, name, ticket string) (<-chan struct{}, func(), error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil, nil, backend.ErrClosed
	}
	nw := w.names[name]
	if nw == nil {
		wctx, stop := context.WithCancel(w.ctx)
		nw = &nameWatch{name: name, stop: stop, ready: make(chan struct{}), watchers: map[chan struct{}]string{}}
		w.names[name] = nw
		w.wg.Go(func() { w.run(wctx, nw) })
	}
	c := make(chan struct{}, 1)
	nw.watchers[c] = ticket
	w.mu.Unlock()

	stop := sync.OnceFunc(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(nw.watchers, c)
		if len(nw.watchers) == 0 && w.names[name] == nw {
			delete(w.names, name)
			nw.stop()
		}
	})
	t := time.NewTimer(confirmWait)
	defer t.Stop()
	select {
	case <-nw.ready:
	case <-t.C:
		// Not in place yet: the caller asks, and polls; events since
		// the name was read are not missed (see run).
	case <-ctx.Done():
		stop()
		return nil, nil, ctx.Err()
	}
	return c, stop, nil
}

// run follows a name until ctx ends: it reads the name's holders and
// tickets, then watches them from the next revision on, so that no
// change after the read is missed; when the watch fails (the member went
// away, etcd compacted the revisions), it does so again, and wakes every
// watcher, since a change may have been missed meanwhile.
func (w *watches) run(ctx context.Context, nw *nameWatch) {
	k := w.b.keys(nw.name)
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			w.wake(nw, nil, true)
			select {
			case <-time.After(resyncPause):
			case <-ctx.Done():
				return
			}
		}
		rctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), w.b.timeout)
		resp, err := w.b.c.Get(rctx, k.lock, clientv3.WithPrefix())
		cancel()
		if err != nil {
			continue
		}
		queue := map[string]ticket{}
		for _, kv := range resp.Kvs {
			if t, ok := k.parseTicket(kv); ok {
				queue[t.id] = t
			}
		}
		wch := w.b.c.Watch(clientv3.WithRequireLeader(ctx), k.lock, clientv3.WithPrefix(),
			clientv3.WithRev(resp.Header.Revision+1), clientv3.WithCreatedNotify())
		w.follow(nw, k, wch, queue)
	}
}

// follow delivers the events of an etcd watch until it ends.
func (w *watches) follow(nw *nameWatch, k keys, wch clientv3.WatchChan, queue map[string]ticket) {
	head := headOf(queue)
	for resp := range wch {
		if resp.Created {
			w.mu.Lock()
			select {
			case <-nw.ready:
			default:
				close(nw.ready)
			}
			w.mu.Unlock()
		}
		if resp.Err() != nil || resp.Canceled {
			return
		}
		released := false
		for _, ev := range resp.Events {
			key := string(ev.Kv.Key)
			switch {
			case strings.HasPrefix(key, k.holders()):
				released = released || ev.Type == clientv3.EventTypeDelete
			case strings.HasPrefix(key, k.queue()) && ev.Type == clientv3.EventTypeDelete:
				if rest := strings.TrimPrefix(key, k.queue()); len(rest) > 2 {
					delete(queue, rest[2:])
				}
			default:
				if t, ok := k.parseTicket(ev.Kv); ok {
					queue[t.id] = t
				}
			}
		}
		now := headOf(queue)
		if released || !slices.Equal(now, head) {
			w.wake(nw, now, false)
		}
		head = now
	}
}

// headOf is the tickets at the head of a queue (see state.head).
func headOf(queue map[string]ticket) []string {
	st := state{}
	for _, t := range queue {
		st.queue = append(st.queue, t)
	}
	slices.SortFunc(st.queue, func(a, b ticket) int { return int(a.create - b.create) })
	var ids []string
	for _, t := range st.head() {
		ids = append(ids, t.id)
	}
	return ids
}

// wake tells the watchers that may ask now: those without a ticket, those
// whose ticket is at the head, and, when nobody queues or all is true,
// every one.
func (w *watches) wake(nw *nameWatch, head []string, all bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for c, t := range nw.watchers {
		if !all && t != "" && len(head) > 0 && !slices.Contains(head, t) {
			continue
		}
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// close ends every watch and waits for their goroutines.
func (w *watches) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.cancel()
	w.wg.Wait()
}
