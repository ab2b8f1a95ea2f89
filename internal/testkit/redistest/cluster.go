package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockagent/lockagent/internal/testkit"
)

// clusterTimeout bounds creating a cluster and waiting for it to settle.
const clusterTimeout = 30 * time.Second

// Cluster is a Redis Cluster of primaries without replicas, owned by a test.
type Cluster struct {
	nodes []*Server
}

// StartCluster starts primaries (at least 3) cluster-enabled servers, joins
// them with `redis-cli --cluster create` (slots split evenly, no replicas)
// and waits until every node reports cluster_state:ok. Each node has its own
// cluster bus port, so no port+10000 arithmetic is involved; nodes.conf
// lives in the node's directory, so Restart brings a node back into the
// cluster.
func StartCluster(tb testing.TB, primaries int) *Cluster {
	tb.Helper()
	testkit.SkipShort(tb, "redis-server")
	if primaries < 3 {
		tb.Fatalf("redistest: a cluster needs at least 3 primaries, got %d", primaries)
	}
	c := &Cluster{}
	for range primaries {
		s := newServer(tb, Options{})
		s.cluster = true
		s.extra = []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
		}
		s.startFresh(tb)
		c.nodes = append(c.nodes, s)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		tb.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}

	for _, s := range c.nodes {
		waitFor(ctx, tb, "cluster_state:ok on "+s.Addr(), func() error {
			return clusterOK(ctx, s.Addr())
		})
	}
	return c
}

// clusterOK reports whether the node at addr sees a healthy cluster.
func clusterOK(ctx context.Context, addr string) error {
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rc.Close()
	info, err := rc.ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return fmt.Errorf("cluster info: %s", strings.Join(strings.Fields(info), " "))
	}
	return nil
}

// Addrs returns every node's host:port.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Nodes returns the cluster's servers, to kill, pause or restart one.
func (c *Cluster) Nodes() []*Server {
	return append([]*Server(nil), c.nodes...)
}

// Client returns a cluster client seeded with every node, closed at the
// test's cleanup. Like Server.Client, it honours context deadlines.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// waitFor polls cond until it returns nil, failing the test with its last
// error when ctx ends.
func waitFor(ctx context.Context, tb testing.TB, what string, cond func() error) {
	tb.Helper()
	t := time.NewTicker(pollInterval * 5)
	defer t.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("redistest: waiting for %s: %v (last error: %v)", what, ctx.Err(), err)
		case <-t.C:
		}
	}
}
