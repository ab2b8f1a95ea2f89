package redis_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/backend/redis"
	"github.com/lockagent/lockagent/internal/redistest"
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
	be, err := redis.Open(ctx, redis.Options{Client: newClient(srv.Addr()), KeyPrefix: "bench"})
	if err != nil {
		b.Fatal(err)
	}
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
			if err := be.Release(ctx, backend.Lease{Name: name, LeaseID: id}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
