package redis_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/backend/backendtest"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// tokenPath is one way a script mints a token.
type tokenPath struct {
	name string
	mode backend.Mode
	// queued: the acquire is a waiter whose ticket heads the name's
	// queue, which the exclusive fast path leaves to the general one.
	queued bool
}

var tokenPaths = []tokenPath{
	{name: "exclusive", mode: backend.Exclusive},
	{name: "queued", mode: backend.Exclusive, queued: true},
	{name: "shared", mode: backend.Shared},
}

// fenceKey is the key of name's last token under prefix.
func fenceKey(prefix, name string) string { return prefix + ":lk:{" + name + "}:f" }

// queueAtHead puts ticket tk at the head of name's queue: it asks while
// another lease holds the name, and that lease is released.
func queueAtHead(t *testing.T, b backend.Backend, name, tk string) {
	t.Helper()
	ctx := t.Context()
	holder := backend.AcquireRequest{Name: name, LeaseID: "holder", TTL: 10 * time.Second}
	_, err := b.Acquire(ctx, holder)
	require.NoError(t, err)
	_, err = b.Acquire(ctx, backend.AcquireRequest{Name: name, LeaseID: "waiter", TTL: 10 * time.Second, Ticket: tk})
	require.ErrorIs(t, err, backend.ErrHeld)
	require.NoError(t, b.Release(ctx, backend.LeaseKey{Name: name, LeaseID: "holder"}))
}

// acquireOn asks for name by id on path p (queueing its ticket first).
func acquireOn(t *testing.T, b backend.Backend, p tokenPath, name, id string) (backend.Grant, error) {
	t.Helper()
	req := backend.AcquireRequest{Name: name, LeaseID: id, Mode: p.mode, TTL: 10 * time.Second}
	if p.queued {
		req.Ticket = "t-" + id
		queueAtHead(t, b, name, req.Ticket)
	}
	return b.Acquire(t.Context(), req)
}

// requireExhausted requires err to be ErrTokensExhausted naming want, and
// name to have no holder.
func requireExhausted(t *testing.T, b backend.Backend, name string, err error, want string) {
	t.Helper()
	require.ErrorIs(t, err, backend.ErrTokensExhausted)
	assert.NotErrorIs(t, err, backend.ErrForeignKey)
	assert.ErrorContains(t, err, want)
	info, err := b.Inspect(t.Context(), name)
	require.NoError(t, err)
	assert.Empty(t, info.Holders, "nothing was granted")
}

// checkLastTokenEdges: with the last token stored for a name at each edge
// of backend.MaxToken, an acquire on every path that mints a token either
// gets the one token left, or fails with ErrTokensExhausted naming the
// fence key and writes nothing; never a token of MaxToken or more, never
// foreign_key.
func checkLastTokenEdges(t *testing.T, b backend.Backend, rc goredis.Cmdable, prefix string) {
	ctx := t.Context()
	for _, p := range tokenPaths {
		for _, tc := range []struct {
			last    string
			granted bool
		}{
			{strconv.FormatUint(backend.MaxToken-2, 10), true}, // 2^53-3: one token left
			{strconv.FormatUint(backend.MaxToken-1, 10), false},
			{strconv.FormatUint(backend.MaxToken, 10), false},
			{strconv.FormatUint(backend.MaxToken+1, 10), false}, // 2^53, which agents used to grant
			{"18446744073709551616", false},                     // 2^64
			{strings.Repeat("9", 30), false},
		} {
			t.Run(p.name+"/"+tc.last, func(t *testing.T) {
				name := fmt.Sprintf("%s-%s", p.name, tc.last[:min(len(tc.last), 20)])
				f := fenceKey(prefix, name)
				if p.queued {
					// The ticket is queued before the edge is set: the
					// holder it waits behind needs a token too.
					queueAtHead(t, b, name, "t-l1")
				}
				require.NoError(t, rc.Set(ctx, f, tc.last, 0).Err())
				req := backend.AcquireRequest{Name: name, LeaseID: "l1", Mode: p.mode, TTL: 10 * time.Second}
				if p.queued {
					req.Ticket = "t-l1"
				}
				g, err := b.Acquire(ctx, req)
				if !tc.granted {
					requireExhausted(t, b, name, err, f)
					v, err := rc.Get(ctx, f).Result()
					require.NoError(t, err)
					assert.Equal(t, tc.last, v, "the last token is left as it was")
					return
				}
				require.NoError(t, err)
				assert.Equal(t, uint64(backend.MaxToken-1), g.Token, "the last token")
				// A repeated grant answers as ever.
				again, err := b.Acquire(ctx, req)
				require.NoError(t, err)
				assert.Equal(t, g.Token, again.Token)
				info, err := b.Inspect(ctx, name)
				require.NoError(t, err)
				assert.Equal(t, g.Token, info.LastToken)
				// Another lease finds the name held, then, once it is
				// released, no token left.
				_, err = b.Acquire(ctx, backend.AcquireRequest{Name: name, LeaseID: "l2", Mode: backend.Exclusive, TTL: 10 * time.Second})
				require.ErrorIs(t, err, backend.ErrHeld)
				require.NoError(t, b.Release(ctx, backend.LeaseKey{Name: name, LeaseID: "l1", Mode: p.mode}))
				_, err = b.Acquire(ctx, backend.AcquireRequest{Name: name, LeaseID: "l3", Mode: p.mode, TTL: 10 * time.Second})
				requireExhausted(t, b, name, err, f)
			})
		}
	}
}

// TestLastTokenEdges: see checkLastTokenEdges, on a standalone server.
func TestLastTokenEdges(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	b := open(t, newClient(srv.Addr()), "edge")
	defer b.Close()
	checkLastTokenEdges(t, b, srv.Client(t), "edge")
}

// TestClusterLastTokenEdges: see checkLastTokenEdges, on a three-primary
// Cluster.
func TestClusterLastTokenEdges(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	b := open(t, goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true}), "edge")
	defer b.Close()
	checkLastTokenEdges(t, b, cl.Client(t), "edge")
}

// TestConformanceExhausted: a name whose last token is MaxToken-1 has no
// token left.
func TestConformanceExhausted(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rc := srv.Client(t)
	backendtest.RunExhausted(t, func(t *testing.T) (backend.Backend, func(string)) {
		b := open(t, newClient(srv.Addr()), "cx")
		t.Cleanup(func() { b.Close() })
		return b, func(name string) {
			require.NoError(t, rc.Set(t.Context(), fenceKey("cx", name), strconv.FormatUint(backend.MaxToken-1, 10), 0).Err())
		}
	})
}

// TestClockPastTheLastToken: tokens are never below the server's time in
// µs, which reaches backend.MaxToken on 2255-06-05. Before then grants go
// on, below MaxToken; after it, and far after it, every path refuses with
// ErrTokensExhausted, saying it is the clock, and writes no token.
func TestClockPastTheLastToken(t *testing.T) {
	for _, tc := range []struct {
		clock   string
		granted bool
	}{
		{"@2255-06-05 23:00:00", true}, // 47 minutes before the edge
		{"@2255-06-06 00:00:00", false},
		{"@2260-01-01 00:00:00", false},
	} {
		t.Run(tc.clock, func(t *testing.T) {
			srv := redistest.Start(t, redistest.Options{Faketime: tc.clock})
			rc := srv.Client(t)
			b := open(t, newClient(srv.Addr()), "clk")
			defer b.Close()
			ctx := t.Context()
			for _, p := range tokenPaths {
				if p.queued && !tc.granted {
					// No holder can be granted for the ticket to wait
					// behind: it waits behind one written by hand.
					x := "clk:lk:{" + p.name + "}"
					require.NoError(t, rc.HSet(ctx, x, "o", "other", "k", "1", "h", "host", "m", "").Err())
					require.NoError(t, rc.PExpire(ctx, x, 10*time.Second).Err())
					req := backend.AcquireRequest{Name: p.name, LeaseID: "l1", TTL: 10 * time.Second, Ticket: "t-l1"}
					_, err := b.Acquire(ctx, req)
					require.ErrorIs(t, err, backend.ErrHeld)
					require.NoError(t, rc.Del(ctx, x).Err())
					_, err = b.Acquire(ctx, req)
					requireExhausted(t, b, p.name, err, "clock")
					assert.Zero(t, rc.Exists(ctx, fenceKey("clk", p.name)).Val(), "no token was written")
					continue
				}
				g, err := acquireOn(t, b, p, p.name, "l1")
				if !tc.granted {
					requireExhausted(t, b, p.name, err, "clock")
					assert.Zero(t, rc.Exists(ctx, fenceKey("clk", p.name)).Val(), "no token was written")
					continue
				}
				require.NoError(t, err, p.name)
				now, err := rc.Time(ctx).Result()
				require.NoError(t, err)
				assert.Less(t, g.Token, uint64(backend.MaxToken), p.name)
				assert.LessOrEqual(t, g.Token, uint64(now.UnixMicro()), "%s: the token is the clock", p.name)
				t.Logf("%s: token %d at %v", p.name, g.Token, now.UTC())
			}
		})
	}
}
