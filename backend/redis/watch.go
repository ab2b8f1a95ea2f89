package redis

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	goredis "github.com/redis/go-redis/v9"

	"github.com/lockagent/lockagent/backend"
)

// confirmWait bounds how long Watch waits for Redis to confirm a
// subscription, and how long the sender waits to send one change. Past it
// the watch still works once confirmed; until then the caller's poll is
// the backstop.
const confirmWait = 2 * time.Second

// watches multiplexes every Watch of an agent onto one subscription
// connection, with a reference count per channel.
//
// One goroutine, the sender, sends the SUBSCRIBE and UNSUBSCRIBE commands,
// in the order the changes were made: go-redis holds the subscription's
// lock while it redials a dead connection, whatever the deadlines, so a
// watch or the dispatcher that sent them itself, with w.mu held, would
// wait as long, and every other watch behind it.
type watches struct {
	ps   *goredis.PubSub
	log  hclog.Logger
	done chan struct{} // closed when the dispatcher and the sender have returned

	mu      sync.Mutex
	subs    map[string]*subscription
	changes []change      // not yet sent, in order
	kick    chan struct{} // tells the sender that changes wait
	closed  bool
}

// change is a SUBSCRIBE (sub) or an UNSUBSCRIBE of one channel.
type change struct {
	sub     bool
	channel string
}

type subscription struct {
	confirmed chan struct{} // closed when Redis confirms the SUBSCRIBE
	isConfirm bool
	late      bool                     // a watch returned before the confirmation (see watch)
	watchers  map[chan struct{}]string // each watcher's ticket
}

func newWatches(c goredis.UniversalClient, log hclog.Logger) *watches {
	w := &watches{
		ps:   c.Subscribe(context.Background()),
		log:  log,
		done: make(chan struct{}),
		subs: make(map[string]*subscription),
		kick: make(chan struct{}, 1),
	}
	// The health check pings the subscription connection: a dead one is
	// replaced, and the channels subscribed again.
	ch := w.ps.ChannelWithSubscriptions(goredis.WithChannelHealthCheckInterval(10*time.Second), goredis.WithChannelSize(1000))
	var wg sync.WaitGroup
	wg.Go(func() { w.dispatch(ch) })
	wg.Go(w.send)
	go func() {
		wg.Wait()
		close(w.done)
	}()
	return w
}

// send sends the subscription changes, in order, until w is closed: a
// run of changes of one kind goes as one command.
func (w *watches) send() {
	for range w.kick {
		w.mu.Lock()
		changes := w.changes
		w.changes = nil
		closed := w.closed
		w.mu.Unlock()
		if closed {
			return
		}
		for len(changes) > 0 {
			n := 1
			for n < len(changes) && changes[n].sub == changes[0].sub {
				n++
			}
			channels := make([]string, n)
			for i, c := range changes[:n] {
				channels[i] = c.channel
			}
			ctx, cancel := context.WithTimeout(context.Background(), confirmWait)
			var err error
			if changes[0].sub {
				err = w.ps.Subscribe(ctx, channels...)
			} else {
				err = w.ps.Unsubscribe(ctx, channels...)
			}
			cancel()
			if err != nil {
				// The connection is down: go-redis subscribes again to the
				// channels it holds (an UNSUBSCRIBE forgets its channels
				// first) when it reconnects; until then the callers poll.
				w.log.Debug("subscription change failed", "subscribe", changes[0].sub, "channels", n, "error", err)
			}
			changes = changes[n:]
		}
	}
}

// enqueue adds a subscription change for the sender. w.mu is held.
func (w *watches) enqueue(sub bool, channel string) {
	w.changes = append(w.changes, change{sub: sub, channel: channel})
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// dispatch delivers confirmations and messages until the subscription is
// closed.
func (w *watches) dispatch(ch <-chan any) {
	for m := range ch {
		w.mu.Lock()
		switch m := m.(type) {
		case *goredis.Subscription:
			s := w.subs[m.Channel]
			switch {
			case s == nil || m.Kind != "subscribe":
			case !s.isConfirm:
				s.isConfirm = true
				close(s.confirmed)
				if len(s.watchers) == 0 { // all left while it was confirmed
					w.unsubscribe(m.Channel)
				}
				if s.late {
					// Watchers that stopped waiting for it asked
					// meanwhile: a release since then was not heard.
					s.wake("*")
				}
			default:
				// Subscribed again, after go-redis replaced a dead
				// connection: a release published meanwhile was lost.
				// Every watcher asks again, rather than at its next poll.
				s.wake("*")
			}
		case *goredis.Message:
			if s := w.subs[m.Channel]; s != nil {
				s.wake(m.Payload)
			}
		}
		w.mu.Unlock()
	}
}

// wake delivers one message: "*" (nobody queues) wakes every watcher;
// otherwise the message lists the tickets that may ask now, and wakes
// them and the watchers without a ticket. w.mu is held.
func (s *subscription) wake(msg string) {
	var may map[string]bool
	if msg != "*" {
		may = map[string]bool{"": true}
		for _, t := range strings.Fields(msg) {
			may[t] = true
		}
	}
	for c, ticket := range s.watchers {
		if may != nil && !may[ticket] {
			continue
		}
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// watch adds a watcher of channel for ticket and waits, a bounded time,
// for the subscription to be confirmed.
func (w *watches) watch(ctx context.Context, channel, ticket string) (<-chan struct{}, func(), error) {
	// A canceled context fails even when the subscription is already
	// confirmed: select would otherwise pick either ready case at random.
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil, nil, backend.ErrClosed
	}
	c := make(chan struct{}, 1)
	s := w.subs[channel]
	if s == nil {
		s = &subscription{confirmed: make(chan struct{}), watchers: make(map[chan struct{}]string)}
		w.subs[channel] = s
		w.enqueue(true, channel)
	}
	s.watchers[c] = ticket
	w.mu.Unlock()

	stop := sync.OnceFunc(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(s.watchers, c)
		if len(s.watchers) > 0 || w.subs[channel] != s {
			return
		}
		if s.isConfirm {
			w.unsubscribe(channel)
			return
		}
		// A subscription not yet confirmed stays until it is (dispatch
		// then ends it if nobody watches): its confirmation must not be
		// taken for that of a later SUBSCRIBE of the channel. One that
		// Redis never confirms (a SUBSCRIBE refused) goes after a while.
		time.AfterFunc(2*confirmWait, func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.subs[channel] == s && len(s.watchers) == 0 && !s.isConfirm {
				w.unsubscribe(channel)
			}
		})
	})
	t := time.NewTimer(confirmWait)
	defer t.Stop()
	select {
	case <-s.confirmed:
	case <-t.C:
		// Unconfirmed: the caller asks, and polls; the confirmation,
		// when it comes, wakes it (see dispatch).
		w.mu.Lock()
		s.late = true
		w.mu.Unlock()
	case <-ctx.Done():
		stop()
		return nil, nil, ctx.Err()
	}
	return c, stop, nil
}

// unsubscribe ends the subscription of channel. w.mu is held.
func (w *watches) unsubscribe(channel string) {
	delete(w.subs, channel)
	if !w.closed {
		w.enqueue(false, channel)
	}
}

func (w *watches) close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.kick)
	}
	w.mu.Unlock()
	w.ps.Close()
	<-w.done
}
