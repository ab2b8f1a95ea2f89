package redis

import goredis "github.com/redis/go-redis/v9"

// The scripts run atomically on the server, each with every key it touches
// in KEYS (Cluster needs that), and each is idempotent for a lease id, so
// that a retry after a lost reply is safe. Time comes from the server's
// TIME, never from the agent. The keys of one name (see keys) are:
//
//	X  HASH    the exclusive holder: o (lease id), k (token), h (host),
//	           m (meta); PEXPIRE ttl
//	R  ZSET    shared holders: leaseID scored by expiry (server ms)
//	T  HASH    shared holders: leaseID -> "token|host|meta"
//	F  STRING  the last fencing token, kept for fenceTTL after each grant
//	Q  ZSET    the waiters' queue: "<mode>:<ticket>" scored by arrival
//	QE ZSET    the same members scored by expiry (server ms)
//	C          the channel a release publishes on: the tickets that may
//	           ask now (space-separated), or "*" when nobody queues
//
// A lease is alive while now <= expiry. Numbers are formatted with %d:
// Lua 5.1's default formatting loses digits above 1e14.

// common is prepended to every script.
const common = `
-- clock is the server's time in ms, read once per call and only when a
-- script needs it: a call into Redis costs more than TIME itself, and an
-- exclusive release or renewal needs no time.
local t, now
local function clock()
  if not now then
    t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
local function kind(k) return redis.call('TYPE', k).ok end
-- owner returns the lease id holding X and its token, or nil when X is
-- not a holder lockagent wrote.
local function owner(X)
  local v = redis.call('HMGET', X, 'o', 'k')
  if not v[1] or not v[2] or not tonumber(v[2]) then return nil end
  return v[1], tonumber(v[2])
end
local function expire_shared(R, T)
  local top = redis.call('ZRANGE', R, -1, -1, 'WITHSCORES')
  if #top == 0 then redis.call('DEL', R, T) return end
  redis.call('PEXPIREAT', R, top[2])
  redis.call('PEXPIREAT', T, top[2])
end
-- prune_queue drops the tickets that expired; it returns how many.
local function prune_queue(Q, QE)
  local dead = redis.call('ZRANGEBYSCORE', QE, '-inf', string.format('(%d', clock()), 'LIMIT', 0, 256)
  if #dead > 0 then
    redis.call('ZREM', Q, unpack(dead))
    redis.call('ZREM', QE, unpack(dead))
  end
  return #dead
end
-- head_group is the members at the head of the queue, who may ask: the
-- first, and every shared one after a shared first (256 at most).
local function head_group(Q)
  local first = redis.call('ZRANGE', Q, 0, 255)
  local out = {}
  for i, m in ipairs(first) do
    if i > 1 and (string.sub(m, 1, 1) ~= 's' or string.sub(first[1], 1, 1) ~= 's') then break end
    out[i] = m
  end
  return out
end
-- wake tells the waiters at the head of the queue, on every agent, that
-- they may ask: it publishes their tickets, or '*' when nobody queues.
-- A PUBLISH comes after the script's writes, and a user without the
-- channels (an ACL) must not fail them: the waiters then wake at their
-- next poll.
local function wake(Q, C)
  local g = head_group(Q)
  if #g == 0 then
    redis.pcall('PUBLISH', C, '*')
    return
  end
  for i, m in ipairs(g) do g[i] = string.sub(m, 3) end
  redis.pcall('PUBLISH', C, table.concat(g, ' '))
end
-- expire_queue keeps the queue's keys as long as its last ticket.
local function expire_queue(Q, QE)
  local top = redis.call('ZRANGE', QE, -1, -1, 'WITHSCORES')
  if #top == 0 then
    redis.call('DEL', Q, QE)
    return
  end
  redis.call('PEXPIREAT', Q, top[2])
  redis.call('PEXPIREAT', QE, top[2])
end
local function prune(R, T)
  local dead = redis.call('ZRANGEBYSCORE', R, '-inf', string.format('(%d', clock()), 'LIMIT', 0, 256)
  if #dead > 0 then
    redis.call('ZREM', R, unpack(dead))
    redis.call('HDEL', T, unpack(dead))
  end
end
`

// The flags of the scripts that write. A script with flags is refused
// whole, before it runs, by a replica (READONLY: an old primary after a
// failover, for the client to send again to the new one) and, unless it
// may run out of memory, by a server out of memory; one without them
// would answer a release or a try from a replica's stale data, and run
// past Redis's memory check once its first write passed it. Releases (and
// renewals) must go through when Redis is full, for the memory they free
// and the locks they keep; acquires must not.
const (
	mayWrite    = "#!lua\n"
	mayWriteOOM = "#!lua flags=allow-oom\n"
)

// fast holds the scripts' fast paths: an exclusive acquire of a free name
// that nobody queues for, and an exclusive release with nobody queued,
// most of a fleet's traffic. They come first in a script and return early
// with no helper defined: a script defines its helpers anew on every call,
// and the Lua this spares cost Redis about as much as the commands. They
// read their keys and arguments in place (k and a are where a request's
// start in KEYS and ARGV; the caller checks their counts), and answer nil
// for anything else, which the general functions then handle, from the
// start.
const fast = `
local fast_us
local function fast_acquire(k, a)
  if ARGV[a + 1] ~= 'x' then return nil end
  local X, F = KEYS[k], KEYS[k + 3]
  if redis.call('EXISTS', X, KEYS[k + 1], KEYS[k + 2], KEYS[k + 4], KEYS[k + 5]) ~= 0 then return nil end
  local lastv = redis.pcall('GET', F)
  local last = 0
  if lastv then
    if type(lastv) ~= 'string' or not string.match(lastv, '^%d+$') then return nil end
    last = tonumber(lastv)
  end
  if not fast_us then
    local t = redis.call('TIME')
    fast_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  -- No token left below MaxToken: the general path says why.
  local tok = math.max(last + 1, fast_us)
  if tok >= ` + maxToken + ` then return nil end
  tok = string.format('%d', tok)
  redis.call('SET', F, tok, 'PX', ARGV[a + 6])
  redis.call('HSET', X, 'o', ARGV[a], 'k', tok, 'h', ARGV[a + 4], 'm', ARGV[a + 5])
  redis.call('PEXPIRE', X, ARGV[a + 2])
  return {1, tonumber(tok)}
end
local function fast_release(k, a)
  if ARGV[a + 1] ~= 'x' or redis.call('EXISTS', KEYS[k + 4]) ~= 0 then return nil end
  local X = KEYS[k]
  local v = redis.pcall('HMGET', X, 'o', 'k')
  if v[1] == nil or v[1] ~= ARGV[a] or not tonumber(v[2]) then return nil end
  redis.call('DEL', X)
  redis.pcall('PUBLISH', KEYS[k + 3], '*')
  return 1
end
`

// acquireScript: KEYS X R T F Q QE C; ARGV leaseID, mode (x|s), ttl ms,
// limit (0: none), host, meta, fence ttl ms, ticket (empty for a try).
// Returns {1, token} granted, {0, retry ms} held (a ticket is then in the
// queue), {-1, 0} the lease id holds the name in the other mode, {-2, key}
// a key lockagent did not write, {-3, why} no token is left below
// backend.MaxToken.
var acquireScript = goredis.NewScript(mayWrite + fast + `
local r = #KEYS == 7 and #ARGV == 8 and fast_acquire(1, 1)
if r then return r end
` + common + acquireFn + `
return acquire(KEYS, ARGV)
`)

// ticketLifeMs is backend.TicketLife in milliseconds, for the scripts.
const ticketLifeMs = "5000"

// maxToken is backend.MaxToken, for the scripts: every token is below it.
// A double holds every whole number up to it exactly, so Lua's numbers
// compare tokens exactly up to there.
const maxToken = "9007199254740991"

// acquireFn is the acquire script as a function of its keys and
// arguments, so that a batch (batchScript) can call it once per request.
const acquireFn = `
local function acquire(KEYS, ARGV)
local X, R, T, F, Q, QE, C = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local id, mode, ttl, limit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
-- Each call into Redis costs more than the command it runs: a free name
-- (the common case) is told by one EXISTS, and the keys' types are looked
-- at only when some exist.
local kx, kr, kq = 'none', 'none', 'none'
if redis.call('EXISTS', X, R, T, Q, QE) > 0 then
  local kt, kqe
  kx, kr, kt, kq, kqe = kind(X), kind(R), kind(T), kind(Q), kind(QE)
  if kx ~= 'none' and kx ~= 'hash' then return {-2, X} end
  if kr ~= 'none' and kr ~= 'zset' then return {-2, R} end
  if kt ~= 'none' and kt ~= 'hash' then return {-2, T} end
  if kq ~= 'none' and kq ~= 'zset' then return {-2, Q} end
  if kqe ~= 'none' and kqe ~= 'zset' then return {-2, QE} end
end
-- F: a key of another type fails the GET; a token is a whole number.
local ok, lastv = pcall(redis.call, 'GET', F)
if not ok then return {-2, F} end
local last = 0
if lastv then
  if not string.match(lastv, '^%d+$') then return {-2, F} end
  last = tonumber(lastv)
end
-- fence writes and returns the next token: above the last, and no lower
-- than the server's time in µs, which keeps tokens increasing when F is
-- lost. A token stays below maxToken: with none left there, because of
-- the last token or of a clock past the year 2255, it writes nothing and
-- returns nil and why. Only a grant mints a token, so a name that is
-- held, or a repeated grant, answers as ever.
local function fence()
  clock()
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local tok = math.max(last + 1, us)
  if tok >= ` + maxToken + ` then
    if last + 1 >= ` + maxToken + ` then return nil, F .. ' leaves no token below 2^53-1' end
    return nil, 'the server clock, ' .. t[1] .. ' s after 1970, is past 2255-06-05, when tokens (never below its time in microseconds) reach 2^53-1'
  end
  redis.call('SET', F, string.format('%d', tok), 'PX', ARGV[7])
  return tok
end
local rec = string.format('|%s|%s', ARGV[5], ARGV[6])

-- The queue: a try may go only when nobody queues; a waiter when its
-- ticket heads the queue (see head_group), or nobody queues. Otherwise,
-- and when the holders deny it, a waiter's ticket joins the queue's tail
-- or renews its place.
local member = ''
if ARGV[8] ~= '' then member = mode .. ':' .. ARGV[8] end
local queued, rank = 0, nil
if kq == 'zset' then
  if prune_queue(Q, QE) > 0 then wake(Q, C) end
  queued = redis.call('ZCARD', Q)
  if member ~= '' then rank = redis.call('ZRANK', Q, member) end
end
local function held(retry)
  if member ~= '' then
    if not rank then
      local last = redis.call('ZRANGE', Q, -1, -1, 'WITHSCORES')
      local seq = 1
      if #last > 0 then seq = tonumber(last[2]) + 1 end
      redis.call('ZADD', Q, seq, member)
    end
    redis.call('ZADD', QE, clock() + math.min(ttl, ` + ticketLifeMs + `), member)
    expire_queue(Q, QE)
  end
  return {0, math.max(retry, 1)}
end
local function granted(tok)
  if rank then
    redis.call('ZREM', Q, member)
    redis.call('ZREM', QE, member)
    expire_queue(Q, QE)
  end
  return {1, tok}
end

if kx == 'hash' then
  local hid, htok = owner(X)
  if not hid then return {-2, X} end
  if hid ~= id then return held(redis.call('PTTL', X)) end
  if mode ~= 'x' then return {-1, 0} end
  redis.call('PEXPIRE', X, ttl)
  return granted(htok)
end
if mode == 's' then
  local mine = redis.call('ZSCORE', R, id)
  if mine and tonumber(mine) >= clock() then
    local tok = string.match(redis.call('HGET', T, id) or '', '^(%d+)|')
    if tok then
      redis.call('ZADD', R, clock() + ttl, id)
      expire_shared(R, T)
      return granted(tonumber(tok))
    end
  end
elseif kr == 'zset' and redis.call('ZSCORE', R, id) then
  return {-1, 0}
end

-- ahead: the shared tickets before this one at the head, whose places
-- under a limit come first.
local ahead, first = -1, nil
if queued > 0 then
  local g = head_group(Q)
  for i, m in ipairs(g) do
    if m == member then ahead = i - 1 end
  end
  first = g[1]
  if ahead < 0 then
    return held((tonumber(redis.call('ZSCORE', QE, first)) or clock()) - clock())
  end
end

if mode == 'x' then
  if kr == 'zset' then
    prune(R, T)
    local top = redis.call('ZRANGE', R, -1, -1, 'WITHSCORES')
    if #top > 0 then return held(tonumber(top[2]) - clock()) end
    redis.call('DEL', R, T)
  end
  local tok, why = fence()
  if not tok then return {-3, why} end
  redis.call('HSET', X, 'o', id, 'k', string.format('%d', tok), 'h', ARGV[5], 'm', ARGV[6])
  redis.call('PEXPIRE', X, ttl)
  return granted(tok)
end

prune(R, T)
if limit > 0 then
  local live = redis.call('ZRANGEBYSCORE', R, clock(), '+inf', 'WITHSCORES')
  if #live / 2 + math.max(ahead, 0) >= limit then
    if #live > 0 then return held(tonumber(live[2]) - clock()) end
    return held((tonumber(redis.call('ZSCORE', QE, first)) or clock()) - clock())
  end
end
local tok, why = fence()
if not tok then return {-3, why} end
redis.call('ZADD', R, clock() + ttl, id)
redis.call('HSET', T, id, string.format('%d', tok) .. rec)
expire_shared(R, T)
return granted(tok)
end
`

// releaseScript: KEYS X R T C Q QE; ARGV leaseID, mode.
// Returns 1 released, 0 not held by that lease. A release wakes the
// waiters at the head of the queue, on every agent (wake).
var releaseScript = goredis.NewScript(mayWriteOOM + fast + `
local r = #KEYS == 6 and #ARGV == 2 and fast_release(1, 1)
if r then return r end
` + common + releaseFn + `
return release(KEYS, ARGV)
`)

// releaseFn is the release script as a function; see acquireFn.
const releaseFn = `
local function release(KEYS, ARGV)
local X, R, T, C, Q, QE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, mode = ARGV[1], ARGV[2]
local kq = 'none'
if redis.call('EXISTS', Q) == 1 then kq = kind(Q) end
if kq == 'zset' then prune_queue(Q, QE) end
-- With nobody queued, wake has nobody to name.
local function wake_queue()
  if kq == 'zset' then wake(Q, C) else redis.pcall('PUBLISH', C, '*') end
end
if mode == 'x' then
  -- X read as a holder (a key of another type fails the read).
  local ok, v = pcall(redis.call, 'HMGET', X, 'o', 'k')
  if ok and v[1] == id and tonumber(v[2]) then
    redis.call('DEL', X)
    wake_queue()
    return 1
  end
  return 0
end
if kind(R) ~= 'zset' then return 0 end
local s = redis.call('ZSCORE', R, id)
if not s then return 0 end
redis.call('ZREM', R, id)
redis.call('HDEL', T, id)
prune(R, T)
expire_shared(R, T)
if tonumber(s) < clock() then return 0 end
wake_queue()
return 1
end
`

// The batch scripts run the acquires, or the releases, a group commit
// gathered, in one call, so that their fixed cost (the call, its parsing,
// the script's set-up) is paid once: KEYS are the requests' keys in turn;
// ARGV[1] is the number of requests, then per request its kind ('a'
// acquire, 'r' release), its number of keys and of arguments, and its
// arguments. They return per request what its own script returns, or {-9,
// message} when it failed, without failing the others; a replica, or a
// server out of memory for acquires, refuses the whole call. Acquires and
// releases go apart, for their flags (see mayWrite). They run only where
// all their keys may be in one call: not on Cluster.
var (
	batchAcquire = batchScript{goredis.NewScript(mayWrite + batchSource), mayWrite + batchSource}
	batchRelease = batchScript{goredis.NewScript(mayWriteOOM + batchSource), mayWriteOOM + batchSource}
)

// batchScript is a batch script and its source, sent when the server
// does not have it.
type batchScript struct {
	*goredis.Script
	source string
}

// batchSource is the batch scripts' source. The general functions are
// defined on the first request that needs them (general): a batch of
// fast-path requests, the common one, spares the Lua that defines them,
// a tenth of Redis's time for a release and an acquire in one call.
const batchSource = fast + `
local funcs
local function general()
  if not funcs then
` + common + acquireFn + releaseFn + `
    funcs = {a = acquire, r = release}
  end
  return funcs
end
local out = {}
local ki, ai = 1, 2
for i = 1, tonumber(ARGV[1]) do
  local kind, nk, na = ARGV[ai], tonumber(ARGV[ai + 1]), tonumber(ARGV[ai + 2])
  local k0, a0 = ki, ai + 3
  ki, ai = ki + nk, ai + 3 + na
  local ok, res = true, nil
  if kind == 'a' then
    if nk == 7 and na == 8 then ok, res = pcall(fast_acquire, k0, a0) end
  elseif nk == 6 and na == 2 then
    ok, res = pcall(fast_release, k0, a0)
  end
  if ok and res == nil then
    ok, res = pcall(general()[kind == 'a' and 'a' or 'r'], {unpack(KEYS, k0, k0 + nk - 1)}, {unpack(ARGV, a0, a0 + na - 1)})
  end
  if ok then
    out[i] = res
  else
    local msg = res
    if type(res) == 'table' then msg = res.err end
    msg = tostring(msg)
    out[i] = {-9, msg}
  end
end
return out
`

// leaveScript: KEYS Q QE C; ARGV ticket.
// Returns 1 when the ticket was queued, 0 otherwise. When the head of the
// queue may have changed, the waiters there are woken.
var leaveScript = goredis.NewScript(common + `
local Q, QE, C = KEYS[1], KEYS[2], KEYS[3]
if kind(Q) ~= 'zset' then return 0 end
local member = 'x:' .. ARGV[1]
local rank = redis.call('ZRANK', Q, member)
if not rank then
  member = 's:' .. ARGV[1]
  rank = redis.call('ZRANK', Q, member)
end
if not rank then return 0 end
local g = head_group(Q)
redis.call('ZREM', Q, member)
redis.call('ZREM', QE, member)
expire_queue(Q, QE)
if rank <= #g then wake(Q, C) end
return 1
`)

// inspectScript: KEYS X R T F QE. Read-only: it prunes nothing.
// Returns {last token, live tickets queued, mode ('x', 's' or ”), then per
// live holder: leaseID, token, host, meta, ms to expiry}.
var inspectScript = goredis.NewScript(`#!lua flags=no-writes
` + common + `
local X, R, T, F, QE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local last = 0
if kind(F) == 'string' then last = tonumber(redis.call('GET', F)) or 0 end
local queued = 0
if kind(QE) == 'zset' then queued = redis.call('ZCOUNT', QE, clock(), '+inf') end
if kind(X) == 'hash' then
  local v = redis.call('HMGET', X, 'o', 'k', 'h', 'm')
  return {last, queued, 'x', v[1] or '', tonumber(v[2]) or 0, v[3] or '', v[4] or '', redis.call('PTTL', X)}
end
local out = {last, queued, ''}
if kind(R) == 'zset' and kind(T) == 'hash' then
  local live = redis.call('ZRANGEBYSCORE', R, clock(), '+inf', 'WITHSCORES')
  for i = 1, #live, 2 do
    local rec = redis.call('HGET', T, live[i]) or ''
    local tok, host, meta = string.match(rec, '^(%d+)|([^|]*)|(.*)$')
    out[3] = 's'
    table.insert(out, live[i])
    table.insert(out, tonumber(tok) or 0)
    table.insert(out, host or '')
    table.insert(out, meta or '')
    table.insert(out, tonumber(live[i + 1]) - clock())
  end
end
return out
`)

var scripts = []*goredis.Script{acquireScript, renewScript, renewHeldScript, releaseScript, leaveScript, inspectScript, batchAcquire.Script, batchRelease.Script}
