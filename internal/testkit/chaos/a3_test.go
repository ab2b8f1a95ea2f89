package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
)

// TestHeartbeatDropEndsConnectionFirst replays by hand a bug the chaos runs
// found (seed 3749986237347185 of the harness in progress; fixed by
// c6e84ae; see regressions): a client with heartbeat_ms falls silent (it is
// paused) while its agent's Redis link is black-holed. The agent drops the
// connection at the heartbeat and releases its leases; the client must see
// the connection end (its only notice that its connection-scoped locks are
// gone) before another agent can be granted one of them (promise 3;
// docs/docs/testing.md A3: "the agent ends the connection and releases").
// Releasing first, synchronously, against a backend that does not answer,
// held the connection open for the release timeout (5 s), long after Redis
// expired the lease and the name went elsewhere: a client waking up
// meanwhile worked on, told nothing.
func TestHeartbeatDropEndsConnectionFirst(t *testing.T) {
	const (
		heartbeatMS = 1000
		ttlMS       = 3000 // longer than the heartbeat: the drop, not the deadline, ends the lease
	)
	c := startCluster(t, bin, 2)
	ctx := t.Context()
	start := time.Now()

	holder, err := client.Dial(ctx, c.agents[0].socket)
	require.NoError(t, err)
	t.Cleanup(func() { holder.Close() })
	require.NoError(t, holder.Call(ctx, "hello", map[string]any{"version": 1, "client": "a3", "heartbeat_ms": heartbeatMS}, nil))
	var l acquireResult
	require.NoError(t, holder.Call(ctx, "acquire", map[string]any{"name": "a3/x", "ttl_ms": ttlMS}, &l))
	require.True(t, l.Acquired)
	ended := make(chan time.Duration, 1)
	go func() {
		for ev := range holder.Events() {
			if ev.Event == "lost" {
				ended <- time.Since(start)
				return
			}
		}
		ended <- time.Since(start)
	}()

	// The holder is now silent; its agent cannot reach Redis.
	c.agents[0].blackhole()
	defer c.agents[0].pass()

	other, err := client.Dial(ctx, c.agents[1].socket)
	require.NoError(t, err)
	t.Cleanup(func() { other.Close() })
	require.NoError(t, other.Call(ctx, "hello", map[string]any{"version": 1, "client": "a3-other"}, nil))
	var g acquireResult
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, other.Call(wctx, "acquire", map[string]any{"name": "a3/x", "ttl_ms": ttlMS, "wait_ms": 8000}, &g))
	grantedAt := time.Since(start)
	require.True(t, g.Acquired, "the other agent is granted the name once Redis expired the lease")
	assert.Greater(t, g.Token, l.Token)

	var endedAt time.Duration
	select {
	case endedAt = <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the silent holder's connection did not end")
	}
	t.Logf("heartbeat %dms, ttl %dms: the holder's connection ended (or its lease was reported lost) at %v; the other agent was granted the name at %v",
		heartbeatMS, ttlMS, endedAt.Round(time.Millisecond), grantedAt.Round(time.Millisecond))
	assert.Less(t, endedAt, grantedAt,
		"the silent holder learned that its lease was gone %v after another agent was granted the name", (endedAt - grantedAt).Round(time.Millisecond))
}
