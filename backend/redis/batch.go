package redis

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// batcher runs the scripts of concurrent callers in shared pipelines
// (group commit): a call made while fewer than maxInFlight calls or
// pipelines are in flight goes out at once, alone, from the caller's
// goroutine; calls made while that many are in flight gather, and go out
// together in one pipeline as soon as one returns. One session pays one
// round trip, and so do a few (a slow link delays no call behind another);
// many sessions share each round trip, and Redis reads and answers them
// in one go.
type batcher struct {
	c goredis.UniversalClient

	mu       sync.Mutex
	inFlight int // calls and pipelines in flight
	queue    []*call
}

// maxInFlight is how many calls or pipelines go out before calls gather.
const maxInFlight = 4

// nodeBatchers gives each Cluster primary a batcher of its own: a primary
// that hangs holds up only the calls of its own slots, where one batcher
// for all would soon have its calls in flight all waiting on that primary,
// and the others' calls gathered behind them. Each batcher still sends
// through the cluster client, which follows MOVED and ASK when a slot has
// moved since.
type nodeBatchers struct {
	c *goredis.ClusterClient

	mu    sync.Mutex
	nodes map[string]*nodeBatcher // by the primary's address
}

// nodeBatcher is a primary's batcher and when it was last asked for.
type nodeBatcher struct {
	b    *batcher
	used time.Time
}

// of returns the batcher of the primary that serves key, as the client's
// view of the cluster has it; with no view yet (the cluster unreachable),
// the batcher of no primary, whose calls fail or go where go-redis sends
// them.
func (n *nodeBatchers) of(ctx context.Context, key string) *batcher {
	return n.at(n.primary(ctx, key), time.Now())
}

// at returns the batcher of the primary at addr, asked for at now. A new
// primary (the cluster's topology changed) first drops the batchers
// nobody asked for in the last pruneAfter, those of primaries gone or
// moved: a batcher holds no state but its calls, and one dropped while
// calls are still in flight on it lets them finish.
func (n *nodeBatchers) at(addr string, now time.Time) *batcher {
	n.mu.Lock()
	defer n.mu.Unlock()
	nb := n.nodes[addr]
	if nb == nil {
		for a, old := range n.nodes {
			if now.Sub(old.used) >= pruneAfter {
				delete(n.nodes, a)
			}
		}
		nb = &nodeBatcher{b: &batcher{c: n.c}}
		n.nodes[addr] = nb
	}
	nb.used = now
	return nb.b
}

// pruneAfter is how long a primary's batcher is kept unused.
const pruneAfter = time.Minute

// primary is the address of the primary that serves key, as the client's
// view of the cluster has it, or "" with no view yet.
func (n *nodeBatchers) primary(ctx context.Context, key string) string {
	if node, err := n.c.MasterForKey(ctx, key); err == nil {
		return node.Options().Addr
	}
	return ""
}

// call is one script run through the batcher.
type call struct {
	ctx    context.Context
	script *goredis.Script
	keys   []string
	args   []any
	cmd    *goredis.Cmd
	done   chan struct{} // closed when cmd holds the result
	// pre are releases that run just before it, in the same script call
	// where they can (see execOne): those of an acquire's name that the
	// agent answered and had not sent.
	pre []*call
}

// run runs script with keys and args and returns its command, whose Err
// and value are the result.
func (b *batcher) run(ctx context.Context, script *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	return b.runCall(ctx, &call{ctx: ctx, script: script, keys: keys, args: args})
}

// runCall runs c, and its pre before it, and returns its command.
func (b *batcher) runCall(ctx context.Context, c *call) *goredis.Cmd {
	b.mu.Lock()
	if b.inFlight < maxInFlight {
		b.inFlight++
		b.mu.Unlock()
		defer b.handOff()
		b.exec(ctx, []*call{c})
		return c.cmd
	}
	c.done = make(chan struct{})
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.cmd
	case <-ctx.Done():
		// A call still gathering is taken out: it is never sent. One a
		// pipeline took may be sent, or sent again by go-redis's retry
		// of the pipeline, until the pipeline returns (bounded by the
		// latest deadline of its calls): the caller, who treats the
		// outcome as unknown and cleans up after it (releases the lease
		// its acquire may have made, takes its ticket out), waits for
		// that, so that no send comes after its cleanup.
		b.mu.Lock()
		n := len(b.queue)
		b.queue = slices.DeleteFunc(b.queue, func(q *call) bool { return q == c })
		taken := len(b.queue) == n
		b.mu.Unlock()
		if taken {
			<-c.done
		}
		// Its pre share its outcome: unknown.
		for _, x := range withPre(c) {
			x.cmd = goredis.NewCmd(ctx)
			x.cmd.SetErr(ctx.Err())
		}
		return c.cmd
	}
}

// handOff is called when a call sent alone returns: the calls that
// gathered in the meantime go out from a goroutine of their own, so that
// its caller is not kept waiting.
func (b *batcher) handOff() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inFlight--
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	go b.drain()
}

// drain sends the gathered calls, a pipeline at a time, until none is
// left.
func (b *batcher) drain() {
	for {
		b.mu.Lock()
		batch := b.queue
		b.queue = nil
		if len(batch) == 0 {
			b.inFlight--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		// A call whose caller stopped waiting is not sent at all, and
		// its caller need not wait for the pipeline. One whose deadline
		// passed before its context says so gets the context's error
		// all the same: its caller may see done first.
		live := make([]*call, 0, len(batch))
		for _, c := range batch {
			if over(c.ctx) {
				err := c.ctx.Err()
				if err == nil {
					err = context.DeadlineExceeded
				}
				for _, c := range withPre(c) {
					c.cmd = goredis.NewCmd(c.ctx)
					c.cmd.SetErr(err)
				}
				close(c.done)
				continue
			}
			live = append(live, c)
		}
		if len(live) > 0 {
			ctx, cancel := batchContext(live)
			b.exec(ctx, live)
			cancel()
		}
		for _, c := range live {
			close(c.done)
		}
	}
}

// over tells a call whose caller stopped waiting, or whose deadline has
// passed even if its context does not say so yet.
func over(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(d)
}

// batchContext bounds a pipeline by the latest deadline of its calls; a
// call whose own deadline passes first stops waiting for the answer, and
// waits for the pipeline to return before its caller cleans up (see run).
// A call without a deadline (a release, which outlives its request) counts
// as one of releaseWait from now: it would otherwise hold the others'
// callers for as long as go-redis retries.
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	var latest, noDeadline time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			if noDeadline.IsZero() {
				noDeadline = time.Now().Add(releaseWait)
			}
			d = noDeadline
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// releaseWait bounds a gathered call without a deadline.
const releaseWait = 5 * time.Second

// exec sends batch in one pipeline by script digest, and sends again, by
// source, the calls the server had no script for (after a restart or a
// failover emptied its script cache); every script is idempotent. A call
// alone goes as a plain command, on a connection of the client's pool
// (go-redis may open a connection of its own for a pipeline).
func (b *batcher) exec(ctx context.Context, batch []*call) {
	if len(batch) == 1 && len(batch[0].pre) == 0 {
		c := batch[0]
		c.cmd = c.script.Run(ctx, b.c, c.keys, c.args...)
		return
	}
	if _, cluster := b.c.(*goredis.ClusterClient); !cluster {
		b.execOne(ctx, batch)
		return
	}
	// On Cluster, a pipeline to the primary of the batch's slots, in
	// order: a call's pre first.
	var all []*call
	for _, c := range batch {
		all = append(all, withPre(c)...)
	}
	batch = all
	p := b.c.Pipeline()
	for _, c := range batch {
		c.cmd = c.script.EvalSha(ctx, p, c.keys, c.args...)
	}
	p.Exec(ctx) // each command carries its own error
	var again []*call
	for _, c := range batch {
		if goredis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
			again = append(again, c)
		}
	}
	if len(again) == 0 {
		return
	}
	p = b.c.Pipeline()
	for _, c := range again {
		c.cmd = c.script.Eval(ctx, p, c.keys, c.args...)
	}
	p.Exec(ctx)
}

// batchPerCall bounds the requests of one batch script call, so that one
// call holds Redis for a fraction of a millisecond at most; a larger batch
// goes as several calls in one pipeline.
const batchPerCall = 64

// execOne sends batch as calls of the batch scripts, where a script's
// keys need not share a hash slot (not on Cluster): one call into Redis
// for up to batchPerCall requests instead of one per request. Releases go
// first, apart from acquires (see mayWrite): calls gathered together were
// made concurrently, and have no order to keep.
//
// An acquire's pre go just before it in its call of the acquires: one
// round trip and one script call for both, in order. That call is refused
// when Redis is out of memory, and so are they then: the acquire fails,
// and the agent sends them again on their own.
func (b *batcher) execOne(ctx context.Context, batch []*call) {
	var chunks [][]*call
	var kinds []batchScript
	for _, kind := range []batchScript{batchRelease, batchAcquire} {
		var chunk []*call
		for _, c := range batch {
			if (c.script == acquireScript) != (kind == batchAcquire) {
				continue
			}
			if len(chunk) >= batchPerCall {
				chunks, kinds = append(chunks, chunk), append(kinds, kind)
				chunk = nil
			}
			chunk = append(chunk, withPre(c)...)
		}
		if len(chunk) > 0 {
			chunks, kinds = append(chunks, chunk), append(kinds, kind)
		}
	}
	cmdArgs := make([][]any, len(chunks))
	for i, chunk := range chunks {
		cmdArgs[i] = batchCommand(kinds[i], chunk)
	}
	// send sends commands, one alone or many in one pipeline, and
	// returns them, each with its own reply or error.
	send := func(commands [][]any) []*goredis.Cmd {
		cmds := make([]*goredis.Cmd, len(commands))
		if len(commands) == 1 {
			cmds[0] = b.c.Do(ctx, commands[0]...)
			return cmds
		}
		p := b.c.Pipeline()
		for i, args := range commands {
			cmds[i] = p.Do(ctx, args...)
		}
		p.Exec(ctx) // each command carries its own error
		return cmds
	}
	// Only the calls the server had no script for go again, by source:
	// the others ran.
	var again []int
	var retry [][]any
	for i, cmd := range send(cmdArgs) {
		if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			cmdArgs[i][0], cmdArgs[i][1] = "eval", kinds[i].source
			again, retry = append(again, i), append(retry, cmdArgs[i])
			continue
		}
		setBatchResults(ctx, chunks[i], cmd)
	}
	if len(again) == 0 {
		return
	}
	for k, cmd := range send(retry) {
		setBatchResults(ctx, chunks[again[k]], cmd)
	}
}

// withPre returns c's pre, then c.
func withPre(c *call) []*call {
	if len(c.pre) == 0 {
		return []*call{c}
	}
	return append(slices.Clip(c.pre), c)
}

// batchCommand is the EVALSHA of script for batch, as the one slice
// of arguments go-redis sends as it is: its keys, then the number of
// requests and, per request, its kind ('a' acquire, 'r' release), its
// numbers of keys and of arguments, and its arguments.
func batchCommand(script batchScript, batch []*call) []any {
	nk, na := 0, 0
	for _, c := range batch {
		nk += len(c.keys)
		na += len(c.args)
	}
	cmd := make([]any, 0, 4+nk+3*len(batch)+na)
	cmd = append(cmd, "evalsha", script.Hash(), nk)
	for _, c := range batch {
		for _, k := range c.keys {
			cmd = append(cmd, k)
		}
	}
	cmd = append(cmd, len(batch))
	for _, c := range batch {
		kind := "r"
		if c.script == acquireScript {
			kind = "a"
		}
		cmd = append(cmd, kind, len(c.keys), len(c.args))
		cmd = append(cmd, c.args...)
	}
	return cmd
}

// setBatchResults gives each call of a batch script call its result.
func setBatchResults(ctx context.Context, batch []*call, cmd *goredis.Cmd) {
	res, err := cmd.Slice()
	if err == nil && len(res) != len(batch) {
		err = fmt.Errorf("batch: %d results for %d requests", len(res), len(batch))
	}
	for i, c := range batch {
		c.cmd = goredis.NewCmd(ctx)
		switch {
		case err != nil:
			c.cmd.SetErr(err)
		case isBatchFailure(res[i]):
			msg, _ := res[i].([]any)[1].(string)
			c.cmd.SetErr(fmt.Errorf("redis: %s", msg))
		default:
			c.cmd.SetVal(res[i])
		}
	}
}

// isBatchFailure tells a request that failed inside a batch script: {-9, message}.
func isBatchFailure(v any) bool {
	r, ok := v.([]any)
	if !ok || len(r) != 2 {
		return false
	}
	code, _ := r[0].(int64)
	return code == -9
}
