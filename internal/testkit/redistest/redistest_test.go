package redistest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestStartPing(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Options{})
	c := s.Client(t)
	require.NoError(t, c.Ping(ctx(t)).Err())
	assert.NotZero(t, s.PID())

	// No persistence by default.
	cfg, err := c.ConfigGet(ctx(t), "*").Result()
	require.NoError(t, err)
	assert.Equal(t, "", cfg["save"])
	assert.Equal(t, "no", cfg["appendonly"])
	assert.Equal(t, "local", cfg["enable-debug-command"])
}

func TestRestartKeepsPort(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Options{})
	addr, pid := s.Addr(), s.PID()
	c := s.Client(t)
	require.NoError(t, c.Set(ctx(t), "k", "v", 0).Err())

	s.Kill()
	assert.Zero(t, s.PID())
	s.Restart(t)
	assert.Equal(t, addr, s.Addr())
	assert.NotEqual(t, pid, s.PID())
	// The same client reconnects; without persistence the key is gone.
	assert.ErrorIs(t, c.Get(ctx(t), "k").Err(), redis.Nil)
}

func TestPersistenceSurvivesKill(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Options{Persistence: true})
	c := s.Client(t)
	require.NoError(t, c.Set(ctx(t), "k", "v", 0).Err())
	s.Kill()
	s.Restart(t)
	v, err := c.Get(ctx(t), "k").Result()
	require.NoError(t, err)
	assert.Equal(t, "v", v)
	s.Stop()
	assert.Zero(t, s.PID())
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Options{})
	c := s.Client(t)
	require.NoError(t, c.Ping(ctx(t)).Err())

	s.Pause()
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Ping(short).Err()
	require.Error(t, err)
	assert.Less(t, time.Since(start), time.Second)
	assert.True(t, errors.Is(err, context.DeadlineExceeded) || isTimeout(err), "%v", err)

	s.Resume()
	require.NoError(t, c.Ping(ctx(t)).Err())
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// TestFaketimeExpiresEarly checks that faketime reaches redis-server: a
// PX 1000 key expires after about 200 ms of wall time at x5, while the same
// key on a normal server is still there.
func TestFaketimeExpiresEarly(t *testing.T) {
	t.Parallel()
	fast := redistest.Start(t, redistest.Options{Faketime: "+0 x5"}).Client(t)
	normal := redistest.Start(t, redistest.Options{}).Client(t)

	start := time.Now()
	require.NoError(t, fast.Set(ctx(t), "k", "v", time.Second).Err())
	require.NoError(t, normal.Set(ctx(t), "k", "v", time.Second).Err())
	require.Eventually(t, func() bool {
		return fast.Exists(ctx(t), "k").Val() == 0
	}, 2*time.Second, 5*time.Millisecond)
	elapsed := time.Since(start)
	assert.Less(t, elapsed, 600*time.Millisecond)
	assert.Greater(t, elapsed, 100*time.Millisecond)
	assert.EqualValues(t, 1, normal.Exists(ctx(t), "k").Val(), "the normal server's key expired too: elapsed %v", elapsed)
}

func TestClusterAcceptsKeysInDifferentSlots(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	require.Len(t, cl.Addrs(), 3)
	c := cl.Client(t)
	const n = 30
	for i := range n {
		require.NoError(t, c.Set(ctx(t), fmt.Sprintf("key%d", i), i, 0).Err())
	}
	for i := range n {
		v, err := c.Get(ctx(t), fmt.Sprintf("key%d", i)).Int()
		require.NoError(t, err)
		assert.Equal(t, i, v)
	}
	// The keys landed on every primary, not just one.
	for _, node := range cl.Nodes() {
		size, err := node.Client(t).DBSize(ctx(t)).Result()
		require.NoError(t, err)
		assert.NotZero(t, size, "node %s holds no key", node.Addr())
	}
}

func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	sn := redistest.StartSentinel(t, redistest.SentinelOptions{})
	oldPrimary, oldReplica := sn.Primary(), sn.Replica()
	assert.Equal(t, "mymaster", sn.MasterName())

	fc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    sn.MasterName(),
		SentinelAddrs: sn.SentinelAddrs(),
	})
	t.Cleanup(func() { _ = fc.Close() })
	require.NoError(t, fc.Set(ctx(t), "k", "before", 0).Err())

	sn.Failover(t)
	assert.Same(t, oldReplica, sn.Primary())
	assert.Same(t, oldPrimary, sn.Replica())

	sc := redis.NewSentinelClient(&redis.Options{Addr: sn.SentinelAddrs()[0]})
	t.Cleanup(func() { _ = sc.Close() })
	addr, err := sc.GetMasterAddrByName(ctx(t), sn.MasterName()).Result()
	require.NoError(t, err)
	assert.Equal(t, oldReplica.Addr(), addr[0]+":"+addr[1])

	// The new master has the replicated key and takes writes.
	nc := sn.Primary().Client(t)
	v, err := nc.Get(ctx(t), "k").Result()
	require.NoError(t, err)
	assert.Equal(t, "before", v)
	require.NoError(t, nc.Set(ctx(t), "k", "after", 0).Err())
}
