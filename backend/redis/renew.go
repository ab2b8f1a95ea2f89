package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockagent/lockagent/backend"
)

// renewScript renews many leases in one call: KEYS are X, R, T of each
// lease in turn; ARGV its lease id, mode and ttl ms in turn. It returns,
// per lease, 1 renewed, 0 gone (expired or released), 2 another lease
// holds the name now. An expired lease is never brought back. One call
// for many leases spares Redis the cost of a script call per lease, which
// is most of a renewal's; on Cluster, a call holds the leases of one hash
// slot. It runs when Redis is out of memory too (allow-oom): it only
// updates what exists, and a full Redis must not cost the holders their
// leases.
var renewScript = goredis.NewScript(renewSource)

const renewSource = "#!lua flags=allow-oom\n" + common + `
local function renew(X, R, T, id, mode, ttl)
  if mode == 'x' then
    -- The hot path, in two calls: X read as a holder (a key of another
    -- type fails the read, and is no holder), then extended.
    local ok, v = pcall(redis.call, 'HMGET', X, 'o', 'k')
    if not ok or not v[1] then
      if kind(R) == 'zset' and redis.call('ZCOUNT', R, clock(), '+inf') > 0 then return 2 end
      return 0
    end
    if v[1] == id and tonumber(v[2]) then
      redis.call('PEXPIRE', X, ttl)
      return 1
    end
    return 2
  end
  if kind(R) ~= 'zset' then
    if kind(X) == 'hash' then return 2 end
    return 0
  end
  local s = redis.call('ZSCORE', R, id)
  if not s then return 0 end
  if tonumber(s) < clock() then
    redis.call('ZREM', R, id)
    redis.call('HDEL', T, id)
    return 0
  end
  redis.call('ZADD', R, clock() + ttl, id)
  expire_shared(R, T)
  return 1
end
local out = {}
for i = 1, #ARGV / 3 do
  out[i] = renew(KEYS[3*i-2], KEYS[3*i-1], KEYS[3*i], ARGV[3*i-2], ARGV[3*i-1], tonumber(ARGV[3*i]))
end
return out
`

// renewHeldScript extends exclusive leases that still hold their names:
// KEYS are their X keys, ARGV each one's lease id and ttl in ms in turn.
// It returns the places (from 1) of the leases it did not renew (gone,
// taken over, or a key of another type), most often none: a lease not
// renewed goes to renewScript, which tells gone from taken over. X is the
// lease's holder when its o is the lease id: lease ids are random, and
// only lockagent writes them. Exclusive renewals are most of an agent's
// steady load: one key and two arguments per lease and no TIME cost Redis
// about a quarter less per lease than renewScript.
var renewHeldScript = goredis.NewScript(renewHeldSource)

const renewHeldSource = `
local missed = {}
for i = 1, #KEYS do
  if redis.pcall('HGET', KEYS[i], 'o') == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
  else
    missed[#missed + 1] = i
  end
end
return missed
`

const (
	// renewChunk bounds one pipeline, so that a large batch does not hold
	// a connection for long nor build one huge reply.
	renewChunk = 1000
	// renewPerCall bounds the leases of one script call, so that one call
	// holds Redis for a fraction of a millisecond at most.
	renewPerCall = 200
)

// Renew extends a batch: the leases of a chunk go in script calls of up
// to renewPerCall leases each (of one hash slot each on Cluster), all in
// one pipelined round trip. Exclusive leases go to renewHeldScript, and
// only those it did not renew to renewScript, in a second round trip. On
// Cluster, each primary's leases go apart, concurrently; the agent also
// sends each primary's renewals as a batch of its own (Part), so that a
// hung primary does not hold up the others' answers.
func (b *Backend) Renew(ctx context.Context, reqs []backend.RenewRequest) []error {
	errs := make([]error, len(reqs))
	if b.nodes != nil {
		b.renewPerNode(ctx, reqs, errs)
	} else {
		b.renewAll(ctx, reqs, errs)
	}
	return errs
}

// Part is, on Cluster, the address of the primary that serves name (see
// backend.Parted); outside Cluster, "": one server serves every name.
func (b *Backend) Part(name string) string {
	if b.nodes == nil {
		return ""
	}
	return b.nodes.primary(context.Background(), b.holderKey(name))
}

// renewAll renews reqs a chunk at a time, setting errs.
func (b *Backend) renewAll(ctx context.Context, reqs []backend.RenewRequest, errs []error) {
	sc := renewScratches.Get().(*renewScratch)
	defer renewScratches.Put(sc)
	for start := 0; start < len(reqs); start += renewChunk {
		end := min(start+renewChunk, len(reqs))
		b.renewChunk(ctx, sc, reqs[start:end], errs[start:end])
	}
}

// renewPerNode renews the leases of each primary apart, all at once: a
// primary that hangs holds up only its own leases' renewals. Sent
// together, every primary's renewals would wait for its answer, and the
// chunks and the second round trip after them would find the deadline
// passed. Each goes through the cluster client, which follows MOVED and
// ASK when a slot has moved since.
func (b *Backend) renewPerNode(ctx context.Context, reqs []backend.RenewRequest, errs []error) {
	nodeOf := map[uint16]string{} // by slot, the primary's address
	byNode := map[string][]int{}  // by primary, the leases' indexes
	for i, r := range reqs {
		slot := hashSlot(b.tag(r.Name))
		addr, ok := nodeOf[slot]
		if !ok {
			// With no view of the cluster yet, "": the renewals fail or
			// go where go-redis sends them.
			addr = b.nodes.primary(ctx, b.holderKey(r.Name))
			nodeOf[slot] = addr
		}
		byNode[addr] = append(byNode[addr], i)
	}
	if len(byNode) <= 1 {
		b.renewAll(ctx, reqs, errs)
		return
	}
	var wg sync.WaitGroup
	for _, idx := range byNode {
		wg.Go(func() {
			own := make([]backend.RenewRequest, len(idx))
			for j, i := range idx {
				own[j] = reqs[i]
			}
			ownErrs := make([]error, len(idx))
			b.renewAll(ctx, own, ownErrs)
			for j, i := range idx {
				errs[i] = ownErrs[j]
			}
		})
	}
	wg.Wait()
}

// renewScratch holds the arguments of a chunk's commands, and is used
// again for the next chunk and the next batch once their commands are
// done: an agent renewing 100,000 leases would otherwise allocate them
// anew 20,000 times a second, most of its garbage.
type renewScratch struct {
	args []any    // the commands' arguments, one after the other
	keys []string // their keys, which args point to
	ends []int    // where each key ends in the string of a command's keys
	ttls []int64  // their ttls in ms, which args point to
}

var renewScratches = sync.Pool{New: func() any { return new(renewScratch) }}

// reset empties sc for the next chunk, dropping what it points to.
func (sc *renewScratch) reset() {
	clear(sc.args)
	clear(sc.keys)
	sc.args, sc.keys, sc.ends, sc.ttls = sc.args[:0], sc.keys[:0], sc.ends[:0], sc.ttls[:0]
}

func (b *Backend) renewChunk(ctx context.Context, sc *renewScratch, reqs []backend.RenewRequest, errs []error) {
	defer sc.reset()
	all := make([]int, len(reqs))
	for i := range all {
		all[i] = i
	}
	missed := b.runRenewals(ctx, sc, reqs, b.renewCalls(reqs, all, true), errs)
	if len(missed) > 0 {
		b.runRenewals(ctx, sc, reqs, b.renewCalls(reqs, missed, false), errs)
	}
}

// renewCall is one script call.
type renewCall struct {
	held bool  // a renewHeldScript call, of exclusive leases
	idx  []int // the leases' indexes in the chunk
}

// renewCalls groups the leases idx of a chunk into script calls: with
// held, exclusive leases into renewHeldScript calls; the others into
// renewScript calls. On Cluster a call holds the leases of one slot.
func (b *Backend) renewCalls(reqs []backend.RenewRequest, idx []int, held bool) []renewCall {
	type group struct {
		slot uint16
		held bool
	}
	_, cluster := b.c.(*goredis.ClusterClient)
	var calls []renewCall
	open := map[group]int{} // the call of each group still filling
	for _, i := range idx {
		r := reqs[i]
		var g group
		g.held = held && r.Mode == backend.Exclusive
		if cluster {
			g.slot = hashSlot(b.tag(r.Name))
		}
		j, ok := open[g]
		if !ok || len(calls[j].idx) == renewPerCall {
			j = len(calls)
			open[g] = j
			calls = append(calls, renewCall{held: g.held})
		}
		calls[j].idx = append(calls[j].idx, i)
	}
	return calls
}

// runRenewals sends calls in one pipeline, sending again by source the
// calls the server had no script for, sets the errors of their leases and
// returns the exclusive leases that renewHeldScript did not renew.
func (b *Backend) runRenewals(ctx context.Context, sc *renewScratch, reqs []backend.RenewRequest, calls []renewCall, errs []error) (missed []int) {
	cmds := b.sendRenewals(ctx, sc, reqs, calls, false)
	var again []renewCall
	for j, c := range cmds {
		if goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			again = append(again, calls[j])
			continue
		}
		missed = b.renewResults(reqs, calls[j], c, errs, missed)
	}
	if len(again) == 0 {
		return missed
	}
	// The server lost its scripts (a restart, a failover): what failed
	// goes again by EVAL, which also caches the script for the next
	// EVALSHA; a renewal is idempotent. Only the server that lost them is
	// asked again: on Cluster, the other primaries are not waited for.
	for j, c := range b.sendRenewals(ctx, sc, reqs, again, true) {
		missed = b.renewResults(reqs, again[j], c, errs, missed)
	}
	return missed
}

// sendRenewals sends calls in one pipeline, by EVALSHA or, with eval, by
// EVAL, and returns their commands, each with its own reply or error.
func (b *Backend) sendRenewals(ctx context.Context, sc *renewScratch, reqs []backend.RenewRequest, calls []renewCall, eval bool) []*goredis.Cmd {
	cmds := make([]*goredis.Cmd, len(calls))
	p := b.c.Pipeline()
	for j, call := range calls {
		cmds[j] = p.Do(ctx, b.renewCommand(sc, reqs, call, eval)...)
	}
	p.Exec(ctx) // each command carries its own error
	return cmds
}

// renewCommand is the EVALSHA (with eval, the EVAL) of call, as the one
// slice of arguments go-redis sends as it is, in sc: renewHeldScript's, or
// renewScript's. Its keys are slices of one string, and its strings and
// numbers go as pointers (into sc and reqs), which go-redis writes as
// their values: a string or a number in an interface would cost an
// allocation per lease.
func (b *Backend) renewCommand(sc *renewScratch, reqs []backend.RenewRequest, call renewCall, eval bool) []any {
	script, src := renewScript, renewSource
	suffixes := []string{"", ":r", ":t"} // keys X, R, T
	if call.held {
		script, src = renewHeldScript, renewHeldSource
		suffixes = suffixes[:1] // key X
	}
	nk := len(suffixes) * len(call.idx)
	size := 0
	for _, i := range call.idx {
		size += len(suffixes) * (len(b.prefix) + len(reqs[i].Name) + 8)
	}
	var all strings.Builder
	all.Grow(size)
	sc.ends = sc.ends[:0]
	for _, i := range call.idx {
		tag := b.tag(reqs[i].Name)
		for _, suffix := range suffixes {
			// As holderKey, then its R and T.
			all.WriteString(b.prefix)
			all.WriteString(":lk:{")
			all.WriteString(tag)
			all.WriteString("}")
			all.WriteString(suffix)
			sc.ends = append(sc.ends, all.Len())
		}
	}
	// Where sc's slices grow, the pointers already taken keep pointing
	// into their former arrays, which stay as they were.
	start := len(sc.args)
	if eval {
		sc.args = append(sc.args, "eval", src, nk)
	} else {
		sc.args = append(sc.args, "evalsha", script.Hash(), nk)
	}
	keys, from := all.String(), 0
	for _, end := range sc.ends {
		sc.keys = append(sc.keys, keys[from:end])
		sc.args = append(sc.args, &sc.keys[len(sc.keys)-1])
		from = end
	}
	// Per lease, the arguments are its id and ttl (renewHeldScript), or
	// its id, mode and ttl (renewScript).
	for _, i := range call.idx {
		r := &reqs[i]
		sc.ttls = append(sc.ttls, r.TTL.Milliseconds())
		ttl := &sc.ttls[len(sc.ttls)-1]
		switch {
		case call.held:
			sc.args = append(sc.args, &r.LeaseID, ttl)
		case r.Mode == backend.Shared:
			sc.args = append(sc.args, &r.LeaseID, "s", ttl)
		default:
			sc.args = append(sc.args, &r.LeaseID, "x", ttl)
		}
	}
	return sc.args[start:len(sc.args):len(sc.args)]
}

// renewResults sets the errors of a call's leases from its reply, and
// returns missed with the leases of a held call that it did not renew.
func (b *Backend) renewResults(reqs []backend.RenewRequest, call renewCall, c *goredis.Cmd, errs []error, missed []int) []int {
	vals, err := c.Int64Slice()
	if err == nil && call.held {
		return b.heldResults(reqs, call, vals, errs, missed)
	}
	if err == nil && len(vals) != len(call.idx) {
		err = fmt.Errorf("renew: %d results for %d leases", len(vals), len(call.idx))
	}
	for j, i := range call.idx {
		r := reqs[i]
		switch {
		case err != nil:
			errs[i] = b.fail("renew", r.Name, err)
		case vals[j] == 1:
			errs[i] = nil
		case vals[j] == 2:
			errs[i] = fmt.Errorf("renew %q: %w", r.Name, backend.ErrTakenOver)
		default:
			errs[i] = fmt.Errorf("renew %q: %w", r.Name, backend.ErrNotHeld)
		}
	}
	return missed
}

// heldResults reads a renewHeldScript call's reply, the places of the
// leases it did not renew: the others are renewed.
func (b *Backend) heldResults(reqs []backend.RenewRequest, call renewCall, places []int64, errs []error, missed []int) []int {
	for _, p := range places {
		if p < 1 || p > int64(len(call.idx)) {
			err := fmt.Errorf("renew: lease %d of a call of %d", p, len(call.idx))
			for _, i := range call.idx {
				errs[i] = b.fail("renew", reqs[i].Name, err)
			}
			return missed
		}
	}
	for _, i := range call.idx {
		errs[i] = nil
	}
	for _, p := range places {
		missed = append(missed, call.idx[p-1])
	}
	return missed
}

// hashSlot is Redis Cluster's slot of a hash tag: CRC16 (XMODEM) mod 16384.
func hashSlot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
