package redis

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockagent/lockagent/backend"
)

// renewScript renews many leases in one call: KEYS are X, R, T of each
// lease in turn; ARGV its lease id, mode and ttl ms in turn. It returns,
// per lease, 1 renewed, 0 gone (expired or released), 2 another lease
// holds the name now. An expired lease is never brought back. One call
// for many leases spares Redis the cost of a script call per lease, which
// is most of a renewal's; on Cluster, a call holds the leases of one hash
// slot.
var renewScript = goredis.NewScript(common + `
local function renew(X, R, T, id, mode, ttl)
  if mode == 'x' then
    -- The hot path, in two calls: X read as a holder (a key of another
    -- type fails the read, and is no holder), then extended.
    local ok, v = pcall(redis.call, 'HMGET', X, 'o', 'k')
    if not ok or not v[1] then
      if kind(R) == 'zset' and redis.call('ZCOUNT', R, now, '+inf') > 0 then return 2 end
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
  if tonumber(s) < now then
    redis.call('ZREM', R, id)
    redis.call('HDEL', T, id)
    return 0
  end
  redis.call('ZADD', R, now + ttl, id)
  expire_shared(R, T)
  return 1
end
local out = {}
for i = 1, #ARGV / 3 do
  out[i] = renew(KEYS[3*i-2], KEYS[3*i-1], KEYS[3*i], ARGV[3*i-2], ARGV[3*i-1], tonumber(ARGV[3*i]))
end
return out
`)

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
// one pipelined round trip (per node on Cluster).
func (b *Backend) Renew(ctx context.Context, reqs []backend.RenewRequest) []error {
	errs := make([]error, len(reqs))
	for start := 0; start < len(reqs); start += renewChunk {
		end := min(start+renewChunk, len(reqs))
		b.renewChunk(ctx, reqs[start:end], errs[start:end])
	}
	return errs
}

// renewCall is one script call: the indexes of its leases in the chunk.
type renewCall []int

// renewCalls groups the leases of a chunk into script calls.
func (b *Backend) renewCalls(reqs []backend.RenewRequest) []renewCall {
	var calls []renewCall
	if _, cluster := b.c.(*goredis.ClusterClient); !cluster {
		for start := 0; start < len(reqs); start += renewPerCall {
			call := make(renewCall, 0, min(renewPerCall, len(reqs)-start))
			for i := start; i < min(start+renewPerCall, len(reqs)); i++ {
				call = append(call, i)
			}
			calls = append(calls, call)
		}
		return calls
	}
	open := map[uint16]int{} // slot -> its call still filling
	for i, r := range reqs {
		slot := hashSlot(b.tag(r.Name))
		j, ok := open[slot]
		if !ok || len(calls[j]) == renewPerCall {
			j = len(calls)
			open[slot] = j
			calls = append(calls, nil)
		}
		calls[j] = append(calls[j], i)
	}
	return calls
}

func (b *Backend) renewChunk(ctx context.Context, reqs []backend.RenewRequest, errs []error) {
	calls := b.renewCalls(reqs)
	run := func(calls []renewCall, eval func(p goredis.Pipeliner, k []string, args ...any) *goredis.Cmd) []*goredis.Cmd {
		cmds := make([]*goredis.Cmd, len(calls))
		p := b.c.Pipeline()
		for j, call := range calls {
			keys := make([]string, 0, 3*len(call))
			args := make([]any, 0, 3*len(call))
			for _, i := range call {
				r := reqs[i]
				x, rk, t := b.holderKeys(r.Name)
				keys = append(keys, x, rk, t)
				args = append(args, r.LeaseID, modeArg(r.Mode), r.TTL.Milliseconds())
			}
			cmds[j] = eval(p, keys, args...)
		}
		p.Exec(ctx) // each command carries its own error
		return cmds
	}
	cmds := run(calls, func(p goredis.Pipeliner, k []string, args ...any) *goredis.Cmd {
		return renewScript.EvalSha(ctx, p, k, args...)
	})
	var again []renewCall
	for j, c := range cmds {
		if goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			again = append(again, calls[j])
			continue
		}
		b.renewResults(reqs, calls[j], c, errs)
	}
	if len(again) == 0 {
		return
	}
	// The server lost its scripts (a restart, a failover): load them and
	// send again what failed; a renewal is idempotent.
	if err := b.loadScripts(ctx); err != nil {
		for _, call := range again {
			for _, i := range call {
				errs[i] = b.fail("renew", reqs[i].Name, err)
			}
		}
		return
	}
	cmds = run(again, func(p goredis.Pipeliner, k []string, args ...any) *goredis.Cmd {
		return renewScript.Eval(ctx, p, k, args...)
	})
	for j, c := range cmds {
		b.renewResults(reqs, again[j], c, errs)
	}
}

// renewResults sets the errors of a call's leases from its reply.
func (b *Backend) renewResults(reqs []backend.RenewRequest, call renewCall, c *goredis.Cmd, errs []error) {
	vals, err := c.Int64Slice()
	if err == nil && len(vals) != len(call) {
		err = fmt.Errorf("renew: %d results for %d leases", len(vals), len(call))
	}
	for j, i := range call {
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
