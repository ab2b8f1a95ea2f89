package main

// Operational faults of the Redis deployment and of the agent process, end
// to end: redis-server restarted with and without persistence, its clock
// running fast, an eviction policy, the agent stopped and killed, a
// Sentinel failover and a Redis Cluster. Every process is real.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit/lockcheck"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// ---------------------------------------------------------------------------
// Helpers

// opsRelease releases a lease that must be held.
func opsRelease(t *testing.T, c *client.Client, leaseID string) {
	t.Helper()
	var r struct {
		Released bool `json:"released"`
	}
	call(t, c, "release", map[string]any{"lease": leaseID}, &r)
	require.True(t, r.Released)
}

func opsCheck(t *testing.T, c *client.Client, leaseID string) checkResult {
	t.Helper()
	var r checkResult
	call(t, c, "check", map[string]any{"lease": leaseID}, &r)
	return r
}

// opsRawConn is an application connection read line by line, keeping the
// order of responses and events, which client.Client separates.
type opsRawConn struct {
	nc    net.Conn
	lines chan opsRawLine
}

type opsRawLine struct {
	text string
	m    map[string]any
	at   time.Time
}

func opsDialRaw(t *testing.T, socket string) *opsRawConn {
	t.Helper()
	nc, err := net.DialTimeout("unix", socket, callTimeout)
	require.NoError(t, err)
	r := &opsRawConn{nc: nc, lines: make(chan opsRawLine, 4096)}
	go func() {
		defer close(r.lines)
		sc := bufio.NewScanner(nc)
		sc.Buffer(make([]byte, 4096), 16<<20)
		for sc.Scan() {
			l := opsRawLine{text: sc.Text(), at: time.Now()}
			json.Unmarshal(sc.Bytes(), &l.m)
			r.lines <- l
		}
	}()
	t.Cleanup(func() { nc.Close() })
	return r
}

func (r *opsRawConn) send(t *testing.T, line string) {
	t.Helper()
	require.NoError(t, r.nc.SetWriteDeadline(time.Now().Add(callTimeout)))
	_, err := r.nc.Write([]byte(line + "\n"))
	require.NoError(t, err)
}

// next returns the next line the agent sent.
func (r *opsRawConn) next(t *testing.T, timeout time.Duration) opsRawLine {
	t.Helper()
	select {
	case l, ok := <-r.lines:
		require.True(t, ok, "the agent closed the connection")
		return l
	case <-time.After(timeout):
		t.Fatalf("no line from the agent within %s", timeout)
		return opsRawLine{}
	}
}

// roundTrip sends a request with id and returns its response; no event
// may come first.
func (r *opsRawConn) roundTrip(t *testing.T, id, line string) map[string]any {
	t.Helper()
	r.send(t, line)
	l := r.next(t, callTimeout)
	require.Equal(t, id, l.m["id"], "response to %s, got %s", id, l.text)
	require.Equal(t, true, l.m["ok"], l.text)
	return l.m
}

// opsMonitor records every command redis-server runs (MONITOR, through
// redis-cli), to tell who renewed which lease and when.
type opsMonitor struct{ p *proc }

func opsStartMonitor(t *testing.T, addr string) *opsMonitor {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	m := &opsMonitor{p: startProc(t, "redis-cli monitor", nil, "redis-cli", "-h", host, "-p", port, "monitor")}
	m.p.waitOutput(t, "OK", exitTimeout)
	return m
}

// opsMonitorCmd is one command as MONITOR shows it.
type opsMonitorCmd struct {
	at   time.Time // server time
	args []string  // the command and its arguments, unquoted
}

func (m *opsMonitor) commands() []opsMonitorCmd {
	var out []opsMonitorCmd
	for _, line := range strings.Split(m.p.stdout.String(), "\n") {
		ts, rest, ok := strings.Cut(line, " [")
		if !ok {
			continue
		}
		sec, err := strconv.ParseFloat(ts, 64)
		if err != nil {
			continue
		}
		_, rest, ok = strings.Cut(rest, "] ")
		if !ok {
			continue
		}
		out = append(out, opsMonitorCmd{at: time.UnixMicro(int64(sec * 1e6)), args: opsMonitorArgs(rest)})
	}
	return out
}

// opsMonitorArgs splits `"a" "b\"c"` into its unquoted parts.
func opsMonitorArgs(s string) []string {
	var args []string
	for {
		i := strings.IndexByte(s, '"')
		if i < 0 {
			return args
		}
		s = s[i+1:]
		var b strings.Builder
		for len(s) > 0 && s[0] != '"' {
			if s[0] == '\\' && len(s) > 1 {
				b.WriteByte(s[1])
				s = s[2:]
				continue
			}
			b.WriteByte(s[0])
			s = s[1:]
		}
		args = append(args, b.String())
		if len(s) > 0 {
			s = s[1:]
		}
	}
}

// renewals returns the server times of the renewals of leaseID.
func (m *opsMonitor) renewals(leaseID string) []time.Time {
	var out []time.Time
	for _, c := range m.commands() {
		if len(c.args) == 0 || c.args[0] != "evalsha" && c.args[0] != "eval" {
			continue
		}
		if _, leases, ok := renewCallLeases(c.args); ok && slices.Contains(leases, leaseID) {
			out = append(out, c.at)
		}
	}
	return out
}

// opsAgent starts an agent whose backend block is the given HCL body (plus
// key_prefix "e2e"), for deployments startFleet does not build.
func opsAgent(t *testing.T, backendBody string) *fleetAgent {
	t.Helper()
	a := &fleetAgent{env: newAgentEnv(t)}
	a.env.writeConfig(t, fmt.Sprintf("backend \"redis\" {\n%s\n  key_prefix = \"e2e\"\n}\n", backendBody))
	a.start(t)
	return a
}

// opsStartupLog returns what the agent logged up to "agent started": its
// stderr is copied from a pipe, so it may lag behind the socket answering.
func opsStartupLog(t *testing.T, a *fleetAgent) string {
	t.Helper()
	eventually(t, exitTimeout, "the agent logs its start", func() bool {
		return strings.Contains(a.proc.stderr.String(), "agent started")
	})
	out := a.proc.stderr.String()
	return out[:strings.Index(out, "agent started")]
}

// opsHCLList renders addresses as an HCL list.
func opsHCLList(addrs []string) string {
	q := make([]string, len(addrs))
	for i, a := range addrs {
		q[i] = strconv.Quote(a)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// opsStop SIGSTOPs an agent and makes sure it is continued at cleanup, so
// that the fleet's cleanup can stop it.
func opsStop(t *testing.T, p *proc) {
	t.Helper()
	p.signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { p.cmd.Process.Signal(syscall.SIGCONT) })
}

func opsMaxToken(ts []uint64) uint64 {
	var m uint64
	for _, x := range ts {
		m = max(m, x)
	}
	return m
}

// ---------------------------------------------------------------------------
// B6: redis-server killed and restarted without persistence.

// opsB6 is two agents on a Redis without persistence, their apps, names
// each held by one of the apps, and every token granted so far.
type opsB6 struct {
	f      *fleet
	apps   []*client.Client
	logs   []*eventLog
	names  []string
	held   []lease // held[i] holds names[i], on apps[i%2]
	before []uint64
}

// newOpsB6 starts the agents, churns the names on both (recording every
// grant's token) and leaves each name held by one of the two apps.
func newOpsB6(t *testing.T, ttl time.Duration, prefix string) *opsB6 {
	t.Helper()
	s := &opsB6{f: startFleet(t, 2, redistest.Options{}, "")}
	for i, a := range s.f.agents {
		c := a.client(t, fmt.Sprintf("b6-%d", i))
		s.apps = append(s.apps, c)
		s.logs = append(s.logs, recordEvents(c))
	}
	for i := range 6 {
		s.names = append(s.names, fmt.Sprintf("%s/%d", prefix, i))
	}
	for _, n := range s.names {
		for _, c := range s.apps {
			l := mustAcquire(t, c, n, afterRelease(ttl))
			s.before = append(s.before, l.Token)
			opsRelease(t, c, l.Lease)
		}
	}
	for i, n := range s.names {
		l := mustAcquire(t, s.apps[i%2], n, ttlArg(ttl))
		s.before = append(s.before, l.Token)
		s.held = append(s.held, l)
	}
	return s
}

// regrant acquires every name again, on the agent that did not hold it,
// then on the one that did, and requires every token above every earlier
// one. It returns the lowest new token.
func (s *opsB6) regrant(t *testing.T, ttl time.Duration) uint64 {
	t.Helper()
	high := opsMaxToken(s.before)
	lowest := uint64(1<<64 - 1)
	for i, n := range s.names {
		other := mustAcquire(t, s.apps[(i+1)%2], n, ttlArg(ttl))
		require.Greater(t, other.Token, high, "%s: a grant after the restart has a token above every earlier one", n)
		assert.False(t, tryAcquire(t, s.apps[i%2], n, nil).Acquired, "%s is held by the other agent now", n)
		opsRelease(t, s.apps[(i+1)%2], other.Lease)
		again := mustAcquire(t, s.apps[i%2], n, afterRelease(ttl))
		require.Greater(t, again.Token, other.Token, n)
		opsRelease(t, s.apps[i%2], again.Lease)
		lowest = min(lowest, other.Token)
	}
	return lowest
}

// TestB6_RedisRestartWithoutPersistence: Redis restarted empty. Holders
// are told `lost` (expired) at their first renewal after Redis is back, or
// at their local deadline if it stays down longer; tokens never go back.
func TestB6_RedisRestartWithoutPersistence(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second

	// Redis comes back at once, or once renewals failed on both agents:
	// every holder learns at its next renewal that its lease is gone.
	for _, tc := range []struct {
		name      string
		waitFails bool
	}{{"quick", false}, {"after_failed_renewals", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newOpsB6(t, ttl, "b6"+tc.name[:1])
			for _, a := range s.f.agents {
				assert.Contains(t, opsStartupLog(t, a), "redis runs without AOF", "the agent says which persistence Redis runs with")
			}
			killed := time.Now()
			s.f.redis.Kill()
			if tc.waitFails {
				eventually(t, renewMax(ttl)+time.Second, "renewals failing on both agents", func() bool {
					return slices.Contains(s.logs[0].kinds(), "backend:degraded") && slices.Contains(s.logs[1].kinds(), "backend:degraded")
				})
			}
			s.f.redis.Restart(t)
			back := time.Now()

			var worst time.Duration
			for i, l := range s.held {
				ev := s.logs[i%2].waitLost(t, l.Lease, ttl)
				assert.Equal(t, "expired", ev.Reason, "%s: the renewal found the lease gone", l.Name)
				assert.True(t, ev.at.After(killed))
				after := ev.at.Sub(back)
				assert.LessOrEqual(t, after, renewMax(ttl)+500*time.Millisecond,
					"%s: lost within about one renew interval after Redis is back", l.Name)
				worst = max(worst, after)
			}
			lowest := s.regrant(t, ttl)
			t.Logf("B6 %s restart: Redis down %s; %d leases lost (expired) at most %s after it was back (renew interval ≤ %s); %d grants after, lowest token %d > highest before %d; events %v %v",
				tc.name, msString(back.Sub(killed)), len(s.held), msString(worst), msString(renewMax(ttl)), 2*len(s.names), lowest, opsMaxToken(s.before), s.logs[0].kinds(), s.logs[1].kinds())
		})
	}

	// Redis stays down longer than the TTL: every holder gives its lease up
	// at its local deadline, and tokens still go up once Redis is back.
	t.Run("down_longer_than_ttl", func(t *testing.T) {
		t.Parallel()
		const ttl = 2 * time.Second
		s := newOpsB6(t, ttl, "b6d")
		killed := time.Now()
		s.f.redis.Kill()

		deadline := ttl - leaseMargin(ttl)
		var first, last time.Duration
		for i, l := range s.held {
			ev := s.logs[i%2].waitLost(t, l.Lease, 2*ttl)
			assert.Equal(t, "backend_unavailable", ev.Reason, "%s: lost at the local deadline while renewals failed", l.Name)
			after := ev.at.Sub(killed)
			assert.LessOrEqual(t, after, deadline+300*time.Millisecond, "%s: lost by its local deadline", l.Name)
			assert.GreaterOrEqual(t, after, deadline-renewMax(ttl)-100*time.Millisecond, "%s: not lost before its local deadline", l.Name)
			if first == 0 || after < first {
				first = after
			}
			last = max(last, after)
		}
		for i := range s.apps {
			kinds := s.logs[i].kinds()
			require.NotEmpty(t, kinds)
			assert.Equal(t, "backend:degraded", kinds[0], "the session was warned first: %v", kinds)
		}
		s.f.redis.Restart(t)
		back := time.Now()
		lowest := s.regrant(t, ttl)
		t.Logf("B6 long outage: %d leases lost (backend_unavailable) %s–%s after the kill (local deadline ≤ %s after the last renewal); Redis back after %s; lowest new token %d > highest before %d",
			len(s.held), msString(first), msString(last), msString(deadline), msString(back.Sub(killed)), lowest, opsMaxToken(s.before))
	})
}

// ---------------------------------------------------------------------------
// B7: restart with appendfsync always, quicker than TTL - margin.

// TestB7_RedisRestartWithPersistence: with appendfsync always, a restart
// shorter than TTL - margin loses no lease: at once, and once a renewal has
// failed during the outage (the sessions then see degraded, then ok).
func TestB7_RedisRestartWithPersistence(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	t.Run("instant", func(t *testing.T) {
		t.Parallel()
		opsB7(t, ttl, false, func(f *fleet, logs []*eventLog) {})
	})
	t.Run("across_a_failed_renewal", func(t *testing.T) {
		t.Parallel()
		opsB7(t, ttl, true, func(f *fleet, logs []*eventLog) {
			eventually(t, renewMax(ttl)+time.Second, "a renewal failed", func() bool {
				for _, lg := range logs {
					if slices.Contains(lg.kinds(), "backend:degraded") {
						return true
					}
				}
				return false
			})
		})
	})
}

// opsB7 holds leases from two agents, kills Redis (if afterRenewal, just
// after the leases were renewed), calls outage, restarts Redis and checks
// that every lease survived and is renewed.
func opsB7(t *testing.T, ttl time.Duration, afterRenewal bool, outage func(f *fleet, logs []*eventLog)) {
	f := startFleet(t, 2, redistest.Options{Persistence: true}, "")
	for _, a := range f.agents {
		assert.Contains(t, opsStartupLog(t, a), "aof=true", "the agent logs the persistence mode")
		assert.NotContains(t, opsStartupLog(t, a), "without AOF")
	}
	var apps []*client.Client
	var logs []*eventLog
	for i, a := range f.agents {
		c := a.client(t, fmt.Sprintf("b7-%d", i))
		apps = append(apps, c)
		logs = append(logs, recordEvents(c))
	}
	var held []lease
	for i := range 4 {
		held = append(held, mustAcquire(t, apps[i%2], fmt.Sprintf("b7/%d", i), ttlArg(ttl)))
	}
	rc := f.redis.Client(t)
	ctx := t.Context()

	// The leases were granted together, so they are renewed at about the
	// same time (±10%): their last renewal is at most renewed old.
	renewed := renewMax(ttl)
	if afterRenewal {
		granted := time.Now()
		eventually(t, renewMax(ttl)+time.Second, "a renewal", func() bool {
			return time.Since(granted) > 300*time.Millisecond && rc.PTTL(ctx, lockKey(held[0].Name)).Val() > ttl-100*time.Millisecond
		})
		renewed = ttl/3/5 + 100*time.Millisecond
	}
	killed := time.Now()
	f.redis.Kill()
	outage(f, logs)
	f.redis.Restart(t)
	back := time.Now()
	down := back.Sub(killed)
	// A lease survives if a renewal gets through before its local
	// deadline: a failed renewal is retried within ttl/10.
	require.Less(t, renewed+down+ttl/10+200*time.Millisecond, ttl-leaseMargin(ttl),
		"the restart is quick enough for the scenario")

	// The AOF brought the keys back: every owner is as before.
	for _, l := range held {
		owner, err := rc.HGet(ctx, lockKey(l.Name), "o").Result()
		require.NoError(t, err, l.Name)
		assert.Equal(t, l.Lease, owner, "%s survived the restart", l.Name)
	}

	// Watch for more than a TTL: the keys can only still be there if the
	// agents renewed them on the restarted server.
	time.Sleep(ttl + 500*time.Millisecond)
	for i, l := range held {
		_, lost := logs[i%2].lost(l.Lease)
		require.False(t, lost, "%s: no lease is lost; events %v", l.Name, logs[i%2].kinds())
		r := opsCheck(t, apps[i%2], l.Lease)
		assert.True(t, r.Held, l.Name)
		assert.Equal(t, l.Token, r.Token)
		owner, err := rc.HGet(ctx, lockKey(l.Name), "o").Result()
		require.NoError(t, err, l.Name)
		assert.Equal(t, l.Lease, owner, l.Name)
		assert.False(t, tryAcquire(t, apps[(i+1)%2], l.Name, nil).Acquired, "%s is still held against the other agent", l.Name)
	}
	var events []string
	for _, lg := range logs {
		kinds := lg.kinds()
		for _, k := range kinds {
			assert.Contains(t, []string{"backend:degraded", "backend:ok"}, k, "only degraded/ok may appear")
		}
		if len(kinds) > 0 {
			assert.Equal(t, "backend:ok", kinds[len(kinds)-1], "a degraded session hears of the recovery: %v", kinds)
		}
		events = append(events, strings.Join(kinds, ","))
	}
	t.Logf("B7 restart with AOF (%s): Redis down %s (< TTL - margin = %s); %d leases kept, renewed on the restarted server over %s; events per app %q",
		t.Name(), msString(down), msString(ttl-leaseMargin(ttl)), len(held), msString(time.Since(back)), events)
}

// ---------------------------------------------------------------------------
// B9: Redis's clock runs five times fast.

type opsB9Grant struct {
	app    int
	lease  string
	token  uint64
	at     time.Time
	lostAt time.Time
	reason string
}

// TestB9_RedisClockFast: with the server's clock 5x fast, a lease of ttl
// expires on the server after ttl/5 of real time, before the agent's first
// renewal (at about ttl/3). That renewal finds the lease gone or taken, and
// the app is told `lost`. Mutual exclusion between the apps cannot hold
// then (the design's promise assumes the Redis clock does not run ahead:
// redis.md 2.3(b), 7.17): fencing is what holds, and the test measures the
// window. The backend itself never has two holders.
func TestB9_RedisClockFast(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	const name = "b9/x"
	f := startFleet(t, 2, redistest.Options{Faketime: "+0 x5"}, "")
	apps := []*client.Client{f.agents[0].client(t, "b9-0"), f.agents[1].client(t, "b9-1")}
	logs := []*eventLog{recordEvents(apps[0]), recordEvents(apps[1])}
	observer := f.agents[0].client(t, "b9-observer")

	var reg lockcheck.Register
	var mu sync.Mutex
	var grants []*opsB9Grant
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, c := range apps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				var l lease
				args := map[string]any{"name": name, "ttl_ms": ttl.Milliseconds()}
				if err := c.Call(ctx, "acquire", args, &l); err != nil {
					if ctx.Err() == nil {
						t.Errorf("app %d: acquire: %v", i, err)
					}
					return
				}
				if !l.Acquired {
					time.Sleep(15 * time.Millisecond)
					continue
				}
				g := &opsB9Grant{app: i, lease: l.Lease, token: l.Token, at: time.Now()}
				mu.Lock()
				grants = append(grants, g)
				mu.Unlock()
				// Work under the lock, fenced, until told it is lost.
				giveUp := time.Now().Add(ttl + time.Second)
				for {
					if ev, ok := logs[i].lost(l.Lease); ok {
						mu.Lock()
						g.lostAt, g.reason = ev.at, ev.Reason
						mu.Unlock()
						break
					}
					if time.Now().After(giveUp) {
						t.Errorf("app %d: no lost event for %s within %s", i, l.Lease, ttl+time.Second)
						return
					}
					if !reg.Write(l.Token) {
						// Refused: a higher token wrote, whose grant was
						// recorded before its first write. The newest
						// holder is never refused.
						mu.Lock()
						newest := grants[len(grants)-1]
						mu.Unlock()
						if newest == g {
							t.Errorf("app %d: the newest holder's write (token %d) was refused", i, l.Token)
						}
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	// The backend's view: never two holders.
	maxHolders := 0
	for ctx.Err() == nil {
		var r inspectResult
		if err := observer.Call(ctx, "inspect", map[string]any{"name": name}, &r); err != nil {
			break
		}
		maxHolders = max(maxHolders, len(r.Holders))
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	assert.LessOrEqual(t, maxHolders, 1, "the backend never shows two holders")
	require.GreaterOrEqual(t, len(grants), 3, "the lock changed hands")
	slices.SortFunc(grants, func(a, b *opsB9Grant) int { return a.at.Compare(b.at) })
	var overlaps int
	var overlap, slowest time.Duration
	reasons := map[string]int{}
	for i, g := range grants {
		if g.lostAt.IsZero() {
			continue // still held when the run ended
		}
		reasons[g.reason]++
		assert.Contains(t, []string{"expired", "taken_over"}, g.reason, "a renewal found the lease gone")
		held := g.lostAt.Sub(g.at)
		slowest = max(slowest, held)
		assert.LessOrEqual(t, held, renewMax(ttl)+600*time.Millisecond,
			"lost at the first renewal, long before the local deadline (%s)", msString(ttl-leaseMargin(ttl)))
		if i > 0 {
			assert.Greater(t, g.token, grants[i-1].token, "fencing tokens increase")
		}
		if i+1 < len(grants) && grants[i+1].at.Before(g.lostAt) {
			overlaps++
			overlap += g.lostAt.Sub(grants[i+1].at)
			assert.Greater(t, grants[i+1].token, g.token, "the newer holder of an overlap has the higher token")
		}
	}
	accepted, rejected := reg.Counts()
	assert.Positive(t, accepted)
	t.Logf("B9 Redis clock x5: %d grants, lost reasons %v, longest grant→lost %s (renew ≤ %s, local deadline %s); "+
		"apps overlapped %d times for %s in all (documented limitation), fenced writes accepted %d, stale rejected %d; backend holders ≤ %d",
		len(grants), reasons, msString(slowest), msString(renewMax(ttl)), msString(ttl-leaseMargin(ttl)), overlaps, msString(overlap), accepted, rejected, maxHolders)
}

// ---------------------------------------------------------------------------
// B10: an eviction policy other than noeviction.

func TestB10_EvictionPolicy(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	f := startFleet(t, 2, redistest.Options{Args: []string{"--maxmemory-policy", "allkeys-lru"}}, "")
	warned := func(a *fleetAgent, policy string) bool {
		for _, line := range strings.Split(opsStartupLog(t, a), "\n") {
			if strings.Contains(line, "[WARN]") && strings.Contains(line, "maxmemory-policy") && strings.Contains(line, policy) {
				return true
			}
		}
		return false
	}
	for _, a := range f.agents {
		assert.True(t, warned(a, "allkeys-lru"), "the agent warns at start, naming the policy; stderr:\n%s", a.proc.stderr)
	}
	rc := f.redis.Client(t)
	ctx := t.Context()
	require.NoError(t, rc.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err())
	assert.True(t, warned(f.addAgent(t, ""), "volatile-lru"), "volatile-lru evicts lock keys first")
	require.NoError(t, rc.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	assert.False(t, warned(f.addAgent(t, ""), "maxmemory-policy"), "no warning under noeviction")

	holder := f.agents[0].client(t, "b10-holder")
	hlog := recordEvents(holder)
	other := f.agents[1].client(t, "b10-other")

	// An eviction nobody races: the holder is told at its next renewal.
	solo := mustAcquire(t, holder, "b10/solo", ttlArg(ttl))
	evicted := time.Now()
	require.EqualValues(t, 1, rc.Del(ctx, lockKey(solo.Name)).Val())
	ev := hlog.waitLost(t, solo.Lease, ttl)
	soloAfter := ev.at.Sub(evicted)
	assert.Equal(t, "expired", ev.Reason)
	assert.LessOrEqual(t, soloAfter, renewMax(ttl)+500*time.Millisecond, "lost within one renew interval")
	next := mustAcquire(t, other, solo.Name, ttlArg(ttl))
	assert.Greater(t, next.Token, solo.Token)

	// An eviction while an app on the other agent tries in a loop: it gets
	// the lock at once; the old holder's next renewal finds the other lease
	// and never takes the key back.
	old := mustAcquire(t, holder, "b10/x", ttlArg(ttl))
	got := make(chan grab, 1)
	var denied atomic.Int32
	go func() {
		for {
			var l lease
			err := other.Call(ctx, "acquire", map[string]any{"name": old.Name, "ttl_ms": ttl.Milliseconds()}, &l)
			if err != nil || l.Acquired {
				got <- grab{l, time.Now(), err}
				return
			}
			denied.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	eventually(t, callTimeout, "the contender is looping, denied", func() bool { return denied.Load() >= 2 })
	evicted = time.Now()
	require.EqualValues(t, 1, rc.Del(ctx, lockKey(old.Name)).Val())
	g := receive(t, got, "the contender did not get the evicted lock")
	require.NoError(t, g.err)
	assert.Greater(t, g.l.Token, old.Token, "the new grant's token is higher")
	ev = hlog.waitLost(t, old.Lease, ttl)
	lostAfter := ev.at.Sub(evicted)
	assert.Contains(t, []string{"taken_over", "expired"}, ev.Reason)
	assert.LessOrEqual(t, lostAfter, renewMax(ttl)+500*time.Millisecond, "lost within one renew interval")

	// The backend has one holder, the new one, and the old lease is dead.
	owner, err := rc.HGet(ctx, lockKey(old.Name), "o").Result()
	require.NoError(t, err)
	assert.Equal(t, g.l.Lease, owner, "the old holder never took the key back")
	info := inspect(t, other, old.Name)
	require.Len(t, info.Holders, 1)
	assert.Equal(t, g.l.Token, info.Holders[0].Token)
	assert.True(t, opsCheck(t, other, g.l.Lease).Held)
	err = holder.Call(ctx, "check", map[string]any{"lease": old.Lease}, nil)
	var se *client.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "not_held", se.Code)
	t.Logf("B10 eviction policy: warned for allkeys-lru and volatile-lru, not for noeviction; evicted key → lost (%s) after %s; "+
		"with a contender: it took the lock %s after the eviction, the old holder was told (%s) %s after the eviction, an exposure of %s fenced by tokens %d < %d",
		"expired", msString(soloAfter), msString(g.at.Sub(evicted)), ev.Reason, msString(lostAfter), msString(ev.at.Sub(g.at)), old.Token, g.l.Token)
}

// TestB10_RealEviction: Redis itself evicts a held lease's keys. Under
// volatile-lru with maxmemory reached, lock keys (they carry TTLs) go
// first, the fence key with them, while the junk that filled the memory
// (no TTL) stays. The holder is told at its next renewal, and the next
// grant's token is still higher than the evicted one's: without the fence
// key, tokens continue from the server's clock.
func TestB10_RealEviction(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	f := startFleet(t, 2, redistest.Options{Args: []string{"--maxmemory-policy", "volatile-lru"}}, "")
	rc := f.redis.Client(t)
	ctx := t.Context()
	holder := f.agents[0].client(t, "b10r-holder")
	hlog := recordEvents(holder)
	other := f.agents[1].client(t, "b10r-other")

	held := mustAcquire(t, holder, "b10r/x", ttlArg(ttl))
	keys := []string{lockKey(held.Name), lockKey(held.Name) + ":f"}
	require.EqualValues(t, 2, rc.Exists(ctx, keys...).Val(), "the lock and its fence key")
	info, err := rc.Info(ctx, "memory").Result()
	require.NoError(t, err)
	used := infoField(t, info, "used_memory")
	require.NoError(t, rc.ConfigSet(ctx, "maxmemory", strconv.Itoa(used+(4<<20))).Err())
	t.Cleanup(func() { rc.ConfigSet(context.Background(), "maxmemory", "0") })

	junk := strings.Repeat("j", 64<<10)
	filled := time.Now()
	for i := 0; rc.Exists(ctx, keys...).Val() > 0; i++ {
		require.Less(t, i, 1000, "Redis never evicted the lock keys")
		// A write evicts volatile keys first, and fails as OOM only once
		// it has evicted them all (but it may still be evicting).
		if err := rc.Set(ctx, fmt.Sprintf("junk/%d", i), junk, 0).Err(); err != nil {
			require.ErrorContains(t, err, "OOM")
		}
	}
	evicted := time.Now()
	stats, err := rc.Info(ctx, "stats").Result()
	require.NoError(t, err)
	assert.Positive(t, infoField(t, stats, "evicted_keys"))

	ev := hlog.waitLost(t, held.Lease, ttl)
	assert.Equal(t, "expired", ev.Reason)
	assert.LessOrEqual(t, ev.at.Sub(evicted), renewMax(ttl)+500*time.Millisecond, "lost at the next renewal")

	// With room again, the name is free and its tokens go on increasing.
	require.NoError(t, rc.ConfigSet(ctx, "maxmemory", "0").Err())
	next := mustAcquire(t, other, held.Name, ttlArg(ttl))
	assert.Greater(t, next.Token, held.Token, "tokens increase though the fence key was evicted")
	t.Logf("B10 real eviction (volatile-lru): Redis evicted the lock and fence keys %s into the filling; "+
		"the holder was told (%s) %s after; the next grant's token %d > %d",
		msString(evicted.Sub(filled)), ev.Reason, msString(ev.at.Sub(evicted)), next.Token, held.Token)
}

// infoField returns the integer field of an INFO section.
func infoField(t *testing.T, info, field string) int {
	t.Helper()
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.Atoi(v)
			require.NoError(t, err, field)
			return n
		}
	}
	t.Fatalf("INFO has no %s:\n%s", field, info)
	return 0
}

// ---------------------------------------------------------------------------
// C1, C2: the agent SIGSTOPped.

// TestC1_AgentStoppedTwiceTTL: the agent is stopped for 2 x TTL while its
// apps hold leases; another agent's app takes each lock once it expires.
// The apps, unaware, send requests meanwhile, which wait in their sockets.
// On SIGCONT the first thing each app reads is `lost` (docs/testing.md C1), in
// particular no answer says that the dead lease is still held (redis.md
// 7.15), and the stopped agent never renews an old lease: the other
// holder's key keeps its owner and is renewed by the other agent only.
// What comes first after SIGCONT is a race inside each agent process, so
// the test stops three agents at once, three times.
func TestC1_AgentStoppedTwiceTTL(t *testing.T) {
	t.Parallel()
	const ttl = 1500 * time.Millisecond
	const victims = 3 // agents stopped; the last agent of the fleet takes over
	const perAgent = 2
	const apps = victims * perAgent
	const rounds = 3
	f := startFleet(t, victims+1, redistest.Options{}, "")
	taker := f.agents[victims]
	mon := opsStartMonitor(t, f.redis.Addr())
	rc := f.redis.Client(t)
	ctx := t.Context()

	type holder struct {
		conn  *opsRawConn
		name  string
		lease string
		token uint64
	}
	hs := make([]*holder, apps)
	for i := range hs {
		hs[i] = &holder{conn: opsDialRaw(t, f.agents[i/perAgent].env.socket), name: fmt.Sprintf("c1/%d/%d", i/perAgent, i%perAgent)}
		hs[i].conn.roundTrip(t, "h", fmt.Sprintf(`{"id":"h","op":"hello","version":1,"client":"c1-app-%d"}`, i))
	}
	other := taker.client(t, "c1-other")
	olog := recordEvents(other)

	var seqs, notFirst, heldBefore []string
	var lostAfter, tookAfter time.Duration
	oldRenewals := 0
	took := map[string]lease{}
	var continued time.Time
	for round := range rounds {
		for _, h := range hs {
			// From the second round on, the name was just released
			// through the other agent, which tells Redis a moment after
			// it answers (docs/protocol.md, release): wait for it.
			res := h.conn.roundTrip(t, "a", fmt.Sprintf(`{"id":"a","op":"acquire","name":%q,"ttl_ms":%d,"wait_ms":1000}`, h.name, ttl.Milliseconds()))
			require.Equal(t, true, res["acquired"], "round %d: %v", round, res)
			h.lease = res["lease"].(string)
			h.token = uint64(res["token"].(float64))
		}
		got := make(chan lease, apps)
		for _, h := range hs {
			go func() {
				var l lease
				other.Call(ctx, "acquire", map[string]any{"name": h.name, "wait_ms": 10000, "ttl_ms": ttl.Milliseconds()}, &l)
				got <- l
			}()
		}
		taker.waitQueued(t, apps)

		stoppedAt := time.Now()
		for _, a := range f.agents[:victims] {
			opsStop(t, a.proc)
		}
		for range apps {
			select {
			case l := <-got:
				require.True(t, l.Acquired)
				took[l.Name] = l
			case <-time.After(2 * ttl):
				t.Fatal("the other agent's app did not get the locks")
			}
		}
		tookAfter = max(tookAfter, time.Since(stoppedAt))
		for _, h := range hs {
			assert.Greater(t, took[h.name].Token, h.token, h.name)
		}
		assert.GreaterOrEqual(t, time.Since(stoppedAt), ttl-renewMax(ttl)-100*time.Millisecond, "not before the stopped agent's leases expired")

		// The apps ask about their locks while the agent is stopped.
		for _, h := range hs {
			h.conn.send(t, `{"id":"p","op":"ping"}`)
			h.conn.send(t, `{"id":"l","op":"list"}`)
			h.conn.send(t, fmt.Sprintf(`{"id":"t","op":"acquire","name":%q}`, h.name))
			h.conn.send(t, fmt.Sprintf(`{"id":"c","op":"check","lease":%q}`, h.lease))
		}
		time.Sleep(time.Until(stoppedAt.Add(2 * ttl)))
		continued = time.Now()
		for _, a := range f.agents[:victims] {
			a.proc.signal(t, syscall.SIGCONT)
		}

		for _, h := range hs {
			var seq []string
			answers := map[string]map[string]any{}
			var lostEv map[string]any
			for len(answers) < 4 {
				l := h.conn.next(t, callTimeout)
				if ev, _ := l.m["event"].(string); ev != "" {
					seq = append(seq, ev)
					if ev == "lost" && l.m["lease"] == h.lease {
						lostEv = l.m
						lostAfter = max(lostAfter, l.at.Sub(continued))
					}
					continue
				}
				id, _ := l.m["id"].(string)
				seq = append(seq, id)
				answers[id] = l.m
				if lostEv != nil {
					continue
				}
				switch {
				case id == "l" && strings.Contains(l.text, h.lease):
					heldBefore = append(heldBefore, fmt.Sprintf("round %d %s: list shows the dead lease", round, h.name))
				case id == "t" && strings.Contains(l.text, "already_held"):
					heldBefore = append(heldBefore, fmt.Sprintf("round %d %s: acquire answered already_held with the dead lease", round, h.name))
				case l.m["held"] == true:
					heldBefore = append(heldBefore, fmt.Sprintf("round %d %s: check answered held", round, h.name))
				}
			}
			s := strings.Join(seq, ",")
			seqs = append(seqs, s)
			require.NotNil(t, lostEv, "%s: the stopped agent reports the lease lost; lines %v", h.name, seq)
			assert.Contains(t, []string{"expired", "backend_unavailable"}, lostEv["reason"], h.name)
			if seq[0] != "lost" {
				notFirst = append(notFirst, fmt.Sprintf("round %d %s: %s", round, h.name, s))
			}
			assert.NotEqual(t, true, answers["c"]["held"], "%s: check after the stop: %v", h.name, answers["c"])
			assert.NotEqual(t, true, answers["t"]["acquired"], "%s: the other app holds it: %v", h.name, answers["t"])
			for _, at := range mon.renewals(h.lease) {
				if !at.Before(stoppedAt) {
					oldRenewals++
				}
			}
		}
		if round+1 < rounds {
			for _, h := range hs {
				opsRelease(t, other, took[h.name].Lease)
			}
		}
	}

	// The other holders are untouched for two renewals: same owner,
	// renewed by their own agent only.
	time.Sleep(2 * renewMax(ttl))
	newRenewals := 0
	for _, h := range hs {
		nl := took[h.name]
		owner, err := rc.HGet(ctx, lockKey(h.name), "o").Result()
		require.NoError(t, err)
		assert.Equal(t, nl.Lease, owner, h.name)
		assert.True(t, opsCheck(t, other, nl.Lease).Held, h.name)
		_, otherLost := olog.lost(nl.Lease)
		assert.False(t, otherLost, h.name)
		pttl := rc.PTTL(ctx, lockKey(h.name)).Val()
		assert.Greater(t, pttl, ttl-renewMax(ttl)-200*time.Millisecond, "%s renewed", h.name)
		for _, at := range mon.renewals(h.lease) { // the last round's old lease
			if at.After(continued) {
				oldRenewals++
			}
		}
		n := 0
		for _, at := range mon.renewals(nl.Lease) {
			if at.After(continued) {
				n++
			}
		}
		assert.GreaterOrEqual(t, n, 1, "%s: the other agent keeps renewing its lease", h.name)
		newRenewals += n
	}
	assert.Zero(t, oldRenewals, "the stopped agent never renews an old lease after the stop")
	t.Logf("C1 %d agents stopped %s (2×TTL) %d times with %d leases each: the other agent's app took them within %s of the stop with higher tokens; lost within %s of SIGCONT; "+
		"lines read per app %v; renewals of old leases after their stop: %d; of the new ones after the last SIGCONT: %d",
		victims, msString(2*ttl), rounds, perAgent, msString(tookAfter), msString(lostAfter), seqs, oldRenewals, newRenewals)
	assert.Empty(t, heldBefore, "BUG: after SIGCONT, answers that present a dead lease as held came before its `lost`")
	assert.Empty(t, notFirst, "BUG: on SIGCONT, `lost` must come before anything else (lines each app read)")
}

// TestC2_AgentStoppedBriefly: a stop of 0.3 x TTL loses nothing.
func TestC2_AgentStoppedBriefly(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	f := startFleet(t, 2, redistest.Options{}, "")
	rc := f.redis.Client(t)
	app := f.agents[0].client(t, "c2-app")
	lg := recordEvents(app)
	other := f.agents[1].client(t, "c2-other")
	var held []lease
	for i := range 3 {
		held = append(held, mustAcquire(t, app, fmt.Sprintf("c2/%d", i), ttlArg(ttl)))
	}
	// Stop just after a renewal is due at the latest, so the pause
	// spans a renewal.
	time.Sleep(renewMax(ttl) / 2)
	stoppedAt := time.Now()
	opsStop(t, f.agents[0].proc)
	time.Sleep(ttl * 3 / 10)
	f.agents[0].proc.signal(t, syscall.SIGCONT)
	continued := time.Now()

	// Longer than a TTL after the stop: only renewals after it can keep
	// the keys.
	time.Sleep(ttl + 300*time.Millisecond)
	for _, l := range held {
		_, lost := lg.lost(l.Lease)
		require.False(t, lost, "%s: nothing lost; events %v", l.Name, lg.kinds())
		assert.True(t, opsCheck(t, app, l.Lease).Held, l.Name)
		owner, err := rc.HGet(t.Context(), lockKey(l.Name), "o").Result()
		require.NoError(t, err)
		assert.Equal(t, l.Lease, owner)
		assert.False(t, tryAcquire(t, other, l.Name, nil).Acquired)
	}
	t.Logf("C2 agent stopped %s (0.3×TTL): %d leases kept, still held %s after SIGCONT; events %v",
		msString(continued.Sub(stoppedAt)), len(held), msString(time.Since(continued)), lg.kinds())
}

// ---------------------------------------------------------------------------
// C3 with Redis: the agent kill -9'd while its app holds locks.

func TestC3_RedisAgentKilled(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	f := startFleet(t, 2, redistest.Options{}, "")
	rc := f.redis.Client(t)
	ctx := t.Context()
	app := f.agents[0].client(t, "c3-app")
	taken := mustAcquire(t, app, "c3/taken", ttlArg(ttl)) // another agent waits for it
	alone := mustAcquire(t, app, "c3/alone", ttlArg(ttl)) // nobody else wants it

	other := f.agents[1].client(t, "c3-other")
	got := make(chan lease, 1)
	go func() {
		var l lease
		other.Call(ctx, "acquire", map[string]any{"name": taken.Name, "wait_ms": 10000, "ttl_ms": ttl.Milliseconds()}, &l)
		got <- l
	}()
	f.agents[1].waitQueued(t, 1)

	// Kill it once it has renewed its leases at least once.
	granted := time.Now()
	eventually(t, renewMax(ttl)+time.Second, "a renewal", func() bool {
		return time.Since(granted) > 300*time.Millisecond && rc.PTTL(ctx, lockKey(alone.Name)).Val() > ttl-150*time.Millisecond
	})
	killed := time.Now()
	killAgent(t, f.agents[0].proc)
	waitDone(t, app, time.Second)
	eof := time.Since(killed)

	// The keys expire on their own: each within TTL of the kill, not
	// sooner than its last renewal allows.
	gone := map[string]time.Duration{}
	eventually(t, ttl+time.Second, "the keys expire", func() bool {
		for _, n := range []string{taken.Name, alone.Name} {
			if _, ok := gone[n]; ok {
				continue
			}
			owner, err := rc.HGet(ctx, lockKey(n), "o").Result()
			if err == goredis.Nil || (n == taken.Name && err == nil && owner != taken.Lease) {
				gone[n] = time.Since(killed)
			}
		}
		return len(gone) == 2
	})
	for n, d := range gone {
		assert.LessOrEqual(t, d, ttl+100*time.Millisecond, "%s expired within TTL", n)
		assert.GreaterOrEqual(t, d, ttl-renewMax(ttl)-100*time.Millisecond, "%s was not released early", n)
	}
	w := receive(t, got, "the waiter on the other agent did not get the lock")
	waited := time.Since(killed)
	require.True(t, w.Acquired)
	assert.Greater(t, w.Token, taken.Token)

	// The restarted agent grants above every old token.
	f.agents[0].start(t)
	app2 := f.agents[0].client(t, "c3-app2")
	again := mustAcquire(t, app2, alone.Name, ttlArg(ttl))
	assert.Greater(t, again.Token, alone.Token)
	opsRelease(t, other, w.Lease)
	back := mustAcquire(t, app2, taken.Name, afterRelease(ttl))
	assert.Greater(t, back.Token, w.Token)
	t.Logf("C3 agent kill -9: app saw EOF after %s; keys expired %s / %s after the kill (TTL %s); the waiter on the other agent got it after %s with token %d > %d; restarted agent's tokens %d > %d, %d > %d",
		msString(eof), msString(gone[taken.Name]), msString(gone[alone.Name]), msString(ttl), msString(waited), w.Token, taken.Token, again.Token, alone.Token, back.Token, w.Token)
}

// TestC4_RedisSigtermReleases: on SIGTERM, an agent on Redis releases
// every lease in Redis before it exits (exclusive and shared, of
// connection and session scope) and takes its waiters' tickets out of the
// queues: with a TTL of a minute, nothing is left to expire, and a waiter
// on another agent gets the name at once.
func TestC4_RedisSigtermReleases(t *testing.T) {
	t.Parallel()
	const ttl = time.Minute
	f := startFleet(t, 2, redistest.Options{}, "")
	rc := f.redis.Client(t)
	ctx := t.Context()
	app := f.agents[0].client(t, "c4-app")
	mustAcquire(t, app, "c4r/conn", ttlArg(ttl))
	mustAcquire(t, app, "c4r/sess", map[string]any{"ttl_ms": ttl.Milliseconds(), "scope": "session"})
	mustAcquire(t, app, "c4r/shared", map[string]any{"ttl_ms": ttl.Milliseconds(), "mode": "shared", "limit": 2})
	// A waiter of agent 0 queues for a name that agent 1 holds.
	other := f.agents[1].client(t, "c4-other")
	mustAcquire(t, other, "c4r/theirs", ttlArg(ttl))
	queued := f.agents[0].client(t, "c4-queued")
	go queued.Call(ctx, "acquire", map[string]any{"name": "c4r/theirs", "wait_ms": -1, "ttl_ms": ttl.Milliseconds()}, nil)
	f.agents[0].waitQueued(t, 1)
	// A waiter of agent 1 queues for a name that agent 0 holds.
	got := make(chan lease, 1)
	go func() {
		var l lease
		other.Call(ctx, "acquire", map[string]any{"name": "c4r/conn", "wait_ms": 10000, "ttl_ms": ttl.Milliseconds()}, &l)
		got <- l
	}()
	f.agents[1].waitQueued(t, 1)
	queue := func(name string) int64 { return rc.ZCard(ctx, lockKey(name)+":q").Val() }
	// Listed as waiting, the acquire may not have reached Redis yet.
	eventually(t, 5*time.Second, "agent 0's waiter is queued in Redis", func() bool { return queue("c4r/theirs") == 1 })

	stopped := time.Now()
	stopAgent(t, f.agents[0].proc)
	exited := time.Since(stopped)
	for _, name := range []string{"c4r/sess", "c4r/shared"} {
		n, err := rc.Exists(ctx, lockKey(name), lockKey(name)+":r").Result()
		require.NoError(t, err)
		assert.Zero(t, n, "%s is released in Redis once the agent has exited", name)
	}
	assert.Zero(t, queue("c4r/theirs"), "agent 0's waiter left the queue")
	w := receive(t, got, "the waiter on the other agent did not get the lock")
	require.True(t, w.Acquired, "the waiter on the other agent got c4r/conn")
	handover := time.Since(stopped)
	assert.Less(t, handover, 5*time.Second, "well before the TTL")
	t.Logf("C4 on Redis: the agent exited %s after SIGTERM with every lease released; the other agent's waiter got the name after %s (TTL %s)",
		msString(exited), msString(handover), msString(ttl))
}

// ---------------------------------------------------------------------------
// Sentinel: a failover under a held lease.

func TestSentinel_Failover(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	sn := redistest.StartSentinel(t, redistest.SentinelOptions{})
	a := opsAgent(t, fmt.Sprintf("  addresses   = %s\n  master_name = %q", opsHCLList(sn.SentinelAddrs()), sn.MasterName()))
	app := a.client(t, "sentinel-app")
	lg := recordEvents(app)

	var before []uint64
	for i := range 4 {
		l := mustAcquire(t, app, fmt.Sprintf("sn/%d", i), ttlArg(ttl))
		before = append(before, l.Token)
		opsRelease(t, app, l.Lease)
	}
	var held []lease
	for i := range 4 {
		l := mustAcquire(t, app, fmt.Sprintf("sn/%d", i), ttlArg(ttl))
		before = append(before, l.Token)
		held = append(held, l)
	}
	oldPrimary := sn.Primary().Addr()
	start := time.Now()
	sn.Failover(t)
	failedOver := time.Now()
	require.NotEqual(t, oldPrimary, sn.Primary().Addr())

	// The agent serves new acquires on the new primary.
	fresh := acquireSoon(t, app, "sn/fresh", 15*time.Second)
	serving := time.Since(failedOver)
	assert.Greater(t, fresh.Token, opsMaxToken(before), "a grant after the failover has a higher token")

	// After more than a TTL, each lease is either kept (so renewed on the
	// new primary) or was reported lost with a documented reason.
	time.Sleep(time.Until(failedOver.Add(ttl + 500*time.Millisecond)))
	rc := sn.Primary().Client(t)
	outcome := map[string]int{}
	for _, l := range held {
		if ev, lost := lg.lost(l.Lease); lost {
			assert.Contains(t, []string{"expired", "taken_over", "backend_unavailable"}, ev.Reason, l.Name)
			outcome["lost:"+ev.Reason]++
			next := mustAcquire(t, app, l.Name, ttlArg(ttl))
			assert.Greater(t, next.Token, l.Token)
			continue
		}
		outcome["kept"]++
		r := opsCheck(t, app, l.Lease)
		assert.True(t, r.Held, "%s: kept without a lost event, so held", l.Name)
		owner, err := rc.HGet(t.Context(), lockKey(l.Name), "o").Result()
		require.NoError(t, err, "%s is on the new primary", l.Name)
		assert.Equal(t, l.Lease, owner)
		opsRelease(t, app, l.Lease)
		next := mustAcquire(t, app, l.Name, ttlArg(ttl))
		assert.Greater(t, next.Token, l.Token, "%s: tokens keep increasing after the failover", l.Name)
	}
	t.Logf("Sentinel failover: took %s; new acquires served %s after it (token %d > %d); leases %v; events %v",
		msString(failedOver.Sub(start)), msString(serving), fresh.Token, opsMaxToken(before), outcome, lg.kinds())
}

// TestSentinel_Credentials: sentinels that accept only a user with a
// password of their own are reached with sentinel_username and the
// password from sentinel_password_file or a systemd credential, which is
// never logged; without them, the agent says so at start, in its own log
// format (go-redis's lines too), and exits 1.
func TestSentinel_Credentials(t *testing.T) {
	t.Parallel()
	password := fmt.Sprintf("sentinel-pw-%d-never-logged", time.Now().UnixNano())
	sn := redistest.StartSentinel(t, redistest.SentinelOptions{Username: "watcher", Password: password})
	e := newAgentEnv(t)
	pwFile := filepath.Join(e.dir, "sentinel.password")
	require.NoError(t, os.WriteFile(pwFile, []byte(password+"\n"), 0o600))
	creds := filepath.Join(e.dir, "creds")
	require.NoError(t, os.Mkdir(creds, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(creds, "sentinel-password"), []byte(password), 0o600))
	backend := func(secret string) string {
		return fmt.Sprintf("backend \"redis\" {\n  addresses   = %s\n  master_name = %q\n  key_prefix  = \"e2e\"\n%s}\n",
			opsHCLList(sn.SentinelAddrs()), sn.MasterName(), secret)
	}
	for _, secret := range []string{
		fmt.Sprintf("  sentinel_username = \"watcher\"\n  sentinel_password_file = %q\n", pwFile),
		"  sentinel_username = \"watcher\"\n  sentinel_password_credential = \"sentinel-password\"\n",
	} {
		e.writeConfig(t, backend(secret))
		a := e.start(t, "CREDENTIALS_DIRECTORY="+creds)
		c := dialAgent(t, e.socket, "e2e-sentinel")
		l := mustAcquire(t, c, "sn/credentials", nil)
		owner, err := sn.Primary().Client(t).HGet(t.Context(), lockKey(l.Name), "o").Result()
		require.NoError(t, err, "the lease is on the primary the sentinel names")
		assert.Equal(t, l.Lease, owner)
		opsRelease(t, c, l.Lease)
		stopAgent(t, a)
		require.NotContains(t, a.stderr.String(), password, "the password is never logged")
	}

	e.writeConfig(t, backend(""))
	a := e.spawn(t)
	require.Equal(t, 1, a.wait(t, 2*exitTimeout), "the agent's exit status without the sentinel's credentials")
	require.Contains(t, a.stderr.String(), "NOAUTH")
	for line := range strings.Lines(a.stderr.String()) {
		require.Regexp(t, `^(\d{4}-\d\d-\d\dT[0-9:.]+Z \[(INFO|WARN|ERROR)\] |lockagent: redis: )`, line, "every line in the agent's log format, or its last word")
	}
	require.Contains(t, a.stderr.String(), "[WARN]  lockagent.backend.go-redis: sentinel: GetMasterAddrByName")
}

// TestSentinel_FailoverAfterAcquire (redis.md section 7, case 21): the
// primary dies right after a grant that its replica has not received, and
// the sentinel promotes the replica. To make the grant miss the replica
// for certain, the replica is paused and the primary fed junk until its
// replication stream waits in the primary's own buffer (the kernel's are
// full); the grant goes behind it, and dies with the primary. Without
// wait_replicas the grant is handed out, and the new primary grants the
// name again to an app on another agent: a double grant, which fencing
// tokens order and which lasts until the first holder's next renewal
// (measured). With wait_replicas = 1 the grant is given back and the
// acquire fails: no double grant.
func TestSentinel_FailoverAfterAcquire(t *testing.T) {
	t.Parallel()
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait_replicas=%t", wait), func(t *testing.T) {
			t.Parallel()
			sentinelFailoverAfterAcquire(t, wait)
		})
	}
}

func sentinelFailoverAfterAcquire(t *testing.T, wait bool) {
	const ttl = 6 * time.Second
	sn := redistest.StartSentinel(t, redistest.SentinelOptions{})
	body := fmt.Sprintf("  addresses   = %s\n  master_name = %q", opsHCLList(sn.SentinelAddrs()), sn.MasterName())
	if wait {
		body += "\n  wait_replicas = 1\n  wait_timeout  = \"200ms\""
	}
	holder := opsAgent(t, body).client(t, "case21-holder")
	hlog := recordEvents(holder)
	other := opsAgent(t, body).client(t, "case21-other")
	ctx := t.Context()

	warm := mustAcquire(t, holder, "case21/warm", ttlArg(ttl))
	opsRelease(t, holder, warm.Lease)

	replica := sn.Replica()
	replica.Pause()
	resumed := false
	defer func() {
		if !resumed {
			replica.Resume()
		}
	}()
	old := sn.Primary()
	bufferReplication(t, old.Client(t))

	var held lease
	err := holder.Call(ctx, "acquire", map[string]any{"name": "case21/x", "ttl_ms": ttl.Milliseconds()}, &held)
	if wait {
		var se *client.Error
		require.ErrorAs(t, err, &se, "a grant the replica does not have is given back")
		assert.Equal(t, "backend_unavailable", se.Code)
		assert.Contains(t, se.Message, "reached 0 of 1 replicas")
	} else {
		require.NoError(t, err)
		require.True(t, held.Acquired, "without wait_replicas the grant is handed out at once")
	}

	// The app on the other agent waits for the name: queued behind the
	// holder (without wait_replicas); its agent asks again through the
	// failover until the new primary grants it.
	got := make(chan grab, 1)
	go func() {
		var l lease
		err := other.Call(ctx, "acquire", map[string]any{"name": "case21/x", "ttl_ms": ttl.Milliseconds(), "wait_ms": 30000}, &l)
		got <- grab{l, time.Now(), err}
	}()
	if !wait {
		rc := old.Client(t)
		eventually(t, callTimeout, "the other app is queued", func() bool {
			return rc.Exists(ctx, lockKey("case21/x")+":q").Val() == 1
		})
	}
	old.Kill()
	killed := time.Now()
	replica.Resume()
	resumed = true
	sn.AwaitFailover(t)
	failedOver := time.Now()
	if wait {
		// The new primary has no replica left: attach one, or every grant
		// would be given back.
		host, port, err := net.SplitHostPort(sn.Primary().Addr())
		require.NoError(t, err)
		require.NoError(t, sn.Primary().Client(t).ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err())
		redistest.Start(t, redistest.Options{Args: []string{"--replicaof", host, port}})
	}
	g := receive(t, got, "the other app did not get case21/x on the new primary")
	require.NoError(t, g.err)
	require.True(t, g.l.Acquired)
	next, granted := g.l, g.at
	if wait {
		require.Empty(t, held.Lease)
		t.Logf("case 21 with wait_replicas=1: the grant the replica missed was given back (backend_unavailable); "+
			"failover %s after the kill; the other app got the name %s after the kill (token %d): no double grant",
			msString(failedOver.Sub(killed)), msString(granted.Sub(killed)), next.Token)
		return
	}

	// Two grants of one name. Tokens order them: the new primary lost the
	// counter with the grant, and starts again from its clock.
	assert.Greater(t, next.Token, held.Token, "the second grant's token is higher")
	ev := hlog.waitLost(t, held.Lease, ttl)
	assert.Contains(t, []string{"expired", "taken_over"}, ev.Reason, "the new primary has no such lease, or another's")
	assert.LessOrEqual(t, ev.at.Sub(failedOver), renewMax(ttl)+time.Second,
		"the holder learns of the loss at its next renewal on the new primary")
	overlap := max(ev.at.Sub(granted), 0)
	info := inspect(t, other, "case21/x")
	require.Len(t, info.Holders, 1)
	assert.Equal(t, next.Token, info.Holders[0].Token)
	t.Logf("case 21 without wait_replicas: the grant (token %d) died with the primary; failover %s after the kill; "+
		"the other app got the name %s after the kill (token %d); double grant: %t, for %s, until the holder's renewal told it (lost: %s)",
		held.Token, msString(failedOver.Sub(killed)), msString(granted.Sub(killed)), next.Token, overlap > 0, msString(overlap), ev.Reason)
}

// bufferReplication writes junk to a primary whose replica is paused until
// at least 1 MiB of the replication stream waits in the primary's output
// buffer: the kernel's socket buffers are full, and whatever the primary
// writes next reaches the replica only after that MiB.
func bufferReplication(t *testing.T, rc *goredis.Client) {
	t.Helper()
	ctx := t.Context()
	junk := strings.Repeat("j", 1<<20)
	for i := 0; ; i++ {
		require.Less(t, i, 256, "the replication stream never waited in the primary's buffer")
		require.NoError(t, rc.Set(ctx, fmt.Sprintf("junk/%d", i), junk, 0).Err())
		list, err := rc.Do(ctx, "CLIENT", "LIST", "TYPE", "replica").Text()
		require.NoError(t, err)
		for _, field := range strings.Fields(list) {
			if n, ok := strings.CutPrefix(field, "omem="); ok {
				if b, err := strconv.Atoi(n); err == nil && b >= 1<<20 {
					return
				}
			}
		}
	}
}

// ---------------------------------------------------------------------------
// Cluster: three primaries, two agents.

func TestCluster_TwoAgents(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	cl := redistest.StartCluster(t, 3)
	body := fmt.Sprintf("  addresses = %s\n  cluster   = true", opsHCLList(cl.Addrs()))
	agents := []*fleetAgent{opsAgent(t, body), opsAgent(t, body)}
	cc := cl.Client(t)
	ctx := t.Context()

	// Which primary owns each name's slot.
	slots, err := cc.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	ownerOf := func(name string) string {
		slot, err := cc.ClusterKeySlot(ctx, lockKey(name)).Result()
		require.NoError(t, err)
		for _, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) {
				return s.Nodes[0].Addr
			}
		}
		t.Fatalf("no node serves slot %d", slot)
		return ""
	}
	nodes := map[string]*goredis.Client{}
	for _, addr := range cl.Addrs() {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		nodes[addr] = c
	}

	// Many names, granted on both agents: each key lives on its slot's
	// primary, and all three primaries are used.
	apps := []*client.Client{agents[0].client(t, "cl-0"), agents[1].client(t, "cl-1")}
	logs := []*eventLog{recordEvents(apps[0]), recordEvents(apps[1])}
	perNode := map[string][]string{}
	for i := range 24 {
		n := fmt.Sprintf("cl/%d", i)
		addr := ownerOf(n)
		perNode[addr] = append(perNode[addr], n)
		l := mustAcquire(t, apps[i%2], n, ttlArg(ttl))
		owner, err := nodes[addr].HGet(ctx, lockKey(n), "o").Result()
		require.NoError(t, err, "%s lives on %s", n, addr)
		assert.Equal(t, l.Lease, owner)
		assert.False(t, tryAcquire(t, apps[(i+1)%2], n, nil).Acquired, "%s is held across agents", n)
		opsRelease(t, apps[i%2], l.Lease)
	}
	require.Len(t, perNode, 3, "the names are spread over the three primaries")

	// A1 across agents, one name per primary: the waiter on the other
	// agent is woken by the release.
	var slowest time.Duration
	for addr, names := range perNode {
		n := names[0]
		holder := agents[0].client(t, "cl-holder")
		l := mustAcquire(t, holder, n, ttlArg(ttl))
		waiter := agents[1].client(t, "cl-waiter")
		got := make(chan lease, 1)
		go func() {
			var w lease
			waiter.Call(ctx, "acquire", map[string]any{"name": n, "wait_ms": 10000, "ttl_ms": ttl.Milliseconds()}, &w)
			got <- w
		}()
		agents[1].waitQueued(t, 1)
		dropped := time.Now()
		holder.Close()
		w := receive(t, got, fmt.Sprintf("%s (on %s): the waiter did not get the lock", n, addr))
		took := time.Since(dropped)
		require.True(t, w.Acquired)
		assert.Greater(t, w.Token, l.Token)
		assert.Less(t, took, 500*time.Millisecond, "%s (on %s): the waiter was woken by the release", n, addr)
		slowest = max(slowest, took)
		waiter.Close()
	}

	// Mutual exclusion and increasing tokens: four apps, two per agent,
	// race for a hot set spanning the primaries.
	var hot []string
	for _, names := range perNode {
		hot = append(hot, names[1], names[2])
	}
	h := lockcheck.NewHistory()
	wctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var workers []*client.Client
	var wlogs []*eventLog
	for i := range 4 {
		c := agents[i%2].client(t, fmt.Sprintf("cl-worker-%d", i))
		workers = append(workers, c)
		wlogs = append(wlogs, recordEvents(c))
	}
	for i, c := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for wctx.Err() == nil {
				n := hot[rng.IntN(len(hot))]
				at := h.Now()
				var l lease
				err := c.Call(ctx, "acquire", map[string]any{"name": n, "wait_ms": 2000, "ttl_ms": ttl.Milliseconds()}, &l)
				if err != nil {
					t.Errorf("worker %d: acquire %s: %v", i, n, err)
					return
				}
				h.Add(at, lockcheck.Input{Kind: lockcheck.Acquire, Name: n, Client: i}, lockcheck.Output{OK: l.Acquired, Token: l.Token})
				if !l.Acquired {
					continue
				}
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
				at = h.Now()
				var r struct {
					Released bool `json:"released"`
				}
				if err := c.Call(ctx, "release", map[string]any{"lease": l.Lease}, &r); err != nil {
					t.Errorf("worker %d: release %s: %v", i, n, err)
					return
				}
				h.Add(at, lockcheck.Input{Kind: lockcheck.Release, Name: n, Client: i}, lockcheck.Output{OK: r.Released})
			}
		}()
	}
	wg.Wait()
	res, err := lockcheck.CheckStrict(h, t.TempDir())
	require.NoError(t, err)
	assert.True(t, res.OK, "one holder at a time, tokens increasing; see %s", res.Visualization)
	assert.Greater(t, res.Operations, 100)
	for _, lg := range append(wlogs, logs...) {
		assert.Empty(t, lg.kinds(), "no event in a fault-free run")
	}
	spread := map[string]int{}
	for addr, names := range perNode {
		spread[addr] = len(names)
	}
	t.Logf("Cluster: 24 names over 3 primaries %v; A1 across agents on each primary, slowest %s; %d operations by 4 apps on 2 agents over %d hot names: linearizable",
		spread, msString(slowest), res.Operations, len(hot))
}

// TestCluster_SlotMigration (redis.md section 7, case 22): the slot of a
// held name moves to another primary while its lease is renewed, through
// the states of a resharding (MIGRATING and IMPORTING: ASK redirects;
// then the new owner: MOVED). The lease stays held and renewed, nobody
// else gets the name meanwhile, a waiter on it is still woken by its
// release, and the keys end on the new primary.
func TestCluster_SlotMigration(t *testing.T) {
	t.Parallel()
	const ttl = time.Second // renewed every third of a second
	cl := redistest.StartCluster(t, 3)
	body := fmt.Sprintf("  addresses = %s\n  cluster   = true", opsHCLList(cl.Addrs()))
	agent := opsAgent(t, body)
	cc := cl.Client(t)
	ctx := t.Context()
	nodes := map[string]*goredis.Client{}
	ids := map[string]string{}
	for _, addr := range cl.Addrs() {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		nodes[addr] = c
		id, err := c.Do(ctx, "CLUSTER", "MYID").Text()
		require.NoError(t, err)
		ids[addr] = id
	}

	const name = "mig/held"
	slot, err := cc.ClusterKeySlot(ctx, lockKey(name)).Result()
	require.NoError(t, err)
	var from, to string
	for addr, c := range nodes {
		all, err := c.Do(ctx, "CLUSTER", "NODES").Text()
		require.NoError(t, err)
		for _, line := range strings.Split(all, "\n") {
			if strings.Contains(line, "myself") && slotInLine(line, slot) {
				from = addr
			}
		}
	}
	require.NotEmpty(t, from, "the primary of slot %d", slot)
	for addr := range nodes {
		if addr != from {
			to = addr
			break
		}
	}

	app := agent.client(t, "mig-app")
	events := recordEvents(app)
	l := mustAcquire(t, app, name, ttlArg(ttl))
	other := agent.client(t, "mig-other")
	got := make(chan lease, 1)
	go func() {
		var w lease
		other.Call(ctx, "acquire", map[string]any{"name": name, "wait_ms": 20000, "ttl_ms": ttl.Milliseconds()}, &w)
		got <- w
	}()
	agent.waitQueued(t, 1)

	// renewed waits through a few renewals and checks the lease is held.
	renewed := func(what string) {
		t.Helper()
		until := time.Now().Add(ttl + ttl/2)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for ; time.Now().Before(until); <-tick.C {
			require.True(t, opsCheck(t, app, l.Lease).Held, "%s: the lease is held", what)
		}
		select {
		case w := <-got:
			t.Fatalf("%s: the waiter got the name while it was held: %+v", what, w)
		default:
		}
	}
	// landed waits until a renewal lands where pttl reads the holder's
	// key, and checks that nobody else got the name. While the slot
	// migrates, the agent's scripts of several keys, some of which do not
	// exist (a check, an acquire), get TRYAGAIN: only the renewals, of the
	// holder's key alone, go through (see docs/redis.md).
	landed := func(where string, pttl func() time.Duration) {
		t.Helper()
		prev := pttl()
		eventually(t, 2*ttl, "a renewal lands on "+where, func() bool {
			cur := pttl()
			up := cur > prev+5*time.Millisecond
			prev = cur
			return up
		})
		select {
		case w := <-got:
			t.Fatalf("%s: the waiter got the name while it was held: %+v", where, w)
		default:
		}
	}
	cluster := func(addr string, args ...any) {
		t.Helper()
		require.NoError(t, nodes[addr].Do(ctx, append([]any{"CLUSTER"}, args...)...).Err(), "%s: CLUSTER %v", addr, args)
	}

	// The resharding's steps, as redis-cli --cluster reshard takes them,
	// the lease renewed at each: while the slot is MIGRATING, the old
	// primary serves the keys it still has and redirects the others with
	// ASK, which go-redis follows. (Between the moves of a name's keys, a
	// script whose keys are partly on each side gets TRYAGAIN, which
	// go-redis retries a few times: reshard moves them in one MIGRATE.)
	cluster(to, "SETSLOT", slot, "IMPORTING", ids[from])
	cluster(from, "SETSLOT", slot, "MIGRATING", ids[to])
	landed("the old primary, the slot MIGRATING", func() time.Duration {
		pttl, err := nodes[from].PTTL(ctx, lockKey(name)).Result()
		require.NoError(t, err)
		return pttl
	})
	keys, err := nodes[from].Do(ctx, "CLUSTER", "GETKEYSINSLOT", slot, 100).StringSlice()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	host, port, err := net.SplitHostPort(to)
	require.NoError(t, err)
	migrate := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		migrate = append(migrate, k)
	}
	require.NoError(t, nodes[from].Do(ctx, migrate...).Err())
	// The renewals follow ASK to the new primary.
	importing := nodes[to].Conn()
	t.Cleanup(func() { importing.Close() })
	landed("the new primary, through ASK", func() time.Duration {
		var pttl *goredis.DurationCmd
		_, err := importing.Pipelined(ctx, func(p goredis.Pipeliner) error {
			p.Do(ctx, "ASKING")
			pttl = p.PTTL(ctx, lockKey(name))
			return nil
		})
		require.NoError(t, err, "PTTL on the importing primary")
		return pttl.Val()
	})
	for addr := range nodes {
		cluster(addr, "SETSLOT", slot, "NODE", ids[to])
	}
	renewed("slot moved (MOVED)")

	owner, err := nodes[to].HGet(ctx, lockKey(name), "o").Result()
	require.NoError(t, err)
	assert.Equal(t, l.Lease, owner, "the holder's key is on the new primary")
	pttl, err := nodes[to].PTTL(ctx, lockKey(name)).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, ttl/3, "renewed there")

	released := time.Now()
	opsRelease(t, app, l.Lease)
	w := receive(t, got, "the waiter did not get the name after its release")
	require.True(t, w.Acquired)
	assert.Greater(t, w.Token, l.Token)
	assert.Empty(t, events.kinds(), "no lost event")
	t.Logf("Cluster slot %d moved from %s to %s under a renewed lease; its waiter had the name %s after the release",
		slot, from, to, msString(time.Since(released)))
}

// slotInLine tells whether a line of CLUSTER NODES lists slot among its
// ranges.
func slotInLine(line string, slot int64) bool {
	f := strings.Fields(line)
	for _, r := range f[min(8, len(f)):] {
		lo, hi, ok := strings.Cut(r, "-")
		if !ok {
			hi = lo
		}
		a, err1 := strconv.ParseInt(lo, 10, 64)
		b, err2 := strconv.ParseInt(hi, 10, 64)
		if err1 == nil && err2 == nil && a <= slot && slot <= b {
			return true
		}
	}
	return false
}
