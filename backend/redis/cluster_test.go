package redis

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// hungCluster is a three-primary Cluster whose first primary is paused
// (SIGSTOP: connections stay open, nothing is answered) until the test
// ends, and a backend on it with names on each primary.
type hungCluster struct {
	b       *Backend
	hung    []string // names on the paused primary
	healthy []string // names on the two others
}

// startHungCluster starts the cluster and finds n names on the first
// primary and n on the others. The other primaries are told to wait a
// minute before they take a silent primary for failed, so that they keep
// serving for the test's length.
func startHungCluster(t *testing.T, n int) *hungCluster {
	cl := redistest.StartCluster(t, 3)
	ctx := t.Context()
	for _, s := range cl.Nodes() {
		require.NoError(t, s.Client(t).ConfigSet(ctx, "cluster-node-timeout", "60000").Err())
	}
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	b, err := Open(ctx, Options{Client: cc, KeyPrefix: "hung"})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	paused := cl.Nodes()[0]
	h := &hungCluster{b: b}
	for i := 0; len(h.hung) < n || len(h.healthy) < n; i++ {
		name := fmt.Sprintf("n%d", i)
		node, err := cc.MasterForKey(ctx, b.holderKey(name))
		require.NoError(t, err)
		if node.Options().Addr == paused.Addr() {
			if len(h.hung) < n {
				h.hung = append(h.hung, name)
			}
		} else if len(h.healthy) < n {
			h.healthy = append(h.healthy, name)
		}
	}
	paused.Pause()
	t.Cleanup(paused.Resume)
	return h
}

// TestClusterRenewalsOfAHungPrimary: while one primary hangs, the
// renewals of the leases on the others succeed, those placed after a
// whole chunk of the hung primary's and the shared ones (which take a
// second round trip) included; only the hung primary's fail.
func TestClusterRenewalsOfAHungPrimary(t *testing.T) {
	h := startHungCluster(t, renewChunk)
	ctx := t.Context()
	// Part tells the primaries apart, for the agent to send their
	// renewals apart.
	hungPart := h.b.Part(h.hung[0])
	require.NotEmpty(t, hungPart)
	for _, name := range h.hung[:10] {
		require.Equal(t, hungPart, h.b.Part(name), name)
	}
	for _, name := range h.healthy[:10] {
		require.NotEqual(t, hungPart, h.b.Part(name), name)
	}
	var reqs []backend.RenewRequest
	for _, name := range h.hung {
		reqs = append(reqs, backend.RenewRequest{LeaseKey: backend.LeaseKey{Name: name, LeaseID: "l-" + name}, TTL: 10 * time.Second})
	}
	for i, name := range h.healthy[:20] {
		mode := backend.Exclusive
		if i%2 == 1 {
			mode = backend.Shared
		}
		req := backend.AcquireRequest{Name: name, LeaseID: "l-" + name, Mode: mode, Limit: 2, TTL: 10 * time.Second}
		_, err := h.b.Acquire(ctx, req)
		require.NoError(t, err, name)
		reqs = append(reqs, backend.RenewRequest{LeaseKey: backend.LeaseKey{Name: name, LeaseID: req.LeaseID, Mode: mode}, TTL: req.TTL})
	}

	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	errs := h.b.Renew(rctx, reqs)
	require.Len(t, errs, len(reqs))
	for i, r := range reqs {
		if i < len(h.hung) {
			require.ErrorIs(t, errs[i], backend.ErrUnavailable, "%s is on the hung primary", r.Name)
			continue
		}
		assert.NoError(t, errs[i], "%s (%v) is on a healthy primary", r.Name, r.Mode)
	}
}

// TestClusterCallsOfAHungPrimary: calls to a hung primary fill as many
// calls in flight as go out at once, and more gather behind them; a call
// to another primary still goes out at once.
func TestClusterCallsOfAHungPrimary(t *testing.T) {
	h := startHungCluster(t, 2*maxInFlight)
	ctx := t.Context()
	var wg sync.WaitGroup
	defer wg.Wait()
	stuck := time.Now().Add(5 * time.Second)
	for i, name := range h.hung {
		wg.Go(func() {
			_, err := h.b.Acquire(ctx, backend.AcquireRequest{Name: name, LeaseID: fmt.Sprint("s", i), TTL: 10 * time.Second, Deadline: stuck})
			assert.ErrorIs(t, err, backend.ErrUnavailable, "an acquire on the hung primary")
		})
	}
	hungBatcher := h.b.nodes.of(ctx, h.b.holderKey(h.hung[0]))
	require.Eventually(t, func() bool {
		hungBatcher.mu.Lock()
		defer hungBatcher.mu.Unlock()
		return hungBatcher.inFlight == maxInFlight && len(hungBatcher.queue) == len(h.hung)-maxInFlight
	}, 10*time.Second, time.Millisecond, "the hung primary's calls are in flight and gathered")

	for _, name := range h.healthy[:3] {
		start := time.Now()
		g, err := h.b.Acquire(ctx, backend.AcquireRequest{Name: name, LeaseID: "ok", TTL: 10 * time.Second, Deadline: time.Now().Add(2 * time.Second)})
		require.NoError(t, err, "%s is on a healthy primary", name)
		assert.NotZero(t, g.Token)
		require.NoError(t, h.b.Release(ctx, backend.LeaseKey{Name: name, LeaseID: "ok"}))
		t.Logf("%s: acquired and released in %v", name, time.Since(start))
	}
	assert.True(t, time.Now().Before(stuck), "the healthy primaries' calls did not wait for the hung one's")
}
