// Command bench measures lockagent against the Redis lock libraries that
// applications use directly, github.com/bsm/redislock and
// github.com/go-redsync/redsync/v4, in one run on one machine and one
// redis-server, and prints a table with the ratios that
// docs/performance.md sets targets for. Its etcd section measures the
// etcd backend on three etcd members against etcd's own
// concurrency.Mutex, and the renewal load of leases held on etcd. Its
// upgrade section upgrades an agent holding 10,000 sessions (ctl upgrade's
// op) and measures how long it takes and the longest any request waits.
//
// It is a module of its own so that the peers never enter the agent's
// go.mod. From the repository's root:
//
//	cd bench && go run .
//
// It builds the agent, starts its own redis-server and etcd members (they
// must be on PATH) and agent processes in a temporary directory, and
// removes them at the end.
package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	if path := os.Getenv(echoEnv); path != "" {
		if err := runEcho(path); err != nil {
			fatal(err)
		}
		return
	}
	var (
		root     = flag.String("root", "..", "the lockagent repository to build the agent from")
		agentBin = flag.String("agent", "", "a lockagent binary to run instead of building one from -root")
		n1       = flag.Int("n", 20000, "operations of each 1-session workload")
		n64      = flag.Int("n64", 64000, "operations of each 64-session workload")
		rounds   = flag.Int("rounds", 3, "rounds of the latency workloads; the table shows each row's median round")
		held     = flag.String("held", "10000,100000", "numbers of held leases whose renewal load is measured")
		window   = flag.Duration("window", 20*time.Second, "how long the renewal load is measured")
		handover = flag.Int("handover", 50, "rounds of the dead-holder handover")
		sessions = flag.Int("sessions", 10000, "sessions, one lease each, whose agent memory is measured")
		settle   = flag.Duration("settle", 2*time.Minute, "how long the sessions hold their leases before the agent's memory is measured for the target (also at 30s when longer)")
		etcdHeld = flag.String("etcd-held", "100000", "numbers of held leases whose renewal load is measured on etcd")
		upgrades = flag.Int("upgrades", 5, "upgrades of an agent holding -sessions sessions, on each backend")
		only     = flag.String("only", "", "comma-separated sections to run: pairs, renewals, handover, rss, upgrade, etcd (default all)")
	)
	flag.Parse()
	b := &bench{bin: *agentBin, n1: *n1, n64: *n64, rounds: *rounds, window: *window, handoverRounds: *handover, sessions: *sessions, settle: *settle, upgradeRounds: *upgrades}
	for _, l := range []struct {
		flag string
		dst  *[]int
	}{{*held, &b.held}, {*etcdHeld, &b.etcdHeld}} {
		for s := range strings.SplitSeq(l.flag, ",") {
			if s = strings.TrimSpace(s); s != "" {
				v, err := strconv.Atoi(s)
				if err != nil {
					fatal(fmt.Errorf("-held, -etcd-held: %w", err))
				}
				*l.dst = append(*l.dst, v)
			}
		}
	}
	sections := map[string]bool{"pairs": true, "renewals": true, "handover": true, "rss": true, "upgrade": true, "etcd": true}
	if *only != "" {
		clear(sections)
		for s := range strings.SplitSeq(*only, ",") {
			sections[strings.TrimSpace(s)] = true
		}
	}
	if err := b.run(*root, sections); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

type bench struct {
	n1, n64, rounds int
	held, etcdHeld  []int
	window          time.Duration
	handoverRounds  int
	upgradeRounds   int
	sessions        int
	settle          time.Duration

	bin, dir string
	redis    *redisServer
}

func (b *bench) run(root string, sections map[string]bool) (err error) {
	dir, err := os.MkdirTemp("", "lockagent-bench")
	if err != nil {
		return err
	}
	// A failed run keeps its directory: the agents' and Redis's logs.
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w (logs kept in %s)", err, dir)
		} else {
			os.RemoveAll(dir)
		}
	}()
	b.dir = dir
	if b.bin == "" {
		if b.bin, err = buildAgent(root, dir); err != nil {
			return err
		}
	}
	if b.redis, err = startRedis(dir); err != nil {
		return err
	}
	defer b.redis.stop()
	fmt.Printf("lockagent bench: %s, GOMAXPROCS %d, %s/%s, %s\n\n", cpuModel(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, time.Now().Format(time.DateOnly))

	var t table
	for _, s := range []struct {
		name string
		run  func(*table) error
	}{{"pairs", b.pairs}, {"renewals", b.renewals}, {"handover", b.handover}, {"rss", b.rss}, {"upgrade", b.upgrades}, {"etcd", b.etcd}} {
		if !sections[s.name] {
			continue
		}
		if err := s.run(&t); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		t.print() // each section as soon as it is measured
	}
	t.printTargets()
	return nil
}

func (b *bench) redisBlock() string {
	return fmt.Sprintf("backend \"redis\" {\n  addresses = [%q]\n}\n", b.redis.addr)
}

// workload is one row of the latency table.
type workload struct {
	name    string
	workers int
	perOp   string // what one operation is
	run     func(workers, n int) (result, error)
}

func (b *bench) pairs(t *table) error {
	echo, stopEcho, err := echoServer(b.dir)
	if err != nil {
		return err
	}
	defer stopEcho()
	echoProc, echoPID, stopEchoProc, err := echoProcess(b.dir)
	if err != nil {
		return err
	}
	defer stopEchoProc()
	mem, err := startAgent(b.bin, b.dir, "memory", "")
	if err != nil {
		return err
	}
	defer mem.stop()
	red, err := startAgent(b.bin, b.dir, "redis", b.redisBlock())
	if err != nil {
		return err
	}
	defer red.stop()
	rc := b.redis.client(64)
	defer rc.Close()

	var rows []workload
	for _, w := range []int{1, 64} {
		rows = append(rows,
			workload{"echo (Unix socket)", w, "round trip", func(w, n int) (result, error) { return echoRoundTrips(echo, w, n) }},
			workload{"echo, another process", w, "round trip", func(w, n int) (result, error) { return echoRoundTrips(echoProc, w, n) }},
			workload{"redis PING (go-redis)", w, "round trip", func(w, n int) (result, error) { return pingRoundTrips(rc, w, n) }},
			workload{"lockagent, embedded", w, "pair", func(w, n int) (result, error) { return agentPairs(mem.socket, w, n) }},
			workload{"lockagent, redis", w, "pair", func(w, n int) (result, error) { return agentPairs(red.socket, w, n) }},
			workload{"redislock", w, "pair", func(w, n int) (result, error) { return redislockPairs(rc, w, n) }},
			workload{"redsync", w, "pair", func(w, n int) (result, error) { return redsyncPairs(rc, w, n) }},
		)
	}
	// Every round runs every row, so that a noisy moment of the machine
	// falls on all of them alike; each row keeps its median round.
	got := make([][]result, len(rows))
	for range b.rounds {
		for i, r := range rows {
			n := b.n1
			if r.workers > 1 {
				n = b.n64
			}
			// The CPU the agents (or the echo process) and Redis spend
			// on the row: where the time of a pair goes.
			before, sw := b.cpu(echoPID, mem, red), b.switches(echoPID, mem, red)
			res, err := r.run(r.workers, n)
			if err != nil {
				return fmt.Errorf("%s ×%d: %w", r.name, r.workers, err)
			}
			after := b.cpu(echoPID, mem, red)
			ops := float64(n / r.workers * r.workers)
			res.agentCPU = 1e6 * (after[0] - before[0]) / ops
			res.redisCPU = 1e6 * (after[1] - before[1]) / ops
			res.switches = (b.switches(echoPID, mem, red) - sw) / ops
			got[i] = append(got[i], res)
		}
	}
	find := func(name string, workers int) result {
		for i, r := range rows {
			if r.name == name && r.workers == workers {
				return median(got[i])
			}
		}
		panic("no row " + name)
	}
	for i, r := range rows {
		m := median(got[i])
		t.latency = append(t.latency, []string{r.name, strconv.Itoa(r.workers), r.perOp, us(m.p50), us(m.p99), fmt.Sprintf("%.0f", m.perSec),
			fmt.Sprintf("%.1f", m.agentCPU), fmt.Sprintf("%.1f", m.redisCPU), fmt.Sprintf("%.1f", m.switches)})
	}

	echoProc1, echo64 := find("echo, another process", 1), find("echo (Unix socket)", 64)
	mem1, mem64 := find("lockagent, embedded", 1), find("lockagent, embedded", 64)
	red1, red64 := find("lockagent, redis", 1), find("lockagent, redis", 64)
	rl1, rl64 := find("redislock", 1), find("redislock", 64)
	// What a lone client costs a server against a busy one: the same
	// ratio as the agent's CPU target, for every server of the run.
	ping1, ping64 := find("redis PING (go-redis)", 1), find("redis PING (go-redis)", 64)
	for _, r := range []struct {
		server, workload string
		one, many        float64
	}{
		{"echo process (Go)", "echo, another process", echoProc1.agentCPU, find("echo, another process", 64).agentCPU},
		{"redis-server", "redis PING (go-redis)", ping1.redisCPU, ping64.redisCPU},
		{"redis-server", "redislock", rl1.redisCPU, rl64.redisCPU},
		{"agent", "lockagent, embedded", mem1.agentCPU, mem64.agentCPU},
		{"agent", "lockagent, redis", red1.agentCPU, red64.agentCPU},
	} {
		t.cpuRatio = append(t.cpuRatio, []string{r.server, r.workload, fmt.Sprintf("%.1f", r.one), fmt.Sprintf("%.1f", r.many), fmt.Sprintf("%.2f", r.one/r.many)})
	}
	stats, err := b.redis.commandStats(context.Background(), rc)
	if err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(stats)) {
		if st := stats[name]; st[0] >= 1000 {
			t.commands = append(t.commands, []string{name, fmt.Sprintf("%.0f", st[0]), fmt.Sprintf("%.2f", st[1])})
		}
	}
	t.target("redis backend, 1 session: p50 / redislock's p50", ratio(red1.p50, rl1.p50), "≤ 1.0", ratio(red1.p50, rl1.p50) <= 1.0)
	t.target("redis backend, 64 sessions: pairs/s / redislock's", red64.perSec/rl64.perSec, "≥ 1.0", red64.perSec/rl64.perSec >= 1.0)
	t.target("redis backend: agent CPU per pair, 1 session / 64 sessions", red1.agentCPU/red64.agentCPU, "≤ 2", red1.agentCPU <= 2*red64.agentCPU)
	t.target("embedded, 1 session: p50 / 2 round trips to the echo in another process", ratio(mem1.p50, 2*echoProc1.p50), "≤ 1.2", ratio(mem1.p50, 2*echoProc1.p50) <= 1.2)
	t.target("embedded, 64 sessions: pairs/s / echo round trips/s", mem64.perSec/echo64.perSec, "≥ 0.35", mem64.perSec/echo64.perSec >= 0.35)
	return nil
}

func (b *bench) renewals(t *table) error {
	red, err := startAgent(b.bin, b.dir, "renewals", b.redisBlock())
	if err != nil {
		return err
	}
	defer red.stop()
	for _, n := range b.held {
		l, err := measureRenewals(red, b.redis, n, 15*time.Second, b.window)
		if err != nil {
			return fmt.Errorf("%d leases: %w", n, err)
		}
		t.renewal = append(t.renewal, []string{strconv.Itoa(n), fmt.Sprintf("%.2f", l.agentCPU), fmt.Sprintf("%.2f", l.redisCPU), fmt.Sprintf("%.0f", l.redisCmdSec)})
		if n == 100000 {
			t.target("100,000 held leases: agent CPU, % of one core", l.agentCPU, "≤ 5", l.agentCPU <= 5)
			t.target("100,000 held leases: Redis CPU, % of one core", l.redisCPU, "≤ 10", l.redisCPU <= 10)
		}
	}
	return nil
}

func (b *bench) handover(t *table) error {
	a, err := startAgent(b.bin, b.dir, "handover-a", b.redisBlock())
	if err != nil {
		return err
	}
	defer a.stop()
	c, err := startAgent(b.bin, b.dir, "handover-b", b.redisBlock())
	if err != nil {
		return err
	}
	defer c.stop()
	ds, err := agentHandover(a, c, b.handoverRounds)
	if err != nil {
		return err
	}
	rc := b.redis.client(2)
	defer rc.Close()
	const libTTL = time.Second
	lib, err := redislockHandover(rc, libTTL, 3)
	if err != nil {
		return err
	}
	slices.Sort(ds)
	slices.Sort(lib)
	p50 := ds[len(ds)/2]
	t.handover = append(t.handover,
		[]string{"lockagent, redis: holder's connection drops, waiter on another agent", strconv.Itoa(len(ds)), ms(p50), ms(ds[len(ds)*99/100])},
		[]string{fmt.Sprintf("redislock: holder dies, TTL %v, waiter retries every 5 ms", libTTL), strconv.Itoa(len(lib)), ms(lib[len(lib)/2]), ms(lib[len(lib)-1])},
	)
	t.target("dead holder → waiter on another agent: p50, ms", float64(p50.Microseconds())/1000, "≤ 5", p50 <= 5*time.Millisecond)
	return nil
}

func (b *bench) rss(t *table) error {
	offsets := []time.Duration{b.settle}
	if early := 30 * time.Second; b.settle > early {
		offsets = []time.Duration{early, b.settle}
	}
	t.rssHeader = []string{"backend", "sessions", "RSS MiB, all granted"}
	for _, d := range offsets {
		t.rssHeader = append(t.rssHeader, fmt.Sprintf("after %v", d))
	}
	for _, backend := range []struct{ name, block string }{{"embedded", ""}, {"redis", b.redisBlock()}} {
		a, err := startAgent(b.bin, b.dir, "rss-"+backend.name, backend.block)
		if err != nil {
			return err
		}
		rss, err := sessionsRSS(a, b.sessions, offsets)
		a.stop()
		if err != nil {
			return fmt.Errorf("%s: %w", backend.name, err)
		}
		row := []string{backend.name, strconv.Itoa(b.sessions)}
		for _, v := range rss {
			row = append(row, fmt.Sprintf("%.1f", v))
		}
		t.rss = append(t.rss, row)
		if backend.name == "redis" && b.sessions == 10000 {
			settled := rss[len(rss)-1]
			t.target(fmt.Sprintf("10,000 sessions with one lease each (redis backend): agent RSS after %v, MiB", b.settle), settled, "≤ 100", settled <= 100)
		}
	}
	return nil
}

// switches returns the context switches of the echo process, the agents
// and redis-server so far.
func (b *bench) switches(echoPID int, agents ...*agentProc) float64 {
	n := ctxSwitches(echoPID) + ctxSwitches(b.redis.cmd.Process.Pid)
	for _, a := range agents {
		n += ctxSwitches(a.cmd.Process.Pid)
	}
	return n
}

// cpu returns the CPU seconds the agents and the echo process, and
// redis-server, have used.
func (b *bench) cpu(echoPID int, agents ...*agentProc) [2]float64 {
	var out [2]float64
	out[0], _ = cpuSeconds(echoPID)
	for _, a := range agents {
		v, _ := cpuSeconds(a.cmd.Process.Pid)
		out[0] += v
	}
	out[1], _ = cpuSeconds(b.redis.cmd.Process.Pid)
	return out
}

func median(rs []result) result {
	pick := func(get func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = get(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return result{
		p50:      time.Duration(pick(func(r result) float64 { return float64(r.p50) })),
		p99:      time.Duration(pick(func(r result) float64 { return float64(r.p99) })),
		perSec:   pick(func(r result) float64 { return r.perSec }),
		agentCPU: pick(func(r result) float64 { return r.agentCPU }),
		redisCPU: pick(func(r result) float64 { return r.redisCPU }),
		switches: pick(func(r result) float64 { return r.switches }),
	}
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Nanoseconds())/1000) }
func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }

// cpuModel is the machine's CPU, from /proc/cpuinfo.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// table is what the run prints.
type table struct {
	latency, commands, renewal [][]string
	cpuRatio                   [][]string // CPU per operation at 1 session and at 64, per server
	handover, rss, upgrades    [][]string
	etcdPairs, etcdRenewal     [][]string
	rssHeader                  []string
	targets                    [][]string
	printed                    map[string]bool
}

func (t *table) target(what string, got float64, want string, ok bool) {
	t.targets = append(t.targets, []string{what, fmt.Sprintf("%.2f", got), want, map[bool]string{true: "met", false: "MISSED"}[ok]})
}

// print prints the sections measured since the last print.
func (t *table) print() {
	if t.printed == nil {
		t.printed = map[string]bool{}
	}
	section := func(title string, header []string, rows [][]string) {
		if len(rows) == 0 || t.printed[title] {
			return
		}
		t.printed[title] = true
		fmt.Println("## " + title)
		fmt.Println()
		printMarkdown(header, rows)
		fmt.Println()
	}
	section("Acquire+release pairs (and the floors' round trips)", []string{"workload", "sessions", "op", "p50 µs", "p99 µs", "ops/s", "agent's (or echo's) CPU µs/op", "redis CPU µs/op", "servers' switches/op"}, t.latency)
	section("A server's CPU per operation, 1 session against 64", []string{"server", "workload", "1 session µs/op", "64 sessions µs/op", "ratio"}, t.cpuRatio)
	section("Redis server time per command, every pair workload", []string{"command", "calls", "µs per call"}, t.commands)
	section("Renewal load, 15 s TTL, redis backend", []string{"held leases", "agent CPU %", "redis CPU %", "redis commands/s"}, t.renewal)
	section("Dead holder → waiter holding the lock", []string{"case", "rounds", "p50 ms", "p99/max ms"}, t.handover)
	section("Agent memory, one lease per session", t.rssHeader, t.rss)
	section("Upgrades of an agent holding one lease per session, while 8 connections make acquire+release pairs", []string{"backend", "sessions", "upgrades", "upgrade p50 ms", "upgrade max ms", "clients waited p50 ms", "max ms", "longest request ms", "requests"}, t.upgrades)
	section("Acquire+release pairs on a three-member etcd", []string{"workload", "sessions", "op", "p50 µs", "p99 µs", "ops/s", "agent CPU µs/op", "etcd CPU µs/op (3 members)"}, t.etcdPairs)
	section("Renewal load, 15 s TTL, etcd backend (3 members)", []string{"held leases", "agent CPU %", "etcd CPU % (3 members)"}, t.etcdRenewal)
}

func (t *table) printTargets() {
	fmt.Println("## Targets")
	fmt.Println()
	printMarkdown([]string{"target", "measured", "wanted", ""}, t.targets)
}

func printMarkdown(header []string, rows [][]string) {
	width := make([]int, len(header))
	for _, r := range append([][]string{header}, rows...) {
		for i, c := range r {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	line := func(cells []string) {
		var sb strings.Builder
		sb.WriteString("|")
		for i, c := range cells {
			fmt.Fprintf(&sb, " %s%s |", c, strings.Repeat(" ", width[i]-len([]rune(c))))
		}
		fmt.Println(sb.String())
	}
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
}
