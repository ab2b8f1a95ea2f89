package faultproxy_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockagent/lockagent/internal/testkit/faultproxy"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// setup starts Redis and a proxy to it, and returns a client through the
// proxy that does not retry, so each fault shows in the call that meets it.
func setup(t *testing.T) (*redistest.Server, *faultproxy.Proxy, *redis.Client) {
	t.Helper()
	s := redistest.Start(t, redistest.Options{})
	p := faultproxy.New(t, s.Addr())
	return s, p, client(t, p.Addr())
}

func client(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  addr,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &te) && te.Timeout()
}

func TestPass(t *testing.T) {
	t.Parallel()
	_, p, c := setup(t)
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())
	require.NoError(t, c.Set(ctxFor(t, 5*time.Second), "k", "v", 0).Err())
	v, err := c.Get(ctxFor(t, 5*time.Second), "k").Result()
	require.NoError(t, err)
	assert.Equal(t, "v", v)
	assert.Equal(t, 1, p.Conns())
}

func TestBlackholeTimesOutAndPassRestores(t *testing.T) {
	t.Parallel()
	s, p, c := setup(t)
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())

	p.Blackhole()
	// The pooled connection: a timeout, not a reset.
	start := time.Now()
	err := c.Set(ctxFor(t, 200*time.Millisecond), "k", "held", 0).Err()
	require.Error(t, err)
	assert.True(t, isTimeout(err), "want a timeout, got %v", err)
	assert.Less(t, time.Since(start), time.Second)
	// A new connection is accepted and then answered by nothing either.
	other := client(t, p.Addr())
	err = other.Ping(ctxFor(t, 200*time.Millisecond)).Err()
	require.Error(t, err)
	assert.True(t, isTimeout(err), "want a timeout, got %v", err)

	p.Pass()
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())
	require.NoError(t, other.Ping(ctxFor(t, 5*time.Second)).Err())
	// The SET was held, not dropped: once the path heals it reaches Redis,
	// although its client gave up on it.
	direct := s.Client(t)
	require.Eventually(t, func() bool {
		return direct.Get(ctxFor(t, time.Second), "k").Val() == "held"
	}, 5*time.Second, 10*time.Millisecond)
}

func TestDelay(t *testing.T) {
	t.Parallel()
	_, p, c := setup(t)
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())

	const d = 100 * time.Millisecond
	p.Delay(d)
	start := time.Now()
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())
	assert.GreaterOrEqual(t, time.Since(start), 2*d, "both directions are delayed")

	// Chunks stay in order.
	pipe := c.Pipeline()
	incrs := make([]*redis.IntCmd, 50)
	for i := range incrs {
		incrs[i] = pipe.Incr(ctxFor(t, 5*time.Second), "n")
	}
	_, err := pipe.Exec(ctxFor(t, 5*time.Second))
	require.NoError(t, err)
	for i, cmd := range incrs {
		assert.EqualValues(t, i+1, cmd.Val())
	}

	p.Pass()
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())
}

// TestDelayEndReleasesHeldChunks checks that leaving Delay forwards what
// it holds at once.
func TestDelayEndReleasesHeldChunks(t *testing.T) {
	t.Parallel()
	s, p, c := setup(t)
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())
	p.Delay(time.Hour)
	err := c.Set(ctxFor(t, 200*time.Millisecond), "k", "late", 0).Err()
	require.True(t, isTimeout(err), "want a timeout, got %v", err)
	p.Pass()
	direct := s.Client(t)
	require.Eventually(t, func() bool {
		return direct.Get(ctxFor(t, time.Second), "k").Val() == "late"
	}, 5*time.Second, 10*time.Millisecond)
}

func TestResetAll(t *testing.T) {
	t.Parallel()
	_, p, c := setup(t)
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())
	require.Equal(t, 1, p.Conns())

	p.ResetAll()
	// The pooled connection is dead: the next command fails, or the pool
	// noticed and dialed again.
	err := c.Ping(ctxFor(t, 5*time.Second)).Err()
	assert.True(t, err != nil || p.Conns() == 2, "PING succeeded on a reset connection")
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())
	assert.Equal(t, 2, p.Conns(), "mode unchanged: a new connection is served")
}

// TestResetAllSurfacesReset checks that a command in flight when its
// connection is reset fails at once, with a reset or EOF, not a timeout.
func TestResetAllSurfacesReset(t *testing.T) {
	t.Parallel()
	s, p, c := setup(t)
	done := make(chan error, 1)
	go func() { done <- c.BLPop(ctxFor(t, 10*time.Second), 0, "list").Err() }()
	direct := s.Client(t)
	require.Eventually(t, func() bool {
		return strings.Contains(direct.ClientList(ctxFor(t, time.Second)).Val(), "cmd=blpop")
	}, 5*time.Second, 10*time.Millisecond, "BLPOP never blocked in Redis")

	start := time.Now()
	p.ResetAll()
	err := <-done
	require.Error(t, err)
	assert.False(t, isTimeout(err), "want a reset or EOF, got %v", err)
	assert.Less(t, time.Since(start), time.Second)
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())
}

func TestRefuse(t *testing.T) {
	t.Parallel()
	_, p, c := setup(t)
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())

	p.Refuse()
	err := c.Ping(ctxFor(t, 5*time.Second)).Err()
	require.Error(t, err)
	assert.False(t, isTimeout(err), "want a reset, got %v", err)
	// New connections too, even with retries.
	retrying := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = retrying.Close() })
	require.Error(t, retrying.Ping(ctxFor(t, 5*time.Second)).Err())

	p.Pass()
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())
	require.NoError(t, retrying.Ping(ctxFor(t, 5*time.Second)).Err())
}

func TestTargetDownResetsClient(t *testing.T) {
	t.Parallel()
	s, _, c := setup(t)
	s.Kill()
	err := c.Ping(ctxFor(t, 5*time.Second)).Err()
	require.Error(t, err)
	assert.False(t, isTimeout(err), "want a reset or EOF, got %v", err)
	s.Restart(t)
	require.NoError(t, c.Ping(ctxFor(t, 5*time.Second)).Err())
}
