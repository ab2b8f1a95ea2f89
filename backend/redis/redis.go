// Package redis is the backend that lets a fleet of hosts share one lock
// space: every host's agent points at one Redis (standalone, Sentinel or
// Cluster, through go-redis's UniversalClient), and each operation is one
// Lua script, atomic on the server.
//
// A name's keys share one hash tag, so Cluster keeps them in one slot.
// Fencing tokens are max(last + 1, server time in µs), so they keep
// increasing even when Redis loses its data (a restart without
// persistence, a failover before replication) as long as the servers'
// clocks do not run backwards. They stay below backend.MaxToken: a grant
// that would need one past it (the name's tokens are used up, or the
// server's clock is past the year 2255) fails with
// backend.ErrTokensExhausted. Waiters queue in Redis, first come, first
// served across agents, and a release publishes, on a channel that the
// agents with waiters subscribe to, the tickets of the waiters that may go.
// The package knows nothing of sessions or sockets.
package redis

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	goredis "github.com/redis/go-redis/v9"

	"github.com/lockagent/lockagent/backend"
)

// Options configure a Backend.
type Options struct {
	// Client is the connection to Redis; the Backend closes it.
	Client goredis.UniversalClient
	// KeyPrefix starts every key; default "lockagent".
	KeyPrefix string
	// FenceTTL is how long a name's last token is kept after its last
	// grant; default 30 days. Tokens stay monotonic after it expires,
	// through the time floor.
	FenceTTL time.Duration
	Logger   hclog.Logger
	// WaitReplicas, when above 0, makes a grant wait for that many
	// replicas to have it (Redis's WAIT, on the grant's connection) for
	// WaitTimeout at most; a grant fewer have is released, and the
	// acquire fails as unavailable. A failover then cannot lose a grant
	// that was handed out, short of losing the replicas too. Not with
	// Cluster, where WAIT would not reach the grant's primary.
	WaitReplicas int
	WaitTimeout  time.Duration
}

// Backend stores locks in Redis. Create it with Open.
type Backend struct {
	c        goredis.UniversalClient
	prefix   string
	fenceTTL time.Duration
	log      hclog.Logger
	w        *watches
	batch    *batcher      // outside Cluster
	nodes    *nodeBatchers // on Cluster
	// waitReplicas and waitTimeout: see Options.
	waitReplicas int
	waitTimeout  time.Duration
}

var _ backend.Backend = (*Backend)(nil)

// Open connects, loads the scripts and checks the server's settings: it
// warns when an eviction policy could drop lock keys, and says which
// persistence the server runs with.
func Open(ctx context.Context, o Options) (*Backend, error) {
	if o.KeyPrefix == "" {
		o.KeyPrefix = "lockagent"
	}
	if o.FenceTTL == 0 {
		o.FenceTTL = 30 * 24 * time.Hour
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	b := &Backend{c: o.Client, prefix: o.KeyPrefix, fenceTTL: o.FenceTTL, log: o.Logger,
		waitReplicas: o.WaitReplicas, waitTimeout: o.WaitTimeout}
	if cc, ok := o.Client.(*goredis.ClusterClient); ok {
		if o.WaitReplicas > 0 {
			o.Client.Close()
			return nil, errors.New("redis: waiting for replicas is not supported with Redis Cluster")
		}
		b.nodes = &nodeBatchers{c: cc, nodes: map[string]*nodeBatcher{}}
	} else {
		b.batch = &batcher{c: o.Client}
	}
	if err := b.loadScripts(ctx); err != nil {
		o.Client.Close()
		return nil, fmt.Errorf("redis: %w", err)
	}
	b.checkServer(ctx)
	b.w = newWatches(b.c, b.log)
	return b, nil
}

// Name is "redis".
func (b *Backend) Name() string { return "redis" }

// loadScripts loads every script on every primary, so that pipelined
// EVALSHA, which cannot fall back to EVAL, finds them.
func (b *Backend) loadScripts(ctx context.Context) error {
	load := func(ctx context.Context, c goredis.Scripter) error {
		for _, s := range scripts {
			if err := s.Load(ctx, c).Err(); err != nil {
				return fmt.Errorf("loading scripts: %w", err)
			}
		}
		return nil
	}
	if cc, ok := b.c.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return load(ctx, c) })
	}
	return load(ctx, b.c)
}

// checkServer logs what the server's configuration, and the user's
// permissions, mean for the locks.
func (b *Backend) checkServer(ctx context.Context) {
	// A user without the lock channels (Redis 7 gives none by default,
	// acl-pubsub-default resetchannels) still locks, but no release
	// reaches the waiters: the scripts' PUBLISH fails after their writes.
	if err := b.c.Publish(ctx, b.prefix+":probe", "").Err(); err != nil {
		b.log.Warn("cannot publish to the lock channels: waiters are not told of releases, and ask again only about once a second; allow the user the channels "+b.prefix+":* (docs/redis.md, Permissions)", "error", err)
	}
	policy, err := b.c.ConfigGet(ctx, "maxmemory-policy").Result()
	switch {
	case err != nil:
		b.log.Warn("cannot read maxmemory-policy; make sure it is noeviction", "error", err)
	case policy["maxmemory-policy"] != "noeviction":
		b.log.Warn("maxmemory-policy is not noeviction: Redis may evict lock keys, and a lease would be lost", "policy", policy["maxmemory-policy"])
	}
	info, err := b.c.Info(ctx, "persistence").Result()
	if err != nil {
		b.log.Warn("cannot read persistence settings", "error", err)
		return
	}
	aof := infoField(info, "aof_enabled") == "1"
	b.log.Info("redis persistence", "aof", aof, "rdb_last_save", infoField(info, "rdb_last_save_time"))
	if !aof {
		b.log.Warn("redis runs without AOF: a restart loses every lease (fencing tokens still increase)")
	}
}

func infoField(info, key string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return v
		}
	}
	return ""
}

// keys of a name. The name is the hash tag unless it holds a brace, which
// would end the tag early; then a digest of it is.
type keys struct {
	x, r, t, f, q, qe, c string
}

func (b *Backend) keys(name string) keys {
	x := b.holderKey(name)
	// One string holds the others, each a slice of it: one allocation
	// instead of six, on every acquire and release.
	all := x + ":r" + x + ":t" + x + ":f" + x + ":q" + x + ":qe" + x + ":c"
	n := len(x)
	return keys{
		x:  x,
		r:  all[0 : n+2],
		t:  all[n+2 : 2*n+4],
		f:  all[2*n+4 : 3*n+6],
		q:  all[3*n+6 : 4*n+8],
		qe: all[4*n+8 : 5*n+11],
		c:  all[5*n+11:],
	}
}

// release is the release script's keys.
func (k keys) release() []string { return []string{k.x, k.r, k.t, k.c, k.q, k.qe} }

// holderKey is X of a name, without building the other keys (R and T are
// X with ":r" and ":t").
func (b *Backend) holderKey(name string) string {
	return b.prefix + ":lk:{" + b.tag(name) + "}"
}

// tag is the hash tag of a name's keys: the name itself, or "#" and a
// digest of it for a name a hash tag cannot hold ({ or }), and for a name
// that starts with "#", which could otherwise be another name's digest.
func (b *Backend) tag(name string) string {
	if strings.HasPrefix(name, "#") || strings.IndexByte(name, '{') >= 0 || strings.IndexByte(name, '}') >= 0 {
		sum := sha256.Sum256([]byte(name))
		return "#" + hex.EncodeToString(sum[:16])
	}
	return name
}

func modeArg(m backend.Mode) string {
	if m == backend.Shared {
		return "s"
	}
	return "x"
}

// Acquire makes one attempt; see backend.Backend.
func (b *Backend) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Grant, error) {
	if err := req.Validate(); err != nil {
		return backend.Grant{}, fmt.Errorf("redis: %w", err)
	}
	if !req.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, req.Deadline)
		defer cancel()
	}
	k := b.keys(req.Name)
	keys := []string{k.x, k.r, k.t, k.f, k.q, k.qe, k.c}
	args := []any{req.LeaseID, modeArg(req.Mode), req.TTL.Milliseconds(), req.Limit, req.Host, req.Meta, b.fenceTTL.Milliseconds(), req.Ticket}
	var res []any
	var err, waitErr error
	replicas := int64(-1) // not asked
	if b.waitReplicas > 0 {
		// The releases go first on their own: the grant waits for the
		// replicas apart from the others.
		for _, l := range req.Releases {
			if err := b.Release(ctx, l); err != nil && !errors.Is(err, backend.ErrNotHeld) {
				return backend.Grant{}, err
			}
		}
		res, replicas, waitErr, err = b.acquireReplicated(ctx, keys, args)
	} else {
		c := &call{ctx: ctx, script: acquireScript, keys: keys, args: args}
		for _, l := range req.Releases {
			kr := b.keys(l.Name)
			c.pre = append(c.pre, &call{ctx: ctx, script: releaseScript, keys: kr.release(), args: []any{l.LeaseID, modeArg(l.Mode)}})
		}
		res, err = b.batcher(ctx, k.x).runCall(ctx, c).Slice()
		for _, p := range c.pre {
			if perr := p.cmd.Err(); perr != nil && err == nil {
				err = fmt.Errorf("a release sent with it: %w", perr)
			}
		}
	}
	if err == nil && len(res) < 2 {
		err = fmt.Errorf("acquire: a reply of %d values", len(res))
	}
	if err != nil {
		return backend.Grant{}, b.fail("acquire", req.Name, err)
	}
	code, _ := res[0].(int64)
	switch code {
	case 1:
		if waitErr != nil || replicas >= 0 && replicas < int64(b.waitReplicas) {
			// Not replicated in time, or not known to be: a failover
			// could lose it. It is given back, and the agent releases it
			// again should this release fail.
			if err := b.Release(ctx, backend.LeaseKey{Name: req.Name, LeaseID: req.LeaseID, Mode: req.Mode}); err != nil {
				b.log.Debug("releasing a grant not replicated in time", "name", req.Name, "error", err)
			}
			if waitErr != nil {
				return backend.Grant{}, fmt.Errorf("redis: acquire %q: %w: WAIT failed: %w", req.Name, backend.ErrUnavailable, waitErr)
			}
			return backend.Grant{}, fmt.Errorf("redis: acquire %q: %w: the grant reached %d of %d replicas within %s",
				req.Name, backend.ErrUnavailable, replicas, b.waitReplicas, b.waitTimeout)
		}
		tok, _ := res[1].(int64)
		return backend.Grant{Token: uint64(tok)}, nil
	case 0:
		ms, _ := res[1].(int64)
		return backend.Grant{}, &backend.HeldError{RetryIn: max(time.Duration(ms)*time.Millisecond, time.Millisecond)}
	case -1:
		return backend.Grant{}, fmt.Errorf("redis: acquire %q: %w", req.Name, backend.ErrOtherMode)
	case -3:
		why, _ := res[1].(string)
		return backend.Grant{}, fmt.Errorf("redis: acquire %q: %w: %s", req.Name, backend.ErrTokensExhausted, why)
	default:
		key, _ := res[1].(string)
		return backend.Grant{}, fmt.Errorf("acquire %q: %w: %s", req.Name, backend.ErrForeignKey, key)
	}
}

// acquireReplicated runs the acquire script and WAIT in one pipeline, on
// one connection (WAIT counts the replicas that have this connection's
// writes), and returns the script's reply and the replicas WAIT counted,
// or WAIT's error (refused by an ACL, say).
// The script goes by digest, and by source after a NOSCRIPT. A grant
// waits for the replicas apart from the batches of the other requests,
// which would otherwise wait with it.
func (b *Backend) acquireReplicated(ctx context.Context, keys []string, args []any) (res []any, replicas int64, waitErr, err error) {
	var cmd *goredis.Cmd
	var wait *goredis.Cmd
	for _, bySource := range []bool{false, true} {
		p := b.c.Pipeline()
		if bySource {
			cmd = acquireScript.Eval(ctx, p, keys, args...)
		} else {
			cmd = acquireScript.EvalSha(ctx, p, keys, args...)
		}
		wait = p.Do(ctx, "WAIT", b.waitReplicas, b.waitTimeout.Milliseconds())
		p.Exec(ctx) // each command carries its own error
		if !goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			break
		}
	}
	if res, err = cmd.Slice(); err != nil {
		return nil, 0, nil, err
	}
	replicas, waitErr = wait.Int64()
	return res, replicas, waitErr, nil
}

// batcher returns the batcher for a name whose holder key is x: on
// Cluster, its primary's.
func (b *Backend) batcher(ctx context.Context, x string) *batcher {
	if b.nodes != nil {
		return b.nodes.of(ctx, x)
	}
	return b.batch
}

// fail wraps an error of Redis: a cancelled request stays a cancellation,
// anything else means the outcome is unknown.
func (b *Backend) fail(op, name string, err error) error {
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("redis: %s %q: %w", op, name, err)
	}
	if errors.Is(err, goredis.ErrClosed) {
		return fmt.Errorf("redis: %s %q: %w", op, name, backend.ErrClosed)
	}
	return fmt.Errorf("redis: %s %q: %w: %v", op, name, backend.ErrUnavailable, err)
}

// Release ends a lease and wakes the waiters of its name. A release
// without a deadline is bounded by the client's read and write timeouts
// and retries, and, gathered with others, by releaseWait (see
// batchContext); a timer of its own would cost more than the release.
func (b *Backend) Release(ctx context.Context, l backend.LeaseKey) error {
	k := b.keys(l.Name)
	v, err := b.batcher(ctx, k.x).run(ctx, releaseScript, k.release(), l.LeaseID, modeArg(l.Mode)).Int64()
	if err != nil {
		return b.fail("release", l.Name, err)
	}
	if v != 1 {
		return fmt.Errorf("release %q: %w", l.Name, backend.ErrNotHeld)
	}
	return nil
}

// Leave takes a ticket out of the name's queue; see backend.Backend.
func (b *Backend) Leave(ctx context.Context, name, ticket string) error {
	k := b.keys(name)
	if err := leaveScript.Run(ctx, b.c, []string{k.q, k.qe, k.c}, ticket).Err(); err != nil {
		return b.fail("leave", name, err)
	}
	return nil
}

// Inspect reports the live holders of a name and its last token.
func (b *Backend) Inspect(ctx context.Context, name string) (backend.LockInfo, error) {
	k := b.keys(name)
	res, err := inspectScript.RunRO(ctx, b.c, []string{k.x, k.r, k.t, k.f, k.qe}).Slice()
	if err == nil && len(res) < 3 {
		err = fmt.Errorf("inspect: a reply of %d values", len(res))
	}
	if err != nil {
		return backend.LockInfo{}, b.fail("inspect", name, err)
	}
	info := backend.LockInfo{Holders: []backend.Holder{}}
	last, _ := res[0].(int64)
	info.LastToken = uint64(last)
	queued, _ := res[1].(int64)
	info.Queued = int(queued)
	mode := backend.Exclusive
	if m, _ := res[2].(string); m == "s" {
		mode = backend.Shared
	}
	for i := 3; i+4 < len(res); i += 5 {
		h := backend.Holder{Mode: mode}
		h.LeaseID, _ = res[i].(string)
		tok, _ := res[i+1].(int64)
		h.Token = uint64(tok)
		h.Host, _ = res[i+2].(string)
		h.Meta, _ = res[i+3].(string)
		ms, _ := res[i+4].(int64)
		h.ExpiresIn = time.Duration(ms) * time.Millisecond
		info.Holders = append(info.Holders, h)
	}
	return info, nil
}

// Watch subscribes to the name's release channel; see backend.Backend.
func (b *Backend) Watch(ctx context.Context, name, ticket string) (<-chan struct{}, func(), error) {
	return b.w.watch(ctx, b.keys(name).c, ticket)
}

// Close closes the subscription and the client.
func (b *Backend) Close() error {
	b.w.close()
	if err := b.c.Close(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}
