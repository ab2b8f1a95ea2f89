package main

// Faults between agents and Redis (scenarios A2, B1–B5 and B11 of
// docs/testing.md): real agent processes, one real redis-server,
// each agent behind its own fault proxy. Times are taken on the test's
// clock when a response or an event reaches the test, so a grant is seen no
// earlier, and a loss no later, than the agent made it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit/lockcheck"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// fltCode is the error code of a failed call, or "".
func fltCode(err error) string {
	var e *client.Error
	if errors.As(err, &e) {
		return e.Code
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

// fltRedisLock is what Redis holds for an exclusive lock, read directly
// (not through any proxy).
type fltRedisLock struct {
	exists bool
	owner  string // the lease id
	token  uint64
	pttl   time.Duration
}

// fltReadLock reads a lock's key in one transaction. Safe from any
// goroutine.
func fltReadLock(rc *goredis.Client, name string) (fltRedisLock, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	k := lockKey(name)
	var hm *goredis.SliceCmd
	var pt *goredis.Cmd
	if _, err := rc.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		hm = p.HMGet(ctx, k, "o", "k")
		pt = p.Do(ctx, "PTTL", k)
		return nil
	}); err != nil {
		return fltRedisLock{}, err
	}
	ms, err := pt.Int64()
	if err != nil {
		return fltRedisLock{}, err
	}
	if ms == -2 {
		return fltRedisLock{}, nil
	}
	l := fltRedisLock{exists: true, pttl: time.Duration(ms) * time.Millisecond}
	v := hm.Val()
	if s, ok := v[0].(string); ok {
		l.owner = s
	}
	if s, ok := v[1].(string); ok {
		l.token, _ = strconv.ParseUint(s, 10, 64)
	}
	return l, nil
}

func fltMustReadLock(t *testing.T, rc *goredis.Client, name string) fltRedisLock {
	t.Helper()
	l, err := fltReadLock(rc, name)
	require.NoError(t, err, "read %s in redis", lockKey(name))
	return l
}

// fltWaitRenewal waits until the key's PTTL goes up, that is until a
// renewal has landed, and returns when it saw it.
func fltWaitRenewal(t *testing.T, rc *goredis.Client, name string, timeout time.Duration) time.Time {
	t.Helper()
	prev := fltMustReadLock(t, rc, name).pttl
	var at time.Time
	eventually(t, timeout, "a renewal of "+name+" lands in redis", func() bool {
		cur := fltMustReadLock(t, rc, name).pttl
		up := cur > prev+5*time.Millisecond
		prev = cur
		if up {
			at = time.Now()
		}
		return up
	})
	return at
}

// fltLeaseCount counts the leases an agent lists, across its sessions.
func fltLeaseCount(t *testing.T, c *client.Client) int {
	t.Helper()
	var res struct {
		Sessions []struct {
			Leases []struct{} `json:"leases"`
		} `json:"sessions"`
	}
	call(t, c, "list", map[string]any{"all": true}, &res)
	n := 0
	for _, s := range res.Sessions {
		n += len(s.Leases)
	}
	return n
}

// fltFDs counts a process's open file descriptors.
func fltFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	require.NoError(t, err)
	return len(ents)
}

// fltGoroutines ends an agent with SIGQUIT, which makes the Go runtime dump
// every goroutine, and counts those running code outside the runtime (the
// agent's, its libraries' and the standard library's).
func fltGoroutines(t *testing.T, p *proc) int {
	t.Helper()
	p.signal(t, syscall.SIGQUIT)
	p.wait(t, exitTimeout)
	n := 0
	for _, block := range strings.Split(p.stderr.String(), "\n\n") {
		if strings.HasPrefix(strings.TrimSpace(block), "goroutine ") && strings.Contains(block, "github.com/") {
			n++
		}
	}
	require.NotZero(t, n, "no goroutine dump from %s", p.name)
	return n
}

// fltMonitor records the commands redis-server runs (MONITOR, through
// redis-cli). Its output is not logged on failure: it is mostly the tests'
// own polling; trace shows what matters.
type fltMonitor struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

func fltStartMonitor(t *testing.T, addr string) *fltMonitor {
	t.Helper()
	host, port, ok := strings.Cut(addr, ":")
	require.True(t, ok, addr)
	m := &fltMonitor{out: new(syncBuffer), done: make(chan struct{})}
	m.cmd = exec.Command("redis-cli", "-h", host, "-p", port, "monitor")
	m.cmd.Stdout, m.cmd.Stderr = m.out, m.out
	m.cmd.WaitDelay = 2 * time.Second
	require.NoError(t, m.cmd.Start(), "start redis-cli monitor")
	go func() {
		m.cmd.Wait()
		close(m.done)
	}()
	t.Cleanup(func() {
		m.cmd.Process.Kill()
		<-m.done
	})
	eventually(t, exitTimeout, "redis-cli monitor starts", func() bool { return strings.Contains(m.out.String(), "OK") })
	return m
}

// fltCommand is a script call as MONITOR shows it.
type fltCommand struct {
	at   time.Time // the server's clock
	args []string
}

var fltMonitorLine = regexp.MustCompile(`^(\d+\.\d+) \[\d+ [^\]]+\] (.*)$`)

// scriptCalls returns the EVALSHA/EVAL calls made by clients (not the
// commands run inside scripts).
func (m *fltMonitor) scriptCalls() []fltCommand {
	var out []fltCommand
	for _, line := range strings.Split(m.out.String(), "\n") {
		sm := fltMonitorLine.FindStringSubmatch(strings.TrimSpace(line))
		if sm == nil || strings.Contains(line, " lua] ") {
			continue
		}
		sec, err := strconv.ParseFloat(sm[1], 64)
		if err != nil {
			continue
		}
		var args []string
		for _, q := range regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`).FindAllStringSubmatch(sm[2], -1) {
			args = append(args, q[1])
		}
		if len(args) < 3 || !strings.EqualFold(args[0], "evalsha") && !strings.EqualFold(args[0], "eval") {
			continue
		}
		out = append(out, fltCommand{at: time.UnixMicro(int64(sec * 1e6)), args: args})
	}
	return out
}

// calls counts, per kind, the script calls about leaseID that Redis ran
// at or after since. The scripts are told apart by their key count and
// arguments (backend/redis/scripts.go, renew.go): the renewal scripts as
// renewCallLeases says (a renewal the exclusive script missed, then sent
// to the general one, counts twice); acquire 7 keys and 8 arguments;
// release 6 keys and 2 arguments.
func (m *fltMonitor) calls(leaseID string, since time.Time) (renews, acquires, releases int) {
	for _, c := range m.scriptCalls() {
		if c.at.Before(since) {
			continue
		}
		if _, leases, ok := renewCallLeases(c.args); ok {
			if slices.Contains(leases, leaseID) {
				renews++
			}
			continue
		}
		nkeys, err := strconv.Atoi(c.args[2])
		if err != nil || len(c.args) < 3+nkeys+1 || c.args[3+nkeys] != leaseID {
			continue
		}
		switch nargs := len(c.args) - 3 - nkeys; {
		case nkeys == 7 && nargs == 8:
			acquires++
		case nkeys == 6 && nargs == 2:
			releases++
		}
	}
	return
}

// acquireTimes returns the server times of the acquire calls for leaseID.
func (m *fltMonitor) acquireTimes(leaseID string) []time.Time {
	var out []time.Time
	for _, c := range m.scriptCalls() {
		nkeys, err := strconv.Atoi(c.args[2])
		if err == nil && nkeys == 7 && len(c.args) == 3+nkeys+8 && c.args[3+nkeys] == leaseID {
			out = append(out, c.at)
		}
	}
	return out
}

// acquireLeases returns the lease ids of the acquire calls on name, in the
// order of their first call.
func (m *fltMonitor) acquireLeases(name string) []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range m.scriptCalls() {
		nkeys, err := strconv.Atoi(c.args[2])
		if err == nil && nkeys == 7 && len(c.args) == 3+nkeys+8 && c.args[3] == lockKey(name) && !seen[c.args[3+nkeys]] {
			seen[c.args[3+nkeys]] = true
			out = append(out, c.args[3+nkeys])
		}
	}
	return out
}

// waitSeen waits until MONITOR has shown a script call with leaseID: a
// sync point, after which what Redis ran before that call is in the
// output too.
func (m *fltMonitor) waitSeen(t *testing.T, leaseID string) {
	t.Helper()
	eventually(t, 5*time.Second, "MONITOR shows "+leaseID, func() bool {
		return strings.Contains(m.out.String(), `"`+leaseID+`"`)
	})
}

// trace lists the script calls on name's keys, for failure reports: time
// since base, script (by key count and arguments), lease id.
func (m *fltMonitor) trace(name string, base time.Time) string {
	var b strings.Builder
	for _, c := range m.scriptCalls() {
		if xs, leases, ok := renewCallLeases(c.args); ok {
			if i := slices.Index(xs, lockKey(name)); i >= 0 {
				fmt.Fprintf(&b, "\n  %+7dms %-7s %s", c.at.Sub(base).Milliseconds(), "renew", leases[i])
			}
			continue
		}
		nkeys, err := strconv.Atoi(c.args[2])
		if err != nil || len(c.args) < 4 || c.args[3] != lockKey(name) {
			continue
		}
		lease := ""
		if len(c.args) > 3+nkeys {
			lease = c.args[3+nkeys]
		}
		kind := "script"
		switch nargs := len(c.args) - 3 - nkeys; {
		case nkeys == 7 && nargs == 8:
			kind = "acquire"
		case nkeys == 6 && nargs == 2:
			kind = "release"
		case nkeys == 5:
			kind = "inspect"
		}
		fmt.Fprintf(&b, "\n  %+7dms %-7s %s", c.at.Sub(base).Milliseconds(), kind, lease)
	}
	return b.String()
}

// fltHistory records lock operations and holding intervals on the test's
// clock, for a porcupine check with lockcheck.Strict and a plain check
// that no two holds overlap.
type fltHistory struct {
	mu       sync.Mutex
	base     time.Time
	ops      []porcupine.Operation
	holds    []fltHold
	problems []string
}

// fltHold is the time an application treated a grant as its own: from the
// answer's arrival until it sent release or received lost.
type fltHold struct {
	who      int
	name     string
	token    uint64
	from, to time.Time
}

// fltForever is the return time of an operation whose effect in the
// backend has no known end (a lost lease is freed there some time later).
const fltForever = int64(24 * time.Hour)

func newFltHistory() *fltHistory { return &fltHistory{base: time.Now()} }

func (h *fltHistory) at(t time.Time) int64 { return int64(t.Sub(h.base)) }

func (h *fltHistory) add(who int, kind lockcheck.Kind, name string, call, ret int64, out lockcheck.Output) {
	h.mu.Lock()
	defer h.mu.Unlock()
	in := lockcheck.Input{Kind: kind, Name: name, Client: who}
	h.ops = append(h.ops, porcupine.Operation{ClientId: who, Input: in, Call: call, Output: out, Return: ret})
}

func (h *fltHistory) acquire(who int, name string, sent, got time.Time, ok bool, token uint64) {
	h.add(who, lockcheck.Acquire, name, h.at(sent), h.at(got), lockcheck.Output{OK: ok, Token: token})
}

func (h *fltHistory) problem(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.problems = append(h.problems, fmt.Sprintf(format, args...))
}

// use keeps a fresh grant for hold, or until it is lost, then releases it,
// and records the hold and the release.
func (h *fltHistory) use(who int, c *client.Client, ev *eventLog, name string, l lease, got time.Time, hold time.Duration) {
	for until := got.Add(hold); time.Now().Before(until); time.Sleep(5 * time.Millisecond) {
		if _, lost := ev.lost(l.Lease); lost {
			break
		}
	}
	sent := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	var rr struct {
		Released bool `json:"released"`
	}
	err := c.Call(ctx, "release", map[string]any{"lease": l.Lease}, &rr)
	cancel()
	done := time.Now()
	end := sent
	lostEv, lost := ev.lost(l.Lease)
	if !lost && err != nil {
		lostEv, lost = ev.lostSoon(l.Lease, 500*time.Millisecond)
	}
	if lost && lostEv.at.Before(end) {
		end = lostEv.at
	}
	h.mu.Lock()
	h.holds = append(h.holds, fltHold{who: who, name: name, token: l.Token, from: got, to: end})
	h.mu.Unlock()
	switch {
	case lost || err != nil:
		// Freed in the backend at some unknown time after the loss.
		h.add(who, lockcheck.Release, name, h.at(end), fltForever, lockcheck.Output{OK: true})
		if err != nil && fltCode(err) != "not_held" {
			h.problem("release of %s by %d: %v", l.Lease, who, err)
		}
	default:
		h.add(who, lockcheck.Release, name, h.at(sent), h.at(done), lockcheck.Output{OK: rr.Released})
	}
}

// check runs the checks: porcupine on the operations, no two holds of a
// name overlapping, tokens increasing in the order of the holds.
func (h *fltHistory) check(t *testing.T) (ops, holds, violations int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.problems {
		t.Error(p)
		violations++
	}
	if res, info := porcupine.CheckOperationsVerbose(lockcheck.Strict, h.ops, time.Minute); res != porcupine.Ok {
		path := artifact(t, "history.html")
		if err := porcupine.VisualizePath(lockcheck.Strict, info, path); err != nil {
			t.Logf("visualization: %v", err)
		}
		t.Errorf("the history of %d operations is not linearizable as a lock (%s); porcupine's view: %s", len(h.ops), res, path)
		violations++
	}
	hs := append([]fltHold(nil), h.holds...)
	sort.Slice(hs, func(i, j int) bool { return hs[i].from.Before(hs[j].from) })
	for i := range hs {
		for j := i + 1; j < len(hs); j++ {
			a, b := hs[i], hs[j]
			if a.name != b.name {
				continue
			}
			if b.from.Before(a.to) {
				t.Errorf("two holders of %s at once: client %d (token %d) %v..%v and client %d (token %d) from %v",
					a.name, a.who, a.token, a.from.Sub(h.base), a.to.Sub(h.base), b.who, b.token, b.from.Sub(h.base))
				violations++
			}
			if b.token <= a.token {
				t.Errorf("%s: token %d granted after token %d", a.name, b.token, a.token)
				violations++
			}
		}
	}
	return len(h.ops), len(hs), violations
}

// artifact is the path of a file a failed test leaves for study, in a
// directory named by the test and the time, under $LOCKAGENT_ARTIFACTS or
// else the temporary directory; it outlives the test.
func artifact(t *testing.T, name string) string {
	base := os.Getenv("LOCKAGENT_ARTIFACTS")
	if base == "" {
		base = os.TempDir()
	}
	dir := filepath.Join(base, fmt.Sprintf("lockagent-%s-%s", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().Format("20060102-150405")))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("artifacts: %v", err)
	}
	return filepath.Join(dir, name)
}

// TestA2_DropWhileRedisBlackholed: an application holding locks drops
// while its agent's link to Redis is black-holed. The agent stops renewing
// them at once (no key is extended after the drop); the keys expire within
// TTL of their last renewal; the agent makes a bounded number of attempts
// and connections; and once the link is back, nothing it sent into the
// black hole brings a lease back or touches the next holder's.
func TestA2_DropWhileRedisBlackholed(t *testing.T) {
	t.Parallel()
	const ttl = 1500 * time.Millisecond
	f := startFleet(t, 2, redistest.Options{}, "")
	a, b := f.agents[0], f.agents[1]
	rc := f.redis.Client(t)
	mon := fltStartMonitor(t, f.redis.Addr())
	names := []string{"a2/0", "a2/1", "a2/2"}

	app := a.client(t, "a2-app")
	var held []lease
	for _, n := range names {
		held = append(held, mustAcquire(t, app, n, ttlArg(ttl)))
	}
	observer := a.client(t, "a2-observer")
	// Renewals work; the fault starts right after one.
	fltWaitRenewal(t, rc, names[0], ttl)
	conns0 := a.proxy.Conns()
	a.proxy.Blackhole()
	t0 := time.Now()
	// Each key expires, on Redis's clock, within TTL of the black hole's
	// start: its last renewal landed before it.
	serverT0, err := rc.Time(t.Context()).Result()
	require.NoError(t, err)
	for _, n := range names {
		exp, err := rc.PExpireTime(t.Context(), lockKey(n)).Result()
		require.NoError(t, err)
		assert.LessOrEqual(t, exp.Milliseconds(), serverT0.UnixMilli()+ttl.Milliseconds()+1,
			"%s expires %dms after the black hole's start", n, exp.Milliseconds()-serverT0.UnixMilli())
	}
	require.NoError(t, app.Close())
	dropped := time.Now()

	// The agent forgets the leases at once: nothing is left to renew.
	eventually(t, time.Second, "agent A drops the leases of the closed connection", func() bool {
		return fltLeaseCount(t, observer) == 0
	})
	forgotten := time.Since(dropped)

	// From the drop on, no key is extended, so each expires as above.
	prev := map[string]time.Duration{}
	gone := map[string]time.Duration{}
	extended := 0
	eventually(t, ttl+2*time.Second, "every key expires", func() bool {
		for _, n := range names {
			if _, ok := gone[n]; ok {
				continue
			}
			l := fltMustReadLock(t, rc, n)
			if !l.exists {
				gone[n] = time.Since(t0)
				continue
			}
			if p, ok := prev[n]; ok && l.pttl > p {
				extended++
				t.Errorf("%s was extended after the drop: PTTL %v, then %v", n, p, l.pttl)
			}
			prev[n] = l.pttl
		}
		return len(gone) == len(names)
	})
	var last time.Duration
	for _, n := range names {
		last = max(last, gone[n])
	}

	// Another agent takes the names, while A's link is still black-holed.
	next := b.client(t, "a2-next")
	nextEv := recordEvents(next)
	var taken []lease
	for i, n := range names {
		l := mustAcquire(t, next, n, ttlArg(5*time.Second))
		assert.Greater(t, l.Token, held[i].Token, "%s: the next holder's token", n)
		taken = append(taken, l)
	}
	connsFault := a.proxy.Conns() - conns0

	// The link comes back: what A sent into the black hole arrives now, and
	// must neither resurrect a lease nor touch the new holder's.
	a.proxy.Pass()
	healed := time.Now()
	for time.Since(healed) < 1500*time.Millisecond {
		for i, n := range names {
			l := fltMustReadLock(t, rc, n)
			if !l.exists || l.owner != taken[i].Lease {
				t.Fatalf("%s after the link came back: %+v; want the next holder's lease %s", n, l, taken[i].Lease)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := range names {
		var cr checkResult
		call(t, next, "check", map[string]any{"lease": taken[i].Lease}, &cr)
		assert.True(t, cr.Held, "the next holder's lease of %s", names[i])
	}
	assert.Zero(t, nextEv.count("lost", ""), "the next holder lost a lease: %s", nextEv.summary())
	assert.Zero(t, fltLeaseCount(t, observer), "agent A holds leases again after the link came back")

	// Bounded attempts: at most the one renewal per lease that may have
	// been in flight when the black hole began (one batch), a bounded
	// number of releases, and few connections.
	renews, releases := 0, 0
	for _, l := range held {
		r, _, rel := mon.calls(l.Lease, t0)
		assert.LessOrEqual(t, r, 1, "renewals of %s that reached redis after the black hole began", l.Name)
		renews += r
		releases += rel
	}
	assert.LessOrEqual(t, releases, 3*len(held), "releases of the dropped leases")
	connsAll := a.proxy.Conns() - conns0
	assert.LessOrEqual(t, connsAll, 10, "connections agent A opened to redis from the black hole on")
	t.Logf("A2: %d locks, app dropped %s into a black hole of %s; agent forgot them within %s; keys expired <= %s after the black hole began (ttl %s), %d extensions; after the heal: %d renewals and %d releases of the dropped leases reached redis, nothing resurrected; connections through A's proxy: %d during the fault, %d in all; violations %d",
		len(names), msString(dropped.Sub(t0)), msString(healed.Sub(t0)), msString(forgotten), msString(last), msString(ttl), extended, renews, releases, connsFault, connsAll, extended)
}

// TestB1_BlackholeLongerThanTTL: agent A's link to Redis is black-holed
// for longer than the TTL while its application holds a lock. The holder
// is told `lost` (backend_unavailable) at its local deadline, before agent
// B's waiter is granted the name; B's token is higher, and a fenced
// resource refuses the old holder's writes once B has written.
func TestB1_BlackholeLongerThanTTL(t *testing.T) {
	t.Parallel()
	const ttl = 1500 * time.Millisecond
	const name = "b1/x"
	f := startFleet(t, 2, redistest.Options{}, "")
	a, b := f.agents[0], f.agents[1]
	rc := f.redis.Client(t)

	holder := a.client(t, "b1-holder")
	hEv := recordEvents(holder)
	old := mustAcquire(t, holder, name, ttlArg(ttl))
	var reg lockcheck.Register
	require.True(t, reg.Write(old.Token), "the holder's first write")

	waiter := b.client(t, "b1-waiter")
	got := make(chan grab, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		var l lease
		err := waiter.Call(ctx, "acquire", map[string]any{"name": name, "wait_ms": 10000, "ttl_ms": ttl.Milliseconds()}, &l)
		got <- grab{l, time.Now(), err}
	}()
	b.waitQueued(t, 1)

	// Black-hole A's link right after a renewal landed: the local deadline
	// is then about TTL − margin away.
	fltWaitRenewal(t, rc, name, ttl)
	a.proxy.Blackhole()
	t0 := time.Now()
	// How long the key has left in Redis, on Redis's clock, as the black
	// hole begins: nothing renews it after.
	serverT0, err := rc.Time(t.Context()).Result()
	require.NoError(t, err)
	expires, err := rc.PExpireTime(t.Context(), lockKey(name)).Result()
	require.NoError(t, err)
	keyLeft := time.Duration(expires.Milliseconds()-serverT0.UnixMilli()) * time.Millisecond
	lost := hEv.waitLost(t, old.Lease, ttl+2*time.Second)
	var g grab
	select {
	case g = <-got:
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("the waiter on agent B was not answered")
	}
	require.NoError(t, g.err, "the waiter on agent B")
	require.True(t, g.l.Acquired, "the waiter on agent B: %s", g.l.Reason)
	lostAfter, grantAfter := lost.at.Sub(t0), g.at.Sub(t0)
	deadline := ttl - leaseMargin(ttl)

	violations := 0
	if !lost.at.Before(g.at) {
		violations++
		t.Errorf("agent B granted the name %v after the black hole began, before the holder was told lost (%v)", grantAfter, lostAfter)
	}
	assert.Equal(t, "backend_unavailable", lost.Reason, "the holder's lost reason; events %s", hEv.summary())
	// The holder hears of the loss before Redis lets the key go, with the
	// margin's share for clock drift left (the rest is the budget for
	// telling it, which the event used).
	t.Logf("B1: the key had %v left in Redis as the black hole began; the holder heard of the loss %v before it expired", keyLeft, keyLeft-lostAfter)
	assert.GreaterOrEqual(t, keyLeft-lostAfter, ttl/100, "the holder was told too late: the margin is gone")
	assert.LessOrEqual(t, lostAfter, deadline+150*time.Millisecond, "lost at the local deadline (<= %v after the last renewal)", deadline)
	assert.GreaterOrEqual(t, lostAfter, deadline-renewMax(ttl)-50*time.Millisecond, "lost long before the local deadline")
	assert.Greater(t, g.l.Token, old.Token, "the new holder's token")

	// The fenced resource: B writes, then the old holder's write is refused.
	assert.True(t, reg.Write(g.l.Token), "the new holder's write")
	assert.False(t, reg.Write(old.Token), "the old holder's write after the new holder's")
	acc, rej := reg.Counts()

	// The link comes back: A's late commands leave B's lease alone.
	a.proxy.Pass()
	healed := time.Now()
	for time.Since(healed) < 500*time.Millisecond {
		l := fltMustReadLock(t, rc, name)
		require.True(t, l.exists && l.owner == g.l.Lease, "after the heal, redis holds %+v; want B's lease %s", l, g.l.Lease)
		time.Sleep(20 * time.Millisecond)
	}
	degradedFirst := false
	for _, ev := range hEv.all() {
		if ev.Event.Event == "backend" && ev.State == "degraded" && ev.at.Before(lost.at) {
			degradedFirst = true
		}
	}
	assert.True(t, degradedFirst, "the link was black-holed %v before the loss, and the holder had no `backend degraded` event before it: %s", lostAfter, hEv.summary())
	t.Logf("B1: ttl %s, black hole %s; holder lost (%s) %s after it began (local deadline <= %s); B granted %s after it, %s after the loss; tokens %d -> %d; register accepted %d, rejected %d; degraded event before lost: %v; holder's events %s; safety violations %d",
		msString(ttl), msString(healed.Sub(t0)), lost.Reason, msString(lostAfter), msString(deadline), msString(grantAfter), msString(g.at.Sub(lost.at)),
		old.Token, g.l.Token, acc, rej, degradedFirst, hEv.summary(), violations)
}

// TestB2_ConnectionResets: every connection between agent A and Redis is
// reset every 200 ms for 5 s while its application holds a lease of TTL
// 3 s. No lease is lost, and the agent ends up with no more file
// descriptors or goroutines than before (or than a control agent running
// the same workload without faults).
func TestB2_ConnectionResets(t *testing.T) {
	t.Parallel()
	const (
		ttl    = 3 * time.Second
		every  = 200 * time.Millisecond
		during = 5 * time.Second
	)
	f := startFleet(t, 2, redistest.Options{}, "")
	a, control := f.agents[0], f.agents[1]
	rc := f.redis.Client(t)

	app := a.client(t, "b2-app")
	ev := recordEvents(app)
	l := mustAcquire(t, app, "b2/x", ttlArg(ttl))
	capp := control.client(t, "b2-control")
	mustAcquire(t, capp, "b2/control", ttlArg(ttl))
	fltWaitRenewal(t, rc, "b2/x", ttl)
	pid := a.proc.cmd.Process.Pid
	fdBefore := fltFDs(t, pid)
	conns0 := a.proxy.Conns()

	resets := 0
	start := time.Now()
	tick := time.NewTicker(every)
	for time.Since(start) < during {
		<-tick.C
		a.proxy.ResetAll()
		resets++
	}
	tick.Stop()
	resetFor := time.Since(start)
	conns := a.proxy.Conns() - conns0

	// The lease is alive and renewed, in the agent and in Redis.
	fltWaitRenewal(t, rc, "b2/x", ttl)
	var cr checkResult
	call(t, app, "check", map[string]any{"lease": l.Lease}, &cr)
	assert.True(t, cr.Held, "the lease after the resets")
	rl := fltMustReadLock(t, rc, "b2/x")
	assert.Equal(t, l.Lease, rl.owner, "redis's holder after the resets")
	lost := ev.count("lost", "")
	assert.Zero(t, lost, "lost events: %s", ev.summary())

	var fdAfter int
	eventually(t, 5*time.Second, "agent A's file descriptors back to their level", func() bool {
		fdAfter = fltFDs(t, pid)
		return fdAfter <= fdBefore+2
	})
	gA := fltGoroutines(t, a.proc)
	gC := fltGoroutines(t, control.proc)
	assert.LessOrEqual(t, gA, gC+3, "goroutines of the agent whose connections were reset, against the control agent")
	violations := lost
	if gA > gC+3 {
		violations++
	}
	t.Logf("B2: ttl %s; %d resets every %s over %s, %d connections through the proxy; lost events %d, degraded/ok events %d/%d; fds %d before, %d after; goroutines %d (control agent %d); violations %d",
		msString(ttl), resets, msString(every), msString(resetFor), conns, lost, ev.count("backend", "degraded"), ev.count("backend", "ok"), fdBefore, fdAfter, gA, gC, violations)
}

// TestB3_SlowRedis: Redis answers agent A slowly, a round trip taking
// about 0.6 × TTL, while agent B has a fast link; applications on both
// compete for one name. Every grant A hands out is within its local
// deadline and held in Redis when it arrives; no two holders at once
// (porcupine on the history, and the holds compared directly). Then, with a
// round trip longer than the TTL, every grant comes too late and A hands
// none out.
func TestB3_SlowRedis(t *testing.T) {
	t.Parallel()
	const (
		ttl   = time.Second
		delay = 300 * time.Millisecond // per direction: a round trip of 0.6 × TTL
		name  = "b3/x"
		phase = 8 * time.Second
	)
	f := startFleet(t, 2, redistest.Options{}, "")
	slow, fast := f.agents[0], f.agents[1]
	rc := f.redis.Client(t)
	appF := fast.client(t, "b3-fast")
	evF := recordEvents(appF)
	slow.proxy.Delay(delay)
	h := newFltHistory()
	acquireArgs := map[string]any{"name": name, "wait_ms": 0, "ttl_ms": ttl.Milliseconds()}
	lateLog := "grant arrived after its local deadline"
	late0 := strings.Count(slow.proc.stderr.String(), lateLog)

	var (
		wg                                sync.WaitGroup
		mu                                sync.Mutex // guards the counters
		slowTries, slowGrants, slowErrors int
		checksHeld, checksLost            int
		fastTries, fastGrants, fastErrors int
		slowestGrant                      time.Duration
	)
	count := func(n *int) {
		mu.Lock()
		*n++
		mu.Unlock()
	}
	stop := time.Now().Add(phase)
	// Two applications on the slow agent: each tries, checks what it got
	// and releases it at once.
	for who := 0; who < 2; who++ {
		app := slow.client(t, fmt.Sprintf("b3-slow%d", who))
		ev := recordEvents(app)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				count(&slowTries)
				var l lease
				sent := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := app.Call(ctx, "acquire", acquireArgs, &l)
				cancel()
				got := time.Now()
				h.acquire(who, name, sent, got, err == nil && l.Acquired, l.Token)
				if err != nil {
					// An answer that cannot come within the grant's local
					// deadline is given up: backend_unavailable, never a
					// grant handed out late.
					var perr *client.Error
					if !errors.As(err, &perr) || perr.Code != "backend_unavailable" {
						h.problem("an acquire of the slow agent failed: %v", err)
					}
					count(&slowErrors)
					continue
				}
				if !l.Acquired {
					continue
				}
				count(&slowGrants)
				took := got.Sub(sent)
				mu.Lock()
				slowestGrant = max(slowestGrant, took)
				mu.Unlock()
				// Handed out within its local deadline...
				if took >= ttl-leaseMargin(ttl)+50*time.Millisecond {
					h.problem("the slow agent handed out a grant %v after the request (local deadline %v)", took, ttl-leaseMargin(ttl))
				}
				// ...and held in Redis when it arrives...
				if rl, err := fltReadLock(rc, name); err != nil || !rl.exists || rl.owner != l.Lease || rl.token != l.Token {
					h.problem("a grant of the slow agent (lease %s, token %d) that redis does not hold: %+v %v", l.Lease, l.Token, rl, err)
				}
				// ...and check confirms it, unless the lease was lost meanwhile.
				var cr checkResult
				ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
				cerr := app.Call(ctx, "check", map[string]any{"lease": l.Lease}, &cr)
				cancel()
				var lost bool
				if cerr != nil || !cr.Held {
					_, lost = ev.lostSoon(l.Lease, 500*time.Millisecond)
				}
				switch {
				case cerr == nil && cr.Held:
					count(&checksHeld)
				case lost:
					count(&checksLost)
				default:
					h.problem("check of a fresh grant (lease %s): %+v %v, without a lost event", l.Lease, cr, cerr)
				}
				h.use(who, app, ev, name, l, got, 0)
			}
		}()
	}
	wg.Add(1)
	go func() { // the fast agent's application
		defer wg.Done()
		const who = 2
		for time.Now().Before(stop) {
			count(&fastTries)
			var l lease
			sent := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := appF.Call(ctx, "acquire", acquireArgs, &l)
			cancel()
			got := time.Now()
			h.acquire(who, name, sent, got, err == nil && l.Acquired, l.Token)
			switch {
			case err != nil:
				count(&fastErrors)
			case l.Acquired:
				count(&fastGrants)
				h.use(who, appF, evF, name, l, got, 100*time.Millisecond)
				// The name mostly free: the slow agent's grants are what
				// the scenario is about.
				time.Sleep(400 * time.Millisecond)
				continue
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	wg.Wait()
	late1 := strings.Count(slow.proc.stderr.String(), lateLog) - late0
	assert.Zero(t, fastErrors, "the fast agent's acquires that failed")
	assert.GreaterOrEqual(t, slowGrants, 2, "the slow agent got the lock %d times: the scenario barely ran", slowGrants)

	// A round trip longer than the TTL: every grant arrives too late.
	eventually(t, 3*time.Second, "the name is free", func() bool { return !fltMustReadLock(t, rc, name).exists })
	slow.proxy.Delay(ttl / 2)
	sent := time.Now()
	// The agent waits for the answer until the grant's local deadline at
	// most: it answers backend_unavailable, or, if the answer slipped in
	// just before, drops it as too late. It never hands the grant out.
	var l lease
	lateApp := slow.client(t, "b3-late")
	err := lateApp.Call(t.Context(), "acquire", map[string]any{"name": name, "ttl_ms": ttl.Milliseconds()}, &l)
	var perr *client.Error
	if err != nil {
		require.ErrorAs(t, err, &perr)
		assert.Equal(t, "backend_unavailable", perr.Code)
	}
	assert.False(t, l.Acquired, "a grant answered %v after its request (TTL %v) was handed out", time.Since(sent), ttl)
	late2 := strings.Count(slow.proc.stderr.String(), lateLog) - late0 - late1
	assert.True(t, err != nil || late2 >= 1, "neither refused nor dropped as too late")
	slow.proxy.Pass()
	// The late grant was released: the fast agent gets the name at once.
	freedAt := time.Now()
	fl := acquireSoon(t, appF, name, ttl+leaseMargin(ttl))
	freed := time.Since(freedAt)
	h.acquire(2, name, freedAt, time.Now(), true, fl.Token)

	ops, holds, violations := h.check(t)
	t.Logf("B3: ttl %s, delay %s each way; slow agent (2 apps): %d tries, %d grants (slowest answered in %s), %d checks held, %d lost before their check, %d grants dropped as too late; fast agent: %d tries, %d grants; then a round trip of %s: %d grant(s) dropped as too late, none handed out, name free again after %s; %d operations, %d holds, violations %d",
		msString(ttl), msString(delay), slowTries, slowGrants, msString(slowestGrant), checksHeld, checksLost, late1, fastTries, fastGrants,
		msString(ttl), late2, msString(freed), ops, holds, violations)
}

// TestB4_AcquireAnswerLost: an acquire is applied in Redis but its answer
// never reaches the agent, or reaches it too late. The agent never hands
// out a lease Redis does not hold; no acquire of a lease is sent after the
// lease's local deadline (it could only make a phantom); and no phantom
// lock outlives its TTL: another agent gets the name within TTL + margin of
// the last time it was applied.
func TestB4_AcquireAnswerLost(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	f := startFleet(t, 5, redistest.Options{}, "")
	other := f.agents[3]
	rc := f.redis.Client(t)
	mon := fltStartMonitor(t, f.redis.Addr())
	// On failure, show what Redis ran on the subtest's name.
	traceOnFailure := func(t *testing.T, name string, base time.Time) {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("script calls on %s, from the acquire's send:%s", name, mon.trace(name, base))
			}
		})
	}
	// phantomChecks checks the applications of a lease never handed out:
	// with oneWay set, each was sent by the agent no later than the lease's
	// local deadline (its arrival may lag by the link's one-way delay); and
	// the name went to another agent within TTL + margin of the last one.
	// It returns the applications' times since sent.
	phantomChecks := func(t *testing.T, leaseID string, sent, granted time.Time, otherLease string, oneWay time.Duration) []string {
		t.Helper()
		mon.waitSeen(t, otherLease)
		applies := mon.acquireTimes(leaseID)
		require.NotEmpty(t, applies, "no acquire of %s in redis's MONITOR", leaseID)
		var out []string
		for _, at := range applies {
			out = append(out, "+"+msString(at.Sub(sent)))
			if oneWay >= 0 {
				assert.LessOrEqual(t, at.Sub(sent), ttl-leaseMargin(ttl)+oneWay+100*time.Millisecond,
					"an acquire of lease %s reached redis %v after the try was sent: it was sent after the lease's local deadline (%v), when its grant could only be a phantom",
					leaseID, at.Sub(sent), ttl-leaseMargin(ttl))
			}
		}
		last := applies[len(applies)-1]
		assert.LessOrEqual(t, granted.Sub(last), ttl+200*time.Millisecond,
			"a grant never handed out kept the name from another agent for more than TTL + margin after it was last applied")
		return out
	}

	// The request goes through (slowly) and is applied; the link is then
	// black-holed with the answer still on its way back.
	t.Run("answer_blackholed", func(t *testing.T) {
		t.Parallel()
		const (
			name   = "b4/blackholed"
			oneWay = 400 * time.Millisecond
		)
		a := f.agents[0]
		a.proxy.Delay(oneWay)
		app := a.client(t, "b4-1")
		traceOnFailure(t, name, time.Now())
		done := fltTryAsync(app, name, ttl)
		var phantom fltRedisLock
		eventually(t, 3*time.Second, "the acquire is applied in redis", func() bool {
			phantom = fltMustReadLock(t, rc, name)
			return phantom.exists
		})
		applied := time.Now()
		a.proxy.Blackhole()

		// Nobody was told of that grant; it must not outlive its TTL.
		oapp := other.client(t, "b4-1-other")
		oEv := recordEvents(oapp)
		g := fltAcquireWait(t, oapp, name, 3*ttl)
		granted := time.Now()
		took := granted.Sub(applied)
		assert.GreaterOrEqual(t, took, ttl-50*time.Millisecond, "the name was free before the phantom grant expired: was it applied?")
		assert.Greater(t, g.Token, phantom.token)

		// The answer arrives after all, far too late: it is not handed out.
		a.proxy.Pass()
		r := <-done
		if r.err == nil {
			assert.False(t, r.l.Acquired, "an acquire answered %v after its request was handed out", r.at.Sub(r.sent))
		}
		fltHoldsFor(t, rc, name, g.Lease, 300*time.Millisecond)
		assert.Zero(t, oEv.count("lost", ""), "the other agent's holder: %s", oEv.summary())
		applies := phantomChecks(t, phantom.owner, r.sent, granted, g.Lease, oneWay)
		t.Logf("B4/answer_blackholed: acquire applied at %v after it was sent (one-way delay %s), answer black-holed; other agent granted %s after the apply (ttl %s), token %d > %d; the late answer gave the app acquired=%v reason=%q err=%q after %s; violations %d",
			applies, msString(oneWay), msString(took), msString(ttl), g.Token, phantom.token, r.l.Acquired, r.l.Reason, fltCode(r.err), msString(r.at.Sub(r.sent)), fltViolations(t))
	})

	// The link is black-holed first; the application sends a try, gives up
	// on it after a short timeout and drops. The request is applied only
	// when the link comes back, for nobody.
	t.Run("request_blackholed_app_gone", func(t *testing.T) {
		t.Parallel()
		const name = "b4/abandoned"
		a := f.agents[1]
		app := a.client(t, "b4-2")
		a.proxy.Blackhole()
		sent := time.Now()
		traceOnFailure(t, name, sent)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		var l lease
		err := app.Call(ctx, "acquire", map[string]any{"name": name, "wait_ms": 0, "ttl_ms": ttl.Milliseconds()}, &l)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "the try answered through a black hole: %+v", l)
		require.NoError(t, app.Close())
		time.Sleep(1200 * time.Millisecond) // the black hole lasts
		a.proxy.Pass()
		healed := time.Now()

		// The held request lands now; whatever lock it makes must be gone
		// within TTL + margin, and never be anyone's.
		var phantom fltRedisLock
		for time.Since(healed) < 300*time.Millisecond && !phantom.exists {
			phantom = fltMustReadLock(t, rc, name)
			time.Sleep(2 * time.Millisecond)
		}
		oapp := other.client(t, "b4-2-other")
		g := fltAcquireWait(t, oapp, name, 3*ttl)
		granted := time.Now()
		took := granted.Sub(healed)
		assert.LessOrEqual(t, took, ttl+200*time.Millisecond, "a lock applied after the heal kept the name from another agent")
		if phantom.exists {
			assert.Greater(t, g.Token, phantom.token)
		}
		// Whatever the black hole held was applied after the heal: delayed
		// by the network, not sent late, so the send is not bounded.
		mon.waitSeen(t, g.Lease)
		var applies []string
		for _, id := range mon.acquireLeases(name) {
			if id != g.Lease {
				applies = append(applies, phantomChecks(t, id, sent, granted, g.Lease, -1)...)
			}
		}
		fltHoldsFor(t, rc, name, g.Lease, 300*time.Millisecond)
		obs := a.client(t, "b4-2-observer")
		assert.Zero(t, fltLeaseCount(t, obs), "agent A holds a lease for an application that is gone")
		t.Logf("B4/request_blackholed_app_gone: try sent into a black hole, app gave up after 300ms and dropped, link back after %s; phantom seen in redis: %v, the abandoned acquire applied at %v after the send; other agent granted %s after the heal (ttl %s); violations %d",
			msString(healed.Sub(sent)), phantom.exists, applies, msString(took), msString(ttl), fltViolations(t))
	})

	// The request is applied; every connection is reset with the answer
	// still in flight, and go-redis retries with the same lease id. Another
	// agent waits for the name from the reset on. The agent may hand the
	// grant out only if it is the lease Redis holds and within its local
	// deadline; the other agent gets the name within TTL + margin of the
	// first application; no retry is sent past the local deadline.
	t.Run("reset_after_apply", func(t *testing.T) {
		t.Parallel()
		const (
			name   = "b4/reset"
			oneWay = 250 * time.Millisecond
		)
		a := f.agents[2]
		a.proxy.Delay(oneWay)
		app := a.client(t, "b4-3")
		oapp := other.client(t, "b4-3-other")
		traceOnFailure(t, name, time.Now())
		done := fltTryAsync(app, name, ttl)
		var phantom fltRedisLock
		eventually(t, 3*time.Second, "the acquire is applied in redis", func() bool {
			phantom = fltMustReadLock(t, rc, name)
			return phantom.exists
		})
		applied := time.Now()
		a.proxy.ResetAll()
		og := fltAcquireAsync(oapp, name, 5*time.Second)
		r := <-done
		outcome, handedOut := fltB4Outcome(t, rc, name, phantom, r, ttl)
		a.proxy.Pass()
		if handedOut {
			var rr struct {
				Released bool `json:"released"`
			}
			call(t, app, "release", map[string]any{"lease": r.l.Lease}, &rr)
		}
		g := <-og
		require.NoError(t, g.err, "the other agent's acquire")
		require.True(t, g.l.Acquired, "the other agent's acquire: %s", g.l.Reason)
		assert.Greater(t, g.l.Token, phantom.token)
		if !handedOut {
			assert.LessOrEqual(t, g.at.Sub(applied), ttl+200*time.Millisecond, "a grant never handed out kept the name from another agent")
		}
		mon.waitSeen(t, g.l.Lease)
		var applies []string
		for _, at := range mon.acquireTimes(phantom.owner) {
			applies = append(applies, "+"+msString(at.Sub(r.sent)))
			assert.LessOrEqual(t, at.Sub(r.sent), ttl-leaseMargin(ttl)+oneWay+100*time.Millisecond,
				"an acquire of lease %s reached redis %v after the try was sent: it was sent after the lease's local deadline (%v), when its grant could only be a phantom",
				phantom.owner, at.Sub(r.sent), ttl-leaseMargin(ttl))
		}
		fltHoldsFor(t, rc, name, g.l.Lease, 300*time.Millisecond)
		t.Logf("B4/reset_after_apply: acquire applied %s after it was sent (one-way delay %s), then every connection reset; the app got %s after %s; acquires of that lease reached redis at %v after the send; another agent waiting from the reset on was granted %s after the first apply (ttl %s); violations %d",
			msString(applied.Sub(r.sent)), msString(oneWay), outcome, msString(r.at.Sub(r.sent)), applies, msString(g.at.Sub(applied)), msString(ttl), fltViolations(t))
	})

	// As reset_after_apply, with nobody else after the name: once the
	// applied grant has expired in Redis, no retry of the same acquire
	// may grant it again (a lock held by a lease nobody has).
	t.Run("reset_after_apply_uncontended", func(t *testing.T) {
		t.Parallel()
		const (
			name   = "b4/reset-alone"
			oneWay = 250 * time.Millisecond
		)
		a := f.agents[4]
		a.proxy.Delay(oneWay)
		app := a.client(t, "b4-4")
		sent := time.Now()
		traceOnFailure(t, name, sent)
		done := fltTryAsync(app, name, ttl)
		var phantom fltRedisLock
		eventually(t, 3*time.Second, "the acquire is applied in redis", func() bool {
			phantom = fltMustReadLock(t, rc, name)
			return phantom.exists
		})
		a.proxy.ResetAll()
		// Watch Redis until the application has its answer, and a little
		// longer for what the agent does after it.
		var r fltTry
		answered := false
		var expired, regranted time.Duration = -1, -1
		for !answered || time.Since(r.at) < 500*time.Millisecond {
			if !answered {
				select {
				case r = <-done:
					answered = true
				default:
				}
			}
			l := fltMustReadLock(t, rc, name)
			switch {
			case !l.exists || l.owner != phantom.owner:
				if expired < 0 {
					expired = time.Since(sent)
				}
			case expired >= 0 && regranted < 0:
				regranted = time.Since(sent)
			}
			time.Sleep(5 * time.Millisecond)
		}
		outcome, handedOut := fltB4Outcome(t, rc, name, phantom, r, ttl)
		if !handedOut && regranted >= 0 {
			t.Errorf("the grant of lease %s expired in redis (seen %v after the try was sent) and a retry of the same acquire granted it again (seen %v after): a lock nobody holds, which no other agent can take",
				phantom.owner, expired, regranted)
		}
		a.proxy.Pass()
		if handedOut {
			var rr struct {
				Released bool `json:"released"`
			}
			call(t, app, "release", map[string]any{"lease": r.l.Lease}, &rr)
		}
		oapp := other.client(t, "b4-4-other")
		g := fltAcquireWait(t, oapp, name, 3*ttl)
		assert.Greater(t, g.Token, phantom.token)
		fltHoldsFor(t, rc, name, g.Lease, 300*time.Millisecond)
		mon.waitSeen(t, g.Lease)
		var applies []string
		for _, at := range mon.acquireTimes(phantom.owner) {
			applies = append(applies, "+"+msString(at.Sub(r.sent)))
		}
		t.Logf("B4/reset_after_apply_uncontended: acquire applied, connections reset; the app got %s after %s; acquires of that lease reached redis at %v after the send; its lock expired at %s and was granted again at %s (-1: never); violations %d",
			outcome, msString(r.at.Sub(r.sent)), applies, msString(expired), msString(regranted), fltViolations(t))
	})
}

// fltTry is how an asynchronous try ended.
type fltTry struct {
	l        lease
	err      error
	sent, at time.Time
}

// fltTryAsync sends a try on c and returns the channel of its outcome.
func fltTryAsync(c *client.Client, name string, ttl time.Duration) <-chan fltTry {
	done := make(chan fltTry, 1)
	sent := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var l lease
		err := c.Call(ctx, "acquire", map[string]any{"name": name, "wait_ms": 0, "ttl_ms": ttl.Milliseconds()}, &l)
		done <- fltTry{l, err, sent, time.Now()}
	}()
	return done
}

// fltB4Outcome checks an application's try whose first answer was lost:
// if it was handed out, it is the lease applied, held in Redis, and within
// its local deadline. It returns a description and whether it was handed
// out.
func fltB4Outcome(t *testing.T, rc *goredis.Client, name string, applied fltRedisLock, r fltTry, ttl time.Duration) (string, bool) {
	t.Helper()
	switch {
	case r.err != nil:
		return "error " + fltCode(r.err), false
	case !r.l.Acquired:
		return "denied " + r.l.Reason, false
	}
	rl := fltMustReadLock(t, rc, name)
	assert.Equal(t, applied.owner, r.l.Lease, "the grant handed out is not the lease applied")
	assert.True(t, rl.exists && rl.owner == r.l.Lease && rl.token == r.l.Token, "the grant handed out (token %d) is not what redis holds: %+v", r.l.Token, rl)
	assert.Less(t, r.at.Sub(r.sent), ttl-leaseMargin(ttl)+50*time.Millisecond, "a grant handed out past its local deadline")
	return "acquired", true
}

// fltAcquireAsync acquires name on c, waiting up to wait, and returns the
// channel of its outcome.
func fltAcquireAsync(c *client.Client, name string, wait time.Duration) <-chan fltTry {
	done := make(chan fltTry, 1)
	sent := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait+callTimeout)
		defer cancel()
		var l lease
		err := c.Call(ctx, "acquire", map[string]any{"name": name, "wait_ms": wait.Milliseconds(), "ttl_ms": (5 * time.Second).Milliseconds()}, &l)
		done <- fltTry{l, err, sent, time.Now()}
	}()
	return done
}

// fltAcquireWait acquires name waiting up to wait; it must be granted.
func fltAcquireWait(t *testing.T, c *client.Client, name string, wait time.Duration) lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait+callTimeout)
	defer cancel()
	var l lease
	require.NoError(t, c.Call(ctx, "acquire", map[string]any{"name": name, "wait_ms": wait.Milliseconds(), "ttl_ms": (5 * time.Second).Milliseconds()}, &l))
	require.True(t, l.Acquired, "acquire %s within %v: %s", name, wait, l.Reason)
	return l
}

// fltHoldsFor requires that Redis keeps leaseID as the holder of name for
// the whole of d.
func fltHoldsFor(t *testing.T, rc *goredis.Client, name, leaseID string, d time.Duration) {
	t.Helper()
	for start := time.Now(); time.Since(start) < d; time.Sleep(20 * time.Millisecond) {
		l := fltMustReadLock(t, rc, name)
		require.True(t, l.exists && l.owner == leaseID, "redis holds %+v for %s; want lease %s", l, name, leaseID)
	}
}

// fltViolations is 1 if the test has failed so far, for summary lines.
func fltViolations(t *testing.T) int {
	if t.Failed() {
		return 1
	}
	return 0
}

// TestB5_RedisPaused: redis-server is SIGSTOPped for 2 × TTL while two
// agents' applications each hold a lock. Each is told `lost` no later than
// its local deadline (before the pause + TTL); after SIGCONT, nothing
// renews an old lease back to life, and the applications reacquire with
// higher tokens.
func TestB5_RedisPaused(t *testing.T) {
	t.Parallel()
	const ttl = 1500 * time.Millisecond
	f := startFleet(t, 2, redistest.Options{}, "")
	rc := f.redis.Client(t)
	mon := fltStartMonitor(t, f.redis.Addr())
	type holder struct {
		name string
		app  *client.Client
		ev   *eventLog
		l    lease
	}
	var hs []*holder
	for i, a := range f.agents {
		h := &holder{name: fmt.Sprintf("b5/%d", i), app: a.client(t, fmt.Sprintf("b5-app%d", i))}
		h.ev = recordEvents(h.app)
		h.l = mustAcquire(t, h.app, h.name, ttlArg(ttl))
		hs = append(hs, h)
	}
	fltWaitRenewal(t, rc, hs[0].name, ttl)

	f.redis.Pause()
	paused := time.Now()
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			f.redis.Resume()
		}
	})
	var report []string
	violations := 0
	for _, h := range hs {
		lost := h.ev.waitLost(t, h.l.Lease, 2*ttl)
		after := lost.at.Sub(paused)
		if after > ttl {
			violations++
			t.Errorf("%s: lost %v after the pause, later than its local deadline (< pause + %v)", h.name, after, ttl)
		}
		assert.GreaterOrEqual(t, after, ttl-leaseMargin(ttl)-renewMax(ttl)-100*time.Millisecond, "%s lost long before its local deadline", h.name)
		report = append(report, fmt.Sprintf("%s lost (%s) %s after the pause", h.name, lost.Reason, msString(after)))
	}
	time.Sleep(time.Until(paused.Add(2 * ttl))) // the pause lasts 2 × TTL
	f.redis.Resume()
	resumed = true
	back := time.Now()

	// What the agents sent during the pause runs now; the old leases stay
	// dead, in Redis and in the agents.
	for _, h := range hs {
		eventually(t, 2*time.Second, h.name+": the old lease is gone from redis", func() bool {
			l := fltMustReadLock(t, rc, h.name)
			return !l.exists || l.owner != h.l.Lease
		})
	}
	for time.Since(back) < 500*time.Millisecond {
		for _, h := range hs {
			l := fltMustReadLock(t, rc, h.name)
			if l.exists && l.owner == h.l.Lease {
				violations++
				t.Fatalf("%s: the old lease %s is back in redis: %+v", h.name, h.l.Lease, l)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Count what ran after SIGCONT: commands the agents sent during the
	// pause, applied late (Redis ran nothing while stopped, so whatever it
	// timestamped from the pause on ran after it).
	lateRenews, lateReleases := 0, 0
	for _, h := range hs {
		r, _, rel := mon.calls(h.l.Lease, paused)
		lateRenews += r
		lateReleases += rel
	}
	var tokens []string
	for _, h := range hs {
		var cr checkResult
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := h.app.Call(ctx, "check", map[string]any{"lease": h.l.Lease}, &cr)
		cancel()
		assert.Equal(t, "not_held", fltCode(err), "%s: check of the lost lease: %+v", h.name, cr)
		nl := acquireSoon(t, h.app, h.name, 2*time.Second)
		assert.Greater(t, nl.Token, h.l.Token, "%s: the token after the reacquire", h.name)
		tokens = append(tokens, fmt.Sprintf("%d->%d", h.l.Token, nl.Token))
	}
	t.Logf("B5: ttl %s, redis paused %s; %s; after SIGCONT %d renewals and %d releases sent during the pause ran, and no lease came back; reacquired with tokens %s; violations %d",
		msString(ttl), msString(back.Sub(paused)), strings.Join(report, ", "), lateRenews, lateReleases, strings.Join(tokens, " "), violations)
}

// TestB11_OperatorDeletesKeys: an operator deletes lock keys with DEL. The
// holder is told `lost` within one renew interval: `expired` when nobody
// took the name meanwhile, `taken_over` when another agent's application
// did; the new holder is left alone.
func TestB11_OperatorDeletesKeys(t *testing.T) {
	t.Parallel()
	const ttl = 1500 * time.Millisecond
	bound := renewMax(ttl) + 100*time.Millisecond
	f := startFleet(t, 2, redistest.Options{}, "")
	a, b := f.agents[0], f.agents[1]
	rc := f.redis.Client(t)
	app := a.client(t, "b11-holder")
	ev := recordEvents(app)
	violations := 0

	// Deleted, and nobody takes them: expired.
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var expired []lease
	for _, n := range []string{"b11/e0", "b11/e1"} {
		expired = append(expired, mustAcquire(t, app, n, ttlArg(ttl)))
	}
	del := time.Now()
	require.NoError(t, rc.Del(ctx, lockKey("b11/e0"), lockKey("b11/e1")).Err())
	var report []string
	for _, l := range expired {
		lost := ev.waitLost(t, l.Lease, bound+time.Second)
		after := lost.at.Sub(del)
		assert.Equal(t, "expired", lost.Reason, "%s", l.Name)
		if after > bound {
			violations++
			t.Errorf("%s: lost %v after the DEL, more than one renew interval (%v)", l.Name, after, bound)
		}
		report = append(report, fmt.Sprintf("%s %s after %s", l.Name, lost.Reason, msString(after)))
	}

	// Deleted right after a renewal, and another agent's application takes
	// the name before the next one: taken_over.
	const name = "b11/t"
	old := mustAcquire(t, app, name, ttlArg(ttl))
	other := b.client(t, "b11-other")
	oEv := recordEvents(other)
	fltWaitRenewal(t, rc, name, ttl)
	del = time.Now()
	require.NoError(t, rc.Del(ctx, lockKey(name)).Err())
	nl := mustAcquire(t, other, name, ttlArg(ttl))
	takenAt := time.Now()
	lost := ev.waitLost(t, old.Lease, bound+time.Second)
	after := lost.at.Sub(del)
	require.True(t, takenAt.Before(lost.at), "the takeover (%v after the DEL) came after the holder's loss (%v): the scenario did not run", takenAt.Sub(del), after)
	assert.Equal(t, "taken_over", lost.Reason, "%s", name)
	if after > bound {
		violations++
		t.Errorf("%s: lost %v after the DEL, more than one renew interval (%v)", name, after, bound)
	}
	assert.Greater(t, nl.Token, old.Token)
	report = append(report, fmt.Sprintf("%s %s after %s (taken %s after the DEL)", name, lost.Reason, msString(after), msString(takenAt.Sub(del))))
	// The old holder's agent releases what it lost; that must not touch
	// the new holder.
	fltHoldsFor(t, rc, name, nl.Lease, 300*time.Millisecond)
	var cr checkResult
	call(t, other, "check", map[string]any{"lease": nl.Lease}, &cr)
	assert.True(t, cr.Held, "the new holder's lease")
	assert.Zero(t, oEv.count("lost", ""), "the new holder: %s", oEv.summary())
	t.Logf("B11: ttl %s, bound %s (one renew interval + 100ms); 3 keys deleted: %s; new holder's token %d > %d, untouched; violations %d",
		msString(ttl), msString(bound), strings.Join(report, ", "), nl.Token, old.Token, violations)
}
