package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit/lockcheck"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// queuedFor is how many waiters queue for name in the backend, from
// inspect.
func queuedFor(t *testing.T, c *client.Client, name string) int {
	t.Helper()
	var r struct {
		Queued int `json:"queued"`
	}
	call(t, c, "inspect", map[string]any{"name": name}, &r)
	return r.Queued
}

// TestFairness_AcrossAgents: nine waiters on three agents queue one after
// the other, in a known order, behind a holder; when it releases they are
// granted in that order, which lockcheck.CheckFIFO confirms from the
// recorded history.
func TestFairness_AcrossAgents(t *testing.T) {
	const name, n = "fair/q", 9
	f := startFleet(t, 3, redistest.Options{}, "")
	observer := f.agents[0].client(t, "observer")
	holder := f.agents[0].client(t, "holder")
	h := mustAcquire(t, holder, name, nil)

	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	waits := make([]lockcheck.Wait, n)
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		c := f.agents[i%3].client(t, fmt.Sprintf("waiter-%d", i))
		waits[i] = lockcheck.Wait{Name: name, Client: i, Call: now(), Granted: lockcheck.Infinity}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var l lease
			if err := c.Call(ctx, "acquire", map[string]any{"name": name, "wait_ms": -1}, &l); err != nil || !l.Acquired {
				t.Errorf("waiter %d: %v %+v", i, err, l)
				return
			}
			mu.Lock()
			waits[i].Granted = now()
			order = append(order, i)
			mu.Unlock()
			if err := c.Call(ctx, "release", map[string]any{"lease": l.Lease}, nil); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		})
		eventually(t, 5*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool { return queuedFor(t, observer, name) == i+1 })
		waits[i].Queued = now()
	}
	call(t, holder, "release", map[string]any{"lease": h.Lease}, nil)
	wg.Wait()

	vs := lockcheck.CheckFIFO(waits)
	for _, v := range vs {
		t.Error(v)
	}
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8}, order, "grant order")
	require.Zero(t, queuedFor(t, observer, name), "the queue is empty")
	line := fmt.Sprintf("fairness: waiters=%d agents=3 granted in order %v violations=%d", n, order, len(vs))
	t.Log(line)
	fmt.Println(line)
}

// TestFairness_WriterBehindReaders: readers on three agents take a name
// shared, overlapping without a pause; a writer that queues gets it within
// one reader lease, because later readers queue behind it.
func TestFairness_WriterBehindReaders(t *testing.T) {
	const name = "fair/rw"
	const readerTTL = time.Second
	f := startFleet(t, 3, redistest.Options{}, "")
	stop := make(chan struct{})
	var writing atomic.Bool
	var overlaps atomic.Int64
	var wg sync.WaitGroup
	for i := range 6 {
		c := f.agents[i%3].client(t, fmt.Sprintf("reader-%d", i))
		rng := rand.New(rand.NewPCG(uint64(i), 1))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				var l lease
				err := c.Call(ctx, "acquire", map[string]any{"name": name, "mode": "shared", "wait_ms": -1, "ttl_ms": readerTTL.Milliseconds()}, &l)
				if err != nil || !l.Acquired {
					cancel()
					t.Errorf("reader %d: %v %+v", i, err, l)
					return
				}
				if writing.Load() {
					overlaps.Add(1)
				}
				time.Sleep(100*time.Millisecond + time.Duration(rng.Int64N(int64(200*time.Millisecond)))) // reading
				err = c.Call(ctx, "release", map[string]any{"lease": l.Lease}, nil)
				cancel()
				if err != nil {
					t.Errorf("reader %d release: %v", i, err)
					return
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	observer := f.agents[1].client(t, "observer")
	eventually(t, 5*time.Second, "readers hold the name", func() bool { return len(inspect(t, observer, name).Holders) >= 2 })

	w := f.agents[1].client(t, "writer")
	asked := time.Now()
	var l lease
	call(t, w, "acquire", map[string]any{"name": name, "wait_ms": readerTTL.Milliseconds()}, &l)
	waited := time.Since(asked)
	require.True(t, l.Acquired, "the writer waited a reader lease (%s) in vain: %s", readerTTL, l.Reason)
	writing.Store(true)
	require.Len(t, inspect(t, observer, name).Holders, 1, "the writer holds the name alone")
	time.Sleep(200 * time.Millisecond) // writing
	writing.Store(false)
	call(t, w, "release", map[string]any{"lease": l.Lease}, nil)
	require.Zero(t, overlaps.Load(), "a reader was granted while the writer held the name")
	line := fmt.Sprintf("fairness: a writer behind 6 readers on 3 agents waited %s (reader lease %s)", msString(waited), msString(readerTTL))
	t.Log(line)
	fmt.Println(line)
}

// TestFairness_DeadWaiterLeavesTheQueue: a waiter whose agent is killed
// leaves the queue within its lease; the waiter behind it, on another
// agent, is granted then.
func TestFairness_DeadWaiterLeavesTheQueue(t *testing.T) {
	const name = "fair/dead"
	const ttl = time.Second
	f := startFleet(t, 3, redistest.Options{}, "")
	observer := f.agents[2].client(t, "observer")
	holder := f.agents[2].client(t, "holder")
	h := mustAcquire(t, holder, name, nil)

	doomed := f.agents[0].client(t, "doomed")
	doomedDone := make(chan error, 1)
	go func() {
		// It returns when its agent dies.
		doomedDone <- doomed.Call(context.Background(), "acquire", map[string]any{"name": name, "wait_ms": -1, "ttl_ms": ttl.Milliseconds()}, nil)
	}()
	t.Cleanup(func() { <-doomedDone })
	eventually(t, 5*time.Second, "the doomed waiter queued", func() bool { return queuedFor(t, observer, name) == 1 })
	next := f.agents[1].client(t, "next")
	got := make(chan lease, 1)
	go func() {
		var l lease
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		next.Call(ctx, "acquire", map[string]any{"name": name, "wait_ms": -1}, &l)
		got <- l
	}()
	eventually(t, 5*time.Second, "the next waiter queued", func() bool { return queuedFor(t, observer, name) == 2 })
	killAgent(t, f.agents[0].proc)
	killed := time.Now()
	call(t, holder, "release", map[string]any{"lease": h.Lease}, nil)
	select {
	case l := <-got:
		require.True(t, l.Acquired)
		waited := time.Since(killed)
		require.Less(t, waited, ttl+500*time.Millisecond, "granted within the dead waiter's lease")
		t.Logf("fairness: the waiter behind a dead agent's waiter was granted %s after the kill (ttl %s)", msString(waited), msString(ttl))
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter behind the dead one was never granted")
	}
}
