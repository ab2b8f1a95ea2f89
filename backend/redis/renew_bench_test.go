package redis_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// BenchmarkRenew renews a batch of 1,000 held exclusive leases per op, the
// backend's share of an agent's steady renewal load. For profiles of the
// renewal path:
//
//	go test ./backend/redis -run '^$' -bench Renew -cpuprofile cpu.out -memprofile mem.out
func BenchmarkRenew(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	ctx := context.Background()
	be := open(b, newClient(srv.Addr()), "bench")
	defer be.Close()
	const batch = 1000
	reqs := make([]backend.RenewRequest, batch)
	for i := range reqs {
		l := backend.LeaseKey{Name: fmt.Sprintf("bench/held/%d", i), LeaseID: fmt.Sprintf("lease-%d", i)}
		if _, err := be.Acquire(ctx, backend.AcquireRequest{Name: l.Name, LeaseID: l.LeaseID, TTL: time.Minute, Deadline: time.Now().Add(10 * time.Second)}); err != nil {
			b.Fatal(err)
		}
		reqs[i] = backend.RenewRequest{LeaseKey: l, TTL: time.Minute}
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, err := range be.Renew(ctx, reqs) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}
