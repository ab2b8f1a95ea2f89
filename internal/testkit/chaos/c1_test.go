package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
)

// TestReleaseAfterAgentStop replays by hand a bug the chaos runs found
// (seed 1791041169495159 of the harness in progress, against 45f9ba3; fixed
// by 55c63f7, "overdue leases lost before any answer"; see regressions): an
// agent is SIGSTOPped longer than its leases' TTL while their clients
// release them; Redis expires them and another agent grants the names; on
// SIGCONT the agent must report each lease lost and answer its release
// not_held (docs/testing.md C1: lost before anything else), never `released:
// true`, which tells the client that it held the lock alone until then. The
// agent's scheduler and the pending releases race after SIGCONT, so several
// leases are released at once, for several rounds: against 45f9ba3 it
// fails every time.
func TestReleaseAfterAgentStop(t *testing.T) {
	const (
		leases = 6
		rounds = 10
		ttl    = 1000 // ms
	)
	c := startCluster(t, bin, 2)
	ctx := t.Context()
	dial := func(a *agent) *client.Client {
		cl, err := client.Dial(ctx, a.socket)
		require.NoError(t, err)
		t.Cleanup(func() { cl.Close() })
		require.NoError(t, cl.Call(ctx, "hello", map[string]any{"version": 1, "client": "c1"}, nil))
		return cl
	}
	holders, others := make([]*client.Client, leases), make([]*client.Client, leases)
	for i := range leases {
		holders[i], others[i] = dial(c.agents[0]), dial(c.agents[1])
	}

	var bad []string
	for round := range rounds {
		held := make([]acquireResult, leases)
		for i := range leases {
			name := fmt.Sprintf("c1/%d", i)
			require.NoError(t, holders[i].Call(ctx, "acquire", map[string]any{"name": name, "ttl_ms": ttl, "wait_ms": 5000}, &held[i]))
			require.True(t, held[i].Acquired)
		}

		c.agents[0].pause()
		answers := make([]chan error, leases)
		for i := range leases {
			answers[i] = make(chan error, 1)
			go func() {
				var res struct {
					Released bool `json:"released"`
				}
				err := holders[i].Call(ctx, "release", map[string]any{"lease": held[i].Lease}, &res)
				if err == nil && !res.Released {
					err = errors.New("released: false")
				}
				answers[i] <- err
			}()
		}
		granted := make([]acquireResult, leases)
		errs := make([]error, leases)
		var wg sync.WaitGroup
		for i := range leases {
			wg.Go(func() {
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				errs[i] = others[i].Call(wctx, "acquire", map[string]any{"name": fmt.Sprintf("c1/%d", i), "ttl_ms": ttl, "wait_ms": 5000}, &granted[i])
			})
		}
		wg.Wait()
		c.agents[0].signal(syscall.SIGCONT)

		for i := range leases {
			require.NoError(t, errs[i])
			require.True(t, granted[i].Acquired, "the other agent is granted c1/%d once Redis expired the stopped agent's lease", i)
			assert.Greater(t, granted[i].Token, held[i].Token)
			err := <-answers[i]
			var apiErr *client.Error
			switch {
			case err == nil:
				bad = append(bad, fmt.Sprintf("round %d: the release of c1/%d lease %s (token %d) was answered released:true after SIGCONT; the other agent had granted token %d while it was stopped",
					round, i, held[i].Lease, held[i].Token, granted[i].Token))
			case errors.As(err, &apiErr) && apiErr.Code == "not_held":
				lost := false
				for len(holders[i].Events()) > 0 {
					if ev := <-holders[i].Events(); ev.Event == "lost" && ev.Lease == held[i].Lease {
						lost = true
					}
				}
				assert.True(t, lost, "round %d: c1/%d: a lease answered not_held was reported lost first", round, i)
			default:
				t.Fatalf("round %d: release of c1/%d: %v", round, i, err)
			}
			require.NoError(t, others[i].Call(ctx, "release", map[string]any{"lease": granted[i].Lease}, nil))
		}
	}
	for _, b := range bad {
		t.Log(b)
	}
	if len(bad) > 0 {
		t.Logf("agent 0's log:\n%s", tail(c.agents[0].logPath, 8000))
	}
	assert.Empty(t, bad, "%d of %d releases sent while the agent was stopped past the lease's deadline were answered released:true instead of lost and not_held (C1)",
		len(bad), leases*rounds)
}
