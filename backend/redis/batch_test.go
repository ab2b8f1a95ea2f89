package redis

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/redistest"
)

// TestAbandonedCallIsNotSent: a caller that stops waiting while its call
// gathers behind a pipeline in flight gets its context's error at once,
// and the call is never sent.
func TestAbandonedCallIsNotSent(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer c.Close()
	b := &batcher{c: c}
	script := goredis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1])`)

	b.busy = true // a pipeline is in flight
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *goredis.Cmd)
	go func() { done <- b.run(ctx, script, []string{"abandoned"}, "x") }()
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == 1
	}, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, (<-done).Err(), context.Canceled)

	b.drain() // what the pipeline's return starts
	n, err := c.Exists(context.Background(), "abandoned").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the abandoned call was sent")
	assert.False(t, b.busy, "the batcher stayed busy with nothing in flight")

	// Calls made now go out at once.
	require.NoError(t, b.run(context.Background(), script, []string{"later"}, "y").Err())
	v, err := c.Get(context.Background(), "later").Result()
	require.NoError(t, err)
	assert.Equal(t, "y", v)
}
