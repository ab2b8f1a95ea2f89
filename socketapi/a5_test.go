package socketapi_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/testkit/lockcheck"
)

// TestA5_RaceForOneName: K apps on one agent race for one name. The
// recorded history must be linearizable as a lock (one holder at a time,
// tokens increasing) and a fenced register must accept every write.
func TestA5_RaceForOneName(t *testing.T) {
	const apps, rounds = 8, 40
	ta := startAgent(t)
	h := lockcheck.NewHistory()
	var reg lockcheck.Register
	var inside atomic.Int32
	var overlaps atomic.Int32

	var wg sync.WaitGroup
	for app := 0; app < apps; app++ {
		c := ta.client(t, map[string]any{"client": "a5"})
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := 0; i < rounds; i++ {
				call := h.Now()
				var l lease
				if err := c.Call(ctx, "acquire", map[string]any{"name": "a5", "wait_ms": -1}, &l); err != nil || !l.Acquired {
					t.Errorf("acquire: %v %+v", err, l)
					return
				}
				h.Add(call, lockcheck.Input{Kind: lockcheck.Acquire, Name: "a5", Client: app}, lockcheck.Output{OK: true, Token: l.Token})
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				if !reg.Write(l.Token) {
					t.Errorf("fenced write with token %d rejected", l.Token)
				}
				inside.Add(-1)
				call = h.Now()
				err := c.Call(ctx, "release", map[string]any{"lease": l.Lease}, nil)
				h.Add(call, lockcheck.Input{Kind: lockcheck.Release, Name: "a5", Client: app}, lockcheck.Output{OK: err == nil})
			}
		}()
	}
	wg.Wait()

	dir, err := os.MkdirTemp("", "a5-artifacts")
	require.NoError(t, err)
	res, err := lockcheck.CheckStrict(h, dir)
	require.NoError(t, err)
	accepted, rejected := reg.Counts()
	t.Logf("A5: runs 1, operations %d, faults injected 0, violations %d (overlaps %d, fenced rejects %d)",
		res.Operations, btoi(!res.OK)+int(overlaps.Load())+rejected, overlaps.Load(), rejected)
	assert.True(t, res.OK, "history not linearizable; see %s", res.Visualization)
	if res.OK {
		os.RemoveAll(dir)
	}
	assert.Equal(t, 2*apps*rounds, res.Operations)
	assert.Zero(t, overlaps.Load())
	assert.Equal(t, apps*rounds, accepted)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
