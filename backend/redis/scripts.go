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
//	C          the channel a release publishes on
//
// A lease is alive while now <= expiry. Numbers are formatted with %d:
// Lua 5.1's default formatting loses digits above 1e14.

// common is prepended to every script.
const common = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
local function prune(R, T)
  local dead = redis.call('ZRANGEBYSCORE', R, '-inf', string.format('(%d', now), 'LIMIT', 0, 256)
  if #dead > 0 then
    redis.call('ZREM', R, unpack(dead))
    redis.call('HDEL', T, unpack(dead))
  end
end
`

// acquireScript: KEYS X R T F; ARGV leaseID, mode (x|s), ttl ms, limit
// (0: none), host, meta, fence ttl ms.
// Returns {1, token} granted, {0, retry ms} held, {-1, 0} the lease id
// holds the name in the other mode, {-2, key} a key lockagent did not write.
var acquireScript = goredis.NewScript(common + `
local X, R, T, F = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, mode, ttl, limit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local kx, kr, kt, kf = kind(X), kind(R), kind(T), kind(F)
if kx ~= 'none' and kx ~= 'hash' then return {-2, X} end
if kr ~= 'none' and kr ~= 'zset' then return {-2, R} end
if kt ~= 'none' and kt ~= 'hash' then return {-2, T} end
if kf ~= 'none' and kf ~= 'string' then return {-2, F} end
local last = 0
if kf == 'string' then
  last = tonumber(redis.call('GET', F))
  if not last then return {-2, F} end
end
local function fence()
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local tok = math.max(last + 1, us)
  redis.call('SET', F, string.format('%d', tok), 'PX', ARGV[7])
  return tok
end
local rec = string.format('|%s|%s', ARGV[5], ARGV[6])

if kx == 'hash' then
  local hid, htok = owner(X)
  if not hid then return {-2, X} end
  if hid ~= id then return {0, redis.call('PTTL', X)} end
  if mode ~= 'x' then return {-1, 0} end
  redis.call('PEXPIRE', X, ttl)
  return {1, htok}
end

if mode == 'x' then
  if kr == 'zset' then
    if redis.call('ZSCORE', R, id) then return {-1, 0} end
    prune(R, T)
    local top = redis.call('ZRANGE', R, -1, -1, 'WITHSCORES')
    if #top > 0 then return {0, tonumber(top[2]) - now} end
    redis.call('DEL', R, T)
  end
  local tok = fence()
  redis.call('HSET', X, 'o', id, 'k', string.format('%d', tok), 'h', ARGV[5], 'm', ARGV[6])
  redis.call('PEXPIRE', X, ttl)
  return {1, tok}
end

local mine = redis.call('ZSCORE', R, id)
if mine and tonumber(mine) >= now then
  local tok = string.match(redis.call('HGET', T, id) or '', '^(%d+)|')
  if tok then
    redis.call('ZADD', R, now + ttl, id)
    expire_shared(R, T)
    return {1, tonumber(tok)}
  end
end
prune(R, T)
if limit > 0 then
  local live = redis.call('ZRANGEBYSCORE', R, now, '+inf', 'WITHSCORES')
  if #live / 2 >= limit then return {0, tonumber(live[2]) - now} end
end
local tok = fence()
redis.call('ZADD', R, now + ttl, id)
redis.call('HSET', T, id, string.format('%d', tok) .. rec)
expire_shared(R, T)
return {1, tok}
`)

// releaseScript: KEYS X R T C; ARGV leaseID, mode.
// Returns 1 released, 0 not held by that lease. A release publishes on C so
// that waiters, on every agent, try again at once.
var releaseScript = goredis.NewScript(common + `
local X, R, T, C = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, mode = ARGV[1], ARGV[2]
if mode == 'x' then
  if kind(X) == 'hash' and owner(X) == id then
    redis.call('DEL', X)
    redis.call('PUBLISH', C, 'x')
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
if tonumber(s) < now then return 0 end
redis.call('PUBLISH', C, 's')
return 1
`)

// inspectScript: KEYS X R T F. Read-only: it prunes nothing.
// Returns {last token, mode ('x', 's' or ”), then per live holder:
// leaseID, token, host, meta, ms to expiry}.
var inspectScript = goredis.NewScript(`#!lua flags=no-writes
` + common + `
local X, R, T, F = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local last = 0
if kind(F) == 'string' then last = tonumber(redis.call('GET', F)) or 0 end
if kind(X) == 'hash' then
  local v = redis.call('HMGET', X, 'o', 'k', 'h', 'm')
  return {last, 'x', v[1] or '', tonumber(v[2]) or 0, v[3] or '', v[4] or '', redis.call('PTTL', X)}
end
local out = {last, ''}
if kind(R) == 'zset' and kind(T) == 'hash' then
  local live = redis.call('ZRANGEBYSCORE', R, now, '+inf', 'WITHSCORES')
  for i = 1, #live, 2 do
    local rec = redis.call('HGET', T, live[i]) or ''
    local tok, host, meta = string.match(rec, '^(%d+)|([^|]*)|(.*)$')
    out[2] = 's'
    table.insert(out, live[i])
    table.insert(out, tonumber(tok) or 0)
    table.insert(out, host or '')
    table.insert(out, meta or '')
    table.insert(out, tonumber(live[i + 1]) - now)
  end
end
return out
`)

var scripts = []*goredis.Script{acquireScript, renewScript, releaseScript, inspectScript}
