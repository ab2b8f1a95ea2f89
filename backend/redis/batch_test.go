package redis

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/internal/testkit/faultproxy"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// newBatcher returns a batcher on a fresh server, and a client of that
// server.
func newBatcher(t *testing.T) (*batcher, *goredis.Client) {
	srv := redistest.Start(t, redistest.Options{})
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	return &batcher{c: c}, c
}

// setScript sets KEYS[1] to ARGV[1].
var setScript = goredis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1])`)

// gatherOne has a call of setScript for key, with ctx, gather in b behind
// as many calls in flight as go out at once, and returns the channel of
// its result.
func gatherOne(t *testing.T, b *batcher, ctx context.Context, key string) <-chan *goredis.Cmd {
	t.Helper()
	fillInFlight(b)
	done := make(chan *goredis.Cmd, 1)
	go func() { done <- b.run(ctx, setScript, []string{key}, "x") }()
	waitGathered(t, b, 1)
	return done
}

// fillInFlight has b count as many calls in flight as go out at once, so
// that the calls made next gather.
func fillInFlight(b *batcher) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inFlight = maxInFlight
}

// waitGathered waits until n calls gather in b.
func waitGathered(t *testing.T, b *batcher, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == n
	}, 5*time.Second, time.Millisecond)
}

// TestAbandonedCallIsNotSent: a caller that stops waiting while its call
// gathers behind a pipeline in flight gets its context's error at once,
// and the call is never sent.
func TestAbandonedCallIsNotSent(t *testing.T) {
	b, c := newBatcher(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := gatherOne(t, b, ctx, "abandoned")
	cancel()
	require.ErrorIs(t, (<-done).Err(), context.Canceled)

	b.drain() // what a call's return starts
	n, err := c.Exists(context.Background(), "abandoned").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the abandoned call was sent")
	assert.Equal(t, maxInFlight-1, b.inFlight, "the drain kept its place in flight")

	// Calls made now go out at once.
	require.NoError(t, b.run(context.Background(), setScript, []string{"later"}, "y").Err())
	v, err := c.Get(context.Background(), "later").Result()
	require.NoError(t, err)
	assert.Equal(t, "y", v)
}

// TestAbandonedCallWithPre: an abandoned call's pre get its outcome too,
// never sent. They had none, and the acquire that read theirs crashed
// the agent (a chaos run found it).
func TestAbandonedCallWithPre(t *testing.T) {
	b, c := newBatcher(t)
	ctx, cancel := context.WithCancel(context.Background())
	fillInFlight(b)
	main := &call{ctx: ctx, script: setScript, keys: []string{"main"}, args: []any{"x"},
		pre: []*call{{ctx: ctx, script: setScript, keys: []string{"pre"}, args: []any{"x"}}}}
	done := make(chan *goredis.Cmd, 1)
	go func() { done <- b.runCall(ctx, main) }()
	waitGathered(t, b, 1)
	cancel()
	require.ErrorIs(t, (<-done).Err(), context.Canceled)
	require.NotNil(t, main.pre[0].cmd)
	require.ErrorIs(t, main.pre[0].cmd.Err(), context.Canceled)

	b.drain()
	n, err := c.Exists(context.Background(), "main", "pre").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the abandoned calls were sent")
}

// TestHashSlot: the slot of a tag is the one Redis Cluster computes.
func TestHashSlot(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t)
	for _, tag := range []string{"foo", "bar", "123456789", "orders/42", "#0f3a", "ü/ß"} {
		want, err := c.ClusterKeySlot(context.Background(), "x{"+tag+"}").Result()
		require.NoError(t, err)
		assert.Equal(t, uint16(want), hashSlot(tag), "slot of %q", tag)
	}
}

// TestBatchScriptIsolatesFailures: the requests of one batch call get
// their own results, in order, and one that fails fails alone.
func TestBatchScriptIsolatesFailures(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	b, err := Open(context.Background(), Options{Client: c, KeyPrefix: "bs"})
	require.NoError(t, err)
	defer b.Close()
	ctx := context.Background()
	acq := func(name, id string) *call {
		k := b.keys(name)
		return &call{ctx: ctx, script: acquireScript, keys: []string{k.x, k.r, k.t, k.f, k.q, k.qe, k.c},
			args: []any{id, "x", 10000, 0, "host", "meta", 60000, ""}}
	}
	rel := func(name, id string) *call {
		k := b.keys(name)
		return &call{ctx: ctx, script: releaseScript, keys: []string{k.x, k.r, k.t, k.c, k.q, k.qe}, args: []any{id, "x"}}
	}
	brokenAcq, brokenRel := acq("a", "l2"), rel("a", "l1")
	brokenAcq.keys, brokenRel.keys = brokenAcq.keys[:3], brokenRel.keys[:3] // fail inside the script, before they write
	acquires := []*call{acq("a", "l1"), brokenAcq, acq("a", "l3")}
	b.batch.execOne(ctx, acquires)
	granted, err := acquires[0].cmd.Slice()
	require.NoError(t, err)
	assert.Equal(t, int64(1), granted[0], "the first acquire is granted")
	assert.Error(t, acquires[1].cmd.Err(), "the malformed acquire fails")
	held, err := acquires[2].cmd.Slice()
	require.NoError(t, err)
	assert.Equal(t, int64(0), held[0], "the second acquire of a finds it held")

	releases := []*call{brokenRel, rel("a", "l1"), rel("a", "l1")}
	b.batch.execOne(ctx, releases)
	assert.Error(t, releases[0].cmd.Err(), "the malformed release fails")
	v, err := releases[1].cmd.Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(1), v, "the release of l1 releases: the malformed one released nothing")
	v, err = releases[2].cmd.Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(0), v, "a second release of l1 finds nothing")

	// Gathered together, releases go first: an acquire gathered with the
	// release of its name finds it free.
	_, err = b.Acquire(ctx, backend.AcquireRequest{Name: "b", LeaseID: "l4", TTL: 10 * time.Second})
	require.NoError(t, err)
	mixed := []*call{acq("b", "l5"), rel("b", "l4")}
	b.batch.execOne(ctx, mixed)
	granted, err = mixed[0].cmd.Slice()
	require.NoError(t, err)
	assert.Equal(t, int64(1), granted[0], "granted after the release")
	v, err = mixed[1].cmd.Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(1), v)
}

// TestLargeBatchGoesInSeveralCalls: a batch beyond batchPerCall goes as
// several calls in one pipeline, each request getting its own result,
// also after the server lost its scripts.
func TestLargeBatchGoesInSeveralCalls(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	b, err := Open(context.Background(), Options{Client: c, KeyPrefix: "lb"})
	require.NoError(t, err)
	defer b.Close()
	ctx := context.Background()
	n := 2*batchPerCall + 22
	var acquires, releases []*call
	for i := range n {
		k := b.keys(fmt.Sprintf("n%d", i))
		id := fmt.Sprintf("l%d", i)
		acquires = append(acquires, &call{ctx: ctx, script: acquireScript, keys: []string{k.x, k.r, k.t, k.f, k.q, k.qe, k.c},
			args: []any{id, "x", 10000, 0, "host", "", 60000, ""}})
		releases = append(releases, &call{ctx: ctx, script: releaseScript, keys: []string{k.x, k.r, k.t, k.c, k.q, k.qe}, args: []any{id, "x"}})
	}
	require.NoError(t, c.ScriptFlush(ctx).Err()) // as after a restart
	b.batch.execOne(ctx, acquires)
	for i, a := range acquires {
		res, err := a.cmd.Slice()
		require.NoError(t, err, "acquire %d", i)
		assert.Equal(t, int64(1), res[0], "acquire %d granted", i)
	}
	b.batch.execOne(ctx, releases)
	for i, r := range releases {
		v, err := r.cmd.Int64()
		require.NoError(t, err, "release %d", i)
		assert.Equal(t, int64(1), v, "release %d released", i)
	}
}

// TestBatchOnReplica: a batch that reaches a replica (an old primary
// demoted under the agent's connection) fails whole with READONLY, which
// go-redis sends again on a new connection, instead of each request
// failing alone; once the server is a primary again, every request of the
// batch runs.
func TestBatchOnReplica(t *testing.T) {
	primary := redistest.Start(t, redistest.Options{})
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), MaxRetries: 10,
		MinRetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond})
	b, err := Open(ctx, Options{Client: c, KeyPrefix: "ro"})
	require.NoError(t, err)
	defer b.Close()

	rc := srv.Client(t)
	host, port, err := net.SplitHostPort(primary.Addr())
	require.NoError(t, err)
	require.NoError(t, rc.SlaveOf(ctx, host, port).Err())
	// The server becomes a primary again once it has refused a write.
	promoted := make(chan error, 1)
	go func() {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			stats, err := rc.Info(ctx, "errorstats").Result()
			if err != nil {
				promoted <- err
				return
			}
			if strings.Contains(stats, "errorstat_READONLY:") {
				promoted <- rc.SlaveOf(ctx, "NO", "ONE").Err()
				return
			}
			time.Sleep(time.Millisecond)
		}
		promoted <- fmt.Errorf("no READONLY error after 10 s")
	}()

	var batch []*call
	for i := range 3 {
		k := b.keys(fmt.Sprintf("n%d", i))
		batch = append(batch, &call{ctx: ctx, script: acquireScript, keys: []string{k.x, k.r, k.t, k.f, k.q, k.qe, k.c},
			args: []any{fmt.Sprintf("l%d", i), "x", 10000, 0, "host", "", 60000, ""}})
	}
	b.batch.execOne(ctx, batch)
	require.NoError(t, <-promoted)
	for i, a := range batch {
		res, err := a.cmd.Slice()
		require.NoError(t, err, "acquire %d", i)
		assert.Equal(t, int64(1), res[0], "acquire %d granted", i)
	}
}

// TestCallPastItsDeadline: a gathered call whose deadline has passed
// when its pipeline goes, before its context says so, is not sent, and
// its caller, woken by the drain, gets the deadline's error.
func TestCallPastItsDeadline(t *testing.T) {
	b, c := newBatcher(t)
	done := gatherOne(t, b, pastDeadline{context.Background()}, "late")
	b.drain() // what a call's return starts
	cmd := <-done
	require.NotNil(t, cmd)
	require.ErrorIs(t, cmd.Err(), context.DeadlineExceeded)
	n, err := c.Exists(context.Background(), "late").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the late call was sent")
}

// pastDeadline is a context whose deadline has passed and which does not
// say so yet, as one whose timer has not fired.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestCleanupComesAfterTheLastSend: a gathered call whose deadline passes
// while its pipeline hangs may still be sent again by go-redis's retry of
// that pipeline, with the others; its caller, who then cleans up (releases
// the lease its acquire may have made), gets the answer only once the
// pipeline has returned, so that no send comes after the cleanup and no
// grant outlives it.
func TestCleanupComesAfterTheLastSend(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	px := faultproxy.New(t, srv.Addr())
	c := goredis.NewClient(&goredis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true, MaxRetries: 2,
		MinRetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond})
	b, err := Open(context.Background(), Options{Client: c, KeyPrefix: "late"})
	require.NoError(t, err)
	defer b.Close()
	direct := srv.Client(t)

	acquire := func(ctx context.Context, name, id string) error {
		k := b.keys(name)
		return b.batch.run(ctx, acquireScript, []string{k.x, k.r, k.t, k.f, k.q, k.qe, k.c}, id, "x", 10000, 0, "h", "", 60000, "").Err()
	}
	fillInFlight(b.batch)
	ctxA, cancelA := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancelA()
	ctxB, cancelB := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelB()
	resA, resB := make(chan error, 1), make(chan error, 1)
	go func() { resA <- acquire(ctxA, "a", "leaseA") }()
	go func() { resB <- acquire(ctxB, "b", "leaseB") }()
	waitGathered(t, b.batch, 2)

	px.Blackhole()
	go b.batch.drain() // what a call's return starts
	// Well after A's deadline the link heals: go-redis sends the pipeline
	// again, A's call with it.
	healed := make(chan time.Time, 1)
	time.AfterFunc(500*time.Millisecond, func() {
		px.ResetAll()
		px.Pass()
		healed <- time.Now()
	})
	require.ErrorIs(t, <-resA, context.DeadlineExceeded)
	answered := time.Now()
	require.True(t, answered.After(<-healed), "A's caller had its answer before the pipeline returned")
	// A's caller cleans up, as the agent does after an unknown outcome.
	k := b.keys("a")
	_, err = releaseScript.Run(context.Background(), direct, []string{k.x, k.r, k.t, k.c, k.q, k.qe}, "leaseA", "x").Int64()
	require.NoError(t, err)

	require.NoError(t, <-resB)
	n, err := direct.Exists(context.Background(), k.x).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "no grant of A after its cleanup")
	owner, err := direct.HGet(context.Background(), b.keys("b").x, "o").Result()
	require.NoError(t, err)
	assert.Equal(t, "leaseB", owner)
}

// TestReleaseWithoutDeadline: a release whose context has no deadline
// (the agent's releases outlive their requests), gathered with an acquire
// while Redis does not answer, bounds their pipeline all the same: the
// acquire's caller, who waits for the pipeline before it cleans up, and
// the release get their answers after releaseWait, not after go-redis's
// timeouts and retries.
func TestReleaseWithoutDeadline(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	px := faultproxy.New(t, srv.Addr())
	c := goredis.NewClient(&goredis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, MaxRetries: 2})
	b, err := Open(context.Background(), Options{Client: c, KeyPrefix: "nd"})
	require.NoError(t, err)
	defer b.Close()

	fillInFlight(b.batch)
	released, acquired := make(chan error, 1), make(chan error, 1)
	go func() { released <- b.Release(context.Background(), backend.LeaseKey{Name: "n", LeaseID: "l"}) }()
	go func() {
		_, err := b.Acquire(context.Background(), backend.AcquireRequest{Name: "m", LeaseID: "k", TTL: time.Second,
			Deadline: time.Now().Add(200 * time.Millisecond)})
		acquired <- err
	}()
	waitGathered(t, b.batch, 2)
	px.Blackhole()
	defer func() { px.ResetAll(); px.Pass() }() // before Close, which would wait on the hung connections
	start := time.Now()
	go b.batch.drain() // what a call's return starts
	require.ErrorIs(t, <-released, backend.ErrUnavailable)
	require.Error(t, <-acquired)
	took := time.Since(start)
	assert.Less(t, took, releaseWait+2*time.Second, "go-redis alone would wait 10 s for the first answer")
	t.Logf("the pipeline of a release without a deadline gave up after %v", took)
}

// TestPrimaryBatchersPruned: the batchers of primaries nobody asked for
// in pruneAfter are dropped when a new primary appears, so that a cluster
// whose nodes come and go does not grow the map for ever; those in use
// stay, with their calls in flight.
func TestPrimaryBatchersPruned(t *testing.T) {
	n := &nodeBatchers{nodes: map[string]*nodeBatcher{}}
	t0 := time.Now()
	a := n.at("a:1", t0)
	b := n.at("b:1", t0)
	require.Same(t, a, n.at("a:1", t0.Add(pruneAfter/2)), "a primary keeps its batcher")

	// Round robin over the live primaries, new ones appearing: nothing
	// in use is dropped.
	n.at("c:1", t0.Add(pruneAfter/2))
	require.Len(t, n.nodes, 3)

	// b:1 went away; a:1 and c:1 are still asked for.
	later := t0.Add(pruneAfter/2 + pruneAfter)
	require.Same(t, a, n.at("a:1", later))
	n.at("c:1", later)
	d := n.at("d:1", later)
	require.Len(t, n.nodes, 3, "b:1's batcher is dropped")
	assert.NotContains(t, n.nodes, "b:1")
	assert.Same(t, d, n.at("d:1", later))
	assert.NotSame(t, b, n.at("b:1", later), "a primary back gets a new batcher")
}

// TestWritesRefusedWhole: a script that writes is refused before it runs
// by a replica, so that a release of a lease the replica has not received
// is sent again to the primary rather than answered "not held" from stale
// data; and, for acquires, by a server out of memory, even gathered
// behind a release, whose first write would otherwise turn Redis's memory
// check off for the rest of the call. Releases still go through.
func TestWritesRefusedWhole(t *testing.T) {
	ctx := context.Background()
	t.Run("replica", func(t *testing.T) {
		primary := redistest.Start(t, redistest.Options{})
		replica := redistest.Start(t, redistest.Options{})
		host, port, err := net.SplitHostPort(primary.Addr())
		require.NoError(t, err)
		require.NoError(t, replica.Client(t).SlaveOf(ctx, host, port).Err())
		b, err := Open(ctx, Options{Client: goredis.NewClient(&goredis.Options{Addr: replica.Addr(), MaxRetries: -1}), KeyPrefix: "ro"})
		require.NoError(t, err)
		defer b.Close()
		for _, mode := range []backend.Mode{backend.Exclusive, backend.Shared} {
			err := b.Release(ctx, backend.LeaseKey{Name: "n", LeaseID: "l1", Mode: mode})
			require.ErrorIs(t, err, backend.ErrUnavailable, "%s", mode)
			require.ErrorContains(t, err, "READONLY")
		}
	})
	t.Run("out of memory", func(t *testing.T) {
		srv := redistest.Start(t, redistest.Options{})
		b, err := Open(ctx, Options{Client: goredis.NewClient(&goredis.Options{Addr: srv.Addr()}), KeyPrefix: "oom"})
		require.NoError(t, err)
		defer b.Close()
		_, err = b.Acquire(ctx, backend.AcquireRequest{Name: "r", LeaseID: "l1", TTL: 10 * time.Second})
		require.NoError(t, err)
		rc := srv.Client(t)
		require.NoError(t, rc.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
		require.NoError(t, rc.ConfigSet(ctx, "maxmemory", "1").Err())
		defer rc.ConfigSet(ctx, "maxmemory", "0")
		k, kr := b.keys("new"), b.keys("r")
		acq := &call{ctx: ctx, script: acquireScript, keys: []string{k.x, k.r, k.t, k.f, k.q, k.qe, k.c},
			args: []any{"l2", "x", 10000, 0, "host", "", 60000, ""}}
		rel := &call{ctx: ctx, script: releaseScript, keys: []string{kr.x, kr.r, kr.t, kr.c, kr.q, kr.qe}, args: []any{"l1", "x"}}
		b.batch.execOne(ctx, []*call{rel, acq})
		v, err := rel.cmd.Int64()
		require.NoError(t, err, "a release goes through")
		assert.Equal(t, int64(1), v)
		require.ErrorContains(t, acq.cmd.Err(), "OOM", "an acquire is refused")
		n, err := rc.Exists(ctx, k.x, k.f).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "nothing of the acquire was written")
	})
}

// TestBatchScriptExhaustedName: an acquire of a name with no token left,
// gathered into a batch with others, gets its own answer: no token left,
// not a failure of the batch, while the others are granted.
func TestBatchScriptExhaustedName(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	b, err := Open(context.Background(), Options{Client: c, KeyPrefix: "bx"})
	require.NoError(t, err)
	defer b.Close()
	ctx := context.Background()
	for _, mode := range []string{"x", "s"} {
		acq := func(name string) *call {
			k := b.keys(name)
			return &call{ctx: ctx, script: acquireScript, keys: []string{k.x, k.r, k.t, k.f, k.q, k.qe, k.c},
				args: []any{"l1", mode, 10000, 0, "host", "meta", 60000, ""}}
		}
		last := b.keys("last-" + mode).f
		require.NoError(t, c.Set(ctx, last, strconv.FormatUint(backend.MaxToken-1, 10), 0).Err())
		acquires := []*call{acq("before-" + mode), acq("last-" + mode), acq("after-" + mode)}
		b.batch.execOne(ctx, acquires)
		for i, want := range []int64{1, -3, 1} {
			res, err := acquires[i].cmd.Slice()
			require.NoError(t, err, "%s %d", mode, i)
			assert.Equal(t, want, res[0], "%s %d: %v", mode, i, res)
		}
		res, _ := acquires[1].cmd.Slice()
		assert.Contains(t, res[1], last, "the answer names the fence key")
		v, err := c.Get(ctx, last).Result()
		require.NoError(t, err)
		assert.Equal(t, strconv.FormatUint(backend.MaxToken-1, 10), v)
	}
}
