package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// result is one measured workload: the latency of one operation (an
// acquire+release pair, or a round trip for the floors) and how many
// completed per second across every worker.
type result struct {
	p50, p99 time.Duration
	perSec   float64
	// CPU time of the agents and of Redis per operation, in µs.
	agentCPU, redisCPU float64
	// switches is the context switches of the servers (the agents, the
	// echo process and redis-server) per operation.
	switches float64
}

// worker is one session or goroutine of a workload; op does one operation.
type worker struct {
	op    func() error
	close func()
}

// measure runs n operations spread over workers, after a warm-up of a
// tenth as many, and times each one.
func measure(workers, n int, newWorker func(i int) (worker, error)) (result, error) {
	ws := make([]worker, workers)
	for i := range ws {
		w, err := newWorker(i)
		if err != nil {
			for _, w := range ws[:i] {
				w.close()
			}
			return result{}, err
		}
		ws[i] = w
	}
	defer func() {
		for _, w := range ws {
			w.close()
		}
	}()
	run := func(total int, lat []time.Duration) (time.Duration, error) {
		per := total / workers
		var wg sync.WaitGroup
		errs := make([]error, workers)
		start := time.Now()
		for i, w := range ws {
			wg.Go(func() {
				for j := range per {
					t := time.Now()
					if err := w.op(); err != nil {
						errs[i] = err
						return
					}
					if lat != nil {
						lat[i*per+j] = time.Since(t)
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start), errors.Join(errs...)
	}
	if _, err := run(max(n/10, workers), nil); err != nil {
		return result{}, err
	}
	n = n / workers * workers
	lat := make([]time.Duration, n)
	elapsed, err := run(n, lat)
	if err != nil {
		return result{}, err
	}
	slices.Sort(lat)
	return result{
		p50:    lat[len(lat)/2],
		p99:    lat[len(lat)*99/100],
		perSec: float64(n) / elapsed.Seconds(),
	}, nil
}

// agentPairs acquires and releases a name of the worker's own through the
// agent at socket: two round trips, one session per worker.
func agentPairs(socket string, workers, n int) (result, error) {
	return measure(workers, n, func(i int) (worker, error) {
		c, err := dialLine(socket)
		if err != nil {
			return worker{}, err
		}
		line := fmt.Appendf(nil, `{"id":1,"op":"acquire","name":"bench/pair/%d","ttl_ms":15000}`+"\n", i)
		return worker{
			op: func() error {
				lease, err := c.acquire(line)
				if err != nil {
					return err
				}
				return c.release(lease)
			},
			close: func() { c.close() },
		}, nil
	})
}

// echoRoundTrips measures single round trips to the echo server.
func echoRoundTrips(socket string, workers, n int) (result, error) {
	line := []byte(`{"id":1,"op":"acquire","name":"bench/pair/0","ttl_ms":15000}` + "\n")
	return measure(workers, n, func(int) (worker, error) {
		c, err := dialLine(socket)
		if err != nil {
			return worker{}, err
		}
		return worker{
			op:    func() error { _, err := c.roundTrip(line); return err },
			close: func() { c.close() },
		}, nil
	})
}

// pingRoundTrips measures Redis PING round trips from workers goroutines
// sharing one go-redis client.
func pingRoundTrips(rc *redis.Client, workers, n int) (result, error) {
	ctx := context.Background()
	return measure(workers, n, func(int) (worker, error) {
		return worker{op: func() error { return rc.Ping(ctx).Err() }, close: func() {}}, nil
	})
}

// redislockPairs obtains and releases a key of the goroutine's own with
// github.com/bsm/redislock, as an application using it directly does.
func redislockPairs(rc *redis.Client, workers, n int) (result, error) {
	ctx := context.Background()
	locker := redislock.New(rc)
	return measure(workers, n, func(i int) (worker, error) {
		key := fmt.Sprintf("bench:redislock:%d", i)
		return worker{
			op: func() error {
				l, err := locker.Obtain(ctx, key, 15*time.Second, nil)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			},
			close: func() {},
		}, nil
	})
}

// redsyncPairs locks and unlocks a mutex of the goroutine's own with
// github.com/go-redsync/redsync/v4 over one Redis server.
func redsyncPairs(rc *redis.Client, workers, n int) (result, error) {
	rs := redsync.New(goredis.NewPool(rc))
	return measure(workers, n, func(i int) (worker, error) {
		m := rs.NewMutex(fmt.Sprintf("bench:redsync:%d", i), redsync.WithExpiry(15*time.Second), redsync.WithTries(1))
		return worker{
			op: func() error {
				if err := m.Lock(); err != nil {
					return err
				}
				ok, err := m.Unlock()
				if err == nil && !ok {
					err = errors.New("redsync: unlock failed")
				}
				return err
			},
			close: func() {},
		}, nil
	})
}
