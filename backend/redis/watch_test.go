package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/testkit/faultproxy"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// startWatches starts a Redis, a fault proxy before it, and the watches
// of a client through the proxy, whose subscription connection is up (a
// watch of another channel) before the test changes the link.
func startWatches(t *testing.T) (*redistest.Server, *faultproxy.Proxy, *watches) {
	srv := redistest.Start(t, redistest.Options{})
	px := faultproxy.New(t, srv.Addr())
	c := goredis.NewClient(&goredis.Options{Addr: px.Addr()})
	t.Cleanup(func() { c.Close() })
	w := newWatches(c, hclog.NewNullLogger())
	t.Cleanup(w.close)
	_, stopWarm, err := w.watch(context.Background(), "warm", "t0")
	require.NoError(t, err)
	stopWarm()
	return srv, px, w
}

// TestWatchAfterAnAbandonedOne: a watch given up before Redis confirmed
// its SUBSCRIBE, then a new watch of the channel, over a link of 500 ms
// each way. The confirmation of the first SUBSCRIBE must not pass for the
// second's: the first is not ended (no UNSUBSCRIBE) while unconfirmed, and
// the second shares it; otherwise the second watch returned while Redis
// had the channel unsubscribed (from the UNSUBSCRIBE to the second
// SUBSCRIBE), and a release published then never reached it. At 500 ms
// each way (times at Redis): SUBSCRIBE at 0.5 s; the first watch gives up
// at 0.6 s; the second starts at 0.9 s and returns when the first
// confirmation comes back, at 1 s; the release is published at 1.25 s,
// which fell between an UNSUBSCRIBE at 1.1 s and a SUBSCRIBE at 1.4 s.
func TestWatchAfterAnAbandonedOne(t *testing.T) {
	srv, px, w := startWatches(t)
	direct := srv.Client(t)
	const channel = "wa:lk:{n}:c"
	px.Delay(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	_, _, err := w.watch(ctx, channel, "t1")
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "given up before the confirmation")

	time.Sleep(300 * time.Millisecond) // the race's timing, see above
	ch, stop, err := w.watch(context.Background(), channel, "t2")
	require.NoError(t, err)
	defer stop()
	time.Sleep(250 * time.Millisecond) // the race's timing, see above
	receivers, err := direct.Publish(context.Background(), channel, "*").Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, receivers, "Redis had the channel subscribed once the watch had returned")
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("the release published after the watch returned never reached it")
	}
}

// TestWatchesDuringAHungReconnect: while go-redis redials a subscription
// connection that hangs (the link black-holed after a reset), its lock is
// held and ignores deadlines. Watches of new channels must still return
// by their own deadline: they must not wait, one behind the other, for a
// SUBSCRIBE stuck behind that lock. Once the link heals, a new watch gets
// its notification.
func TestWatchesDuringAHungReconnect(t *testing.T) {
	srv, px, w := startWatches(t)
	dialed := px.Conns()
	px.Blackhole()
	px.ResetAll()
	require.Eventually(t, func() bool { return px.Conns() > dialed }, 10*time.Second, time.Millisecond,
		"go-redis redials the subscription connection")

	const n, deadline = 10, time.Second
	took := make(chan time.Duration, n)
	for i := range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			_, stop, err := w.watch(ctx, fmt.Sprintf("hr:lk:{n%d}:c", i), "t")
			if err == nil {
				stop()
			}
			took <- time.Since(start)
		}()
	}
	for range n {
		require.Less(t, <-took, deadline+500*time.Millisecond, "a watch waited past its deadline")
	}

	px.Pass()
	const channel = "hr:lk:{after}:c"
	var ch <-chan struct{}
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		got, stop, err := w.watch(ctx, channel, "t")
		if err != nil {
			return false
		}
		w.mu.Lock()
		confirmed := w.subs[channel].confirmed
		w.mu.Unlock()
		select {
		case <-confirmed:
		default:
			stop()
			return false
		}
		ch = got
		t.Cleanup(stop)
		return true
	}, 20*time.Second, 10*time.Millisecond, "a watch confirmed once the link heals")
	require.NoError(t, srv.Client(t).Publish(context.Background(), channel, "*").Err())
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("a release published after the link healed never reached the watch")
	}
}

// TestWatchConfirmedLate: a watch that returned before Redis confirmed its
// subscription (the link black-holed) is woken when the confirmation
// comes: a release published before then was not heard.
func TestWatchConfirmedLate(t *testing.T) {
	_, px, w := startWatches(t)
	px.Blackhole()
	const channel = "hr:lk:{late}:c"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, stop, err := w.watch(ctx, channel, "t")
	require.NoError(t, err, "the watch returns, unconfirmed, after confirmWait")
	defer stop()
	select {
	case <-ch:
		t.Fatal("woken before the confirmation")
	default:
	}
	px.Pass()
	select {
	case <-ch:
	case <-time.After(15 * time.Second):
		t.Fatal("the late confirmation did not wake the watch")
	}
}
