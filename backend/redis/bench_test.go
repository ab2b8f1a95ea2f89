package redis_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// BenchmarkAcquireRelease is an acquire and a release of a free name, the
// backend's share of a pair through the agent, against a real
// redis-server; with -cpu 2 and RunParallel's goroutines, concurrent
// callers share pipelines. For profiles of the backend and go-redis:
//
//	go test ./backend/redis -run '^$' -bench AcquireRelease -cpuprofile cpu.out -memprofile mem.out
func BenchmarkAcquireRelease(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	ctx := context.Background()
	be := open(b, newClient(srv.Addr()), "bench")
	defer be.Close()
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32) // 64 callers on 2 CPUs
	b.RunParallel(func(pb *testing.PB) {
		name := fmt.Sprintf("n%d", n.Add(1))
		for i := 0; pb.Next(); i++ {
			id := fmt.Sprintf("%s-%d", name, i)
			if _, err := be.Acquire(ctx, backend.AcquireRequest{Name: name, LeaseID: id, TTL: 15 * time.Second, Deadline: time.Now().Add(10 * time.Second)}); err != nil {
				b.Error(err)
				return
			}
			if err := be.Release(ctx, backend.LeaseKey{Name: name, LeaseID: id}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkPairLatency is one caller's acquire and release of a free name,
// against two PINGs of the same client in the same run: what the backend
// adds to the round trips, as a ratio (p50-ratio).
func BenchmarkPairLatency(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	ctx := context.Background()
	c := newClient(srv.Addr())
	be := open(b, c, "bench")
	defer be.Close()
	pings := make([]time.Duration, 0, b.N)
	pairs := make([]time.Duration, 0, b.N)
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		c.Ping(ctx)
		c.Ping(ctx)
		t1 := time.Now()
		id := fmt.Sprintf("l%d", i)
		if _, err := be.Acquire(ctx, backend.AcquireRequest{Name: "pair", LeaseID: id, TTL: 15 * time.Second, Deadline: time.Now().Add(10 * time.Second)}); err != nil {
			b.Fatal(err)
		}
		if err := be.Release(ctx, backend.LeaseKey{Name: "pair", LeaseID: id}); err != nil {
			b.Fatal(err)
		}
		pings, pairs = append(pings, t1.Sub(t0)), append(pairs, time.Since(t1))
	}
	p50 := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Nanoseconds()) / 1000
	}
	ping, pair := p50(pings), p50(pairs)
	b.ReportMetric(ping, "2ping-p50-µs")
	b.ReportMetric(pair, "pair-p50-µs")
	b.ReportMetric(pair/ping, "p50-ratio")
}
