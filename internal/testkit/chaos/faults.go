package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"time"
)

// faultKind is a kind of fault of the schedule.
type faultKind int

const (
	blackholeShort  faultKind = iota // an agent's Redis link black-holed < TTL
	blackholeLong                    // ... > TTL (docs/testing.md B1)
	resetLinks                       // an agent's Redis connections reset every 200 ms (B2)
	slowLink                         // an agent's Redis link slowed by 150-450 ms a round trip (B3)
	stopShort                        // an agent SIGSTOPped < TTL (C2)
	stopLong                         // ... > TTL (C1)
	killAgent                        // an agent SIGKILLed and restarted (C3)
	pauseRedisShort                  // redis-server SIGSTOPped < TTL
	pauseRedisLong                   // ... > TTL (B5)
	restartRedis                     // redis-server killed and restarted without persistence (B6)
	killClient                       // a client's connection closed while it holds a lock (A1)
	pauseClient                      // a client paused > TTL inside a read-modify-write under its lock
	starveAgent                      // an agent starved of CPU: stopped and run in turns (C6)
	stopMemberShort                  // an etcd follower SIGSTOPped < TTL
	stopMemberLong                   // ... > TTL
	killLeader                       // the etcd leader SIGKILLed, and restarted
	restartMember                    // an etcd member stopped (SIGTERM) and restarted
	upgradeAgent                     // an agent upgraded: handed over to a new process (C9)
)

// mixKinds are the kinds of D1's schedule, in the order that its seeds
// shuffle: a seed gives the same schedule as long as this list stays.
var mixKinds = []faultKind{blackholeShort, blackholeLong, resetLinks, slowLink, stopShort, stopLong, killAgent,
	pauseRedisShort, pauseRedisLong, restartRedis, killClient, pauseClient}

// upgradeKinds are the kinds of a run of upgrades: mostly upgrades, and
// the faults of clients, whose connections the process that took over
// must end as the old one would.
var upgradeKinds = []faultKind{upgradeAgent, upgradeAgent, upgradeAgent, killClient, pauseClient}

// etcdKinds are the kinds of a run on etcd: D1's, with faults of the
// members in place of Redis's.
var etcdKinds = []faultKind{blackholeShort, blackholeLong, resetLinks, slowLink, stopShort, stopLong, killAgent,
	stopMemberShort, stopMemberLong, killLeader, restartMember, killClient, pauseClient}

func (k faultKind) String() string {
	return [...]string{"blackhole-short", "blackhole-long", "reset-links", "slow-link", "stop-agent-short",
		"stop-agent-long", "kill-agent", "pause-redis-short", "pause-redis-long", "restart-redis", "kill-client",
		"pause-client", "starve-agent", "stop-member-short", "stop-member-long", "kill-leader", "restart-member", "upgrade-agent"}[k]
}

// faultRec is a fault as injected: its target (an agent's index, or -1
// for redis-server or a client) and when it started and ended.
type faultRec struct {
	kind       faultKind
	agent      int
	start, end int64
	stopped    int64 // of an agent stop or starvation: when every thread of the agent was first stopped
	detail     string
}

func (f faultRec) String() string {
	return fmt.Sprintf("%9.3fs–%9.3fs %-17s %s", time.Duration(f.start).Seconds(), time.Duration(f.end).Seconds(), f.kind, f.detail)
}

// injectFaults runs the seeded schedule of faults, one after the other
// with calm in between, until until. It runs on the test's goroutine (the
// redistest calls may fail the test).
func (r *run) injectFaults(until time.Time, workers, candidates []*worker) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0xfa0175))
	var deck []faultKind
	for {
		// Every draw happens whatever the state, so that a seed always
		// gives the same schedule.
		gap := msIn(rng, 500, 2500)
		if len(deck) == 0 {
			deck = slices.Clone(mixKinds)
			if r.c.etcd != nil {
				deck = slices.Clone(etcdKinds)
			}
			if r.cfg.Upgrades {
				deck = append(deck, upgradeAgent)
			}
			if r.cfg.Starvation {
				deck = []faultKind{starveAgent}
			}
			if r.cfg.UpgradesOnly {
				deck = slices.Clone(upgradeKinds)
			}
			rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		kind := deck[0]
		deck = deck[1:]
		target := rng.IntN(len(r.c.agents))
		short, long := msIn(rng, 150, 450), msIn(rng, 2500, 4500)
		pick := rng.Uint64()

		if time.Until(until) < gap+time.Second {
			time.Sleep(max(time.Until(until), 0))
			return
		}
		time.Sleep(gap)
		r.inject(kind, target, short, long, pick, workers, candidates)
		r.revive()
	}
}

func msIn(rng *rand.Rand, lo, hi int) time.Duration {
	return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Millisecond
}

// inject injects one fault and waits for its end.
func (r *run) inject(kind faultKind, target int, short, long time.Duration, pick uint64, workers, candidates []*worker) {
	a := r.c.agents[target]
	f := faultRec{kind: kind, agent: target, start: r.now(), end: -1}
	switch kind {
	case blackholeShort, blackholeLong:
		d := short
		if kind == blackholeLong {
			d = long
		}
		f.detail = fmt.Sprintf("agent %d's links to the store black-holed for %v", target, d)
		a.blackhole()
		time.Sleep(d)
		a.pass()
	case resetLinks:
		d := long / 2
		f.detail = fmt.Sprintf("agent %d's connections to the store reset every 200ms for %v", target, d)
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			a.resetAll()
		}
	case slowLink:
		delay := short / 2
		f.detail = fmt.Sprintf("agent %d's links to the store delayed %v each way for %v", target, delay, long)
		a.delay(delay)
		time.Sleep(long)
		a.pass()
	case stopShort, stopLong:
		d := short
		if kind == stopLong {
			d = long
		}
		f.detail = fmt.Sprintf("agent %d SIGSTOPped for %v", target, d)
		a.pause()
		f.stopped = r.now()
		time.Sleep(d)
		// The end is taken before SIGCONT: whatever the agent does once
		// it runs again comes after it.
		f.end = r.now()
		a.signal(syscall.SIGCONT)
	case starveAgent:
		// A process starved of CPU runs now and then, for moments: here,
		// 1-10 ms at a time, between stops of 20-300 ms, one stop in four
		// of 800-2500 ms (more than a renewal interval, often more than
		// the TTL: leases are lost). The starvation counts as one stop of
		// its whole length.
		rng := rand.New(rand.NewPCG(pick, 0xc6))
		f.detail = fmt.Sprintf("agent %d starved of CPU for %v", target, long)
		stops := 0
		for end := time.Now().Add(long); time.Now().Before(end); stops++ {
			d := msIn(rng, 20, 300)
			if rng.IntN(4) == 0 {
				d = msIn(rng, 800, 2500)
			}
			run := msIn(rng, 1, 10)
			a.pause()
			if f.stopped == 0 {
				f.stopped = r.now()
			}
			time.Sleep(d)
			a.signal(syscall.SIGCONT)
			time.Sleep(run)
		}
		f.end = r.now()
		f.detail += fmt.Sprintf(" (%d stops)", stops)
	case upgradeAgent:
		up, err := a.upgrade()
		// Right after a fault of the store, its calls may hang for
		// seconds: the agent refuses to freeze for longer than 2s, and
		// serves on. That is a refusal, tried again a little later; in
		// a run of upgrades alone it is a failure.
		for try := 0; err != nil && !r.cfg.UpgradesOnly && strings.Contains(err.Error(), "did not end in") && try < 3; try++ {
			r.note("agent %d refused an upgrade (%v); trying again in 1s", target, err)
			time.Sleep(time.Second)
			up, err = a.upgrade()
		}
		f.end = r.now()
		if err != nil {
			r.t.Errorf("chaos: upgrading agent %d: %v", target, err)
			f.detail = fmt.Sprintf("agent %d: upgrade failed: %v", target, err)
			break
		}
		f.detail = fmt.Sprintf("agent %d upgraded: pid %d to %d in %v", target, up.from, up.to, time.Duration(f.end-f.start).Round(time.Millisecond))
	case killAgent:
		down := short * 2
		f.detail = fmt.Sprintf("agent %d SIGKILLed, restarted after %v", target, down)
		a.kill()
		f.end = r.now()
		time.Sleep(down)
		if err := a.start(); err != nil {
			r.t.Errorf("chaos: restarting agent %d: %v", target, err)
		}
		f.detail += fmt.Sprintf(" (down %v)", time.Duration(r.now()-f.start).Round(time.Millisecond))
	case pauseRedisShort, pauseRedisLong:
		d := short
		if kind == pauseRedisLong {
			d = long
		}
		f.agent = -1
		f.detail = fmt.Sprintf("redis-server SIGSTOPped for %v", d)
		r.c.redis.Pause()
		time.Sleep(d)
		r.c.redis.Resume()
	case restartRedis:
		f.agent = -1
		f.detail = "redis-server killed and restarted without persistence"
		r.c.redis.Restart(r.t)
	case stopMemberShort, stopMemberLong:
		// A follower, of the seed's choice. Not the leader: etcd before
		// 3.4.25 and 3.5.8 (Debian 12 has 3.4.23) lets a leader that
		// stalled revoke every lease when it runs again, its own clock
		// having moved on (etcd issue 15247), which frees locks early;
		// docs/etcd.md asks for a release with the fix.
		d := short
		if kind == stopMemberLong {
			d = long
		}
		f.agent = -1
		m := r.c.etcd.Member((r.c.etcd.Leader(r.t) + 1 + int(pick%2)) % 3)
		f.detail = fmt.Sprintf("etcd member %s SIGSTOPped for %v", m.Name(), d)
		m.Pause()
		time.Sleep(d)
		m.Resume()
	case killLeader:
		f.agent = -1
		m := r.c.etcd.Member(r.c.etcd.Leader(r.t))
		f.detail = fmt.Sprintf("etcd leader %s SIGKILLed, restarted after %v", m.Name(), short*2)
		m.Kill()
		time.Sleep(short * 2)
		m.Restart(r.t)
	case restartMember:
		f.agent = -1
		m := r.c.etcd.Member(int(pick % 3))
		f.detail = fmt.Sprintf("etcd member %s stopped (SIGTERM) and restarted", m.Name())
		m.Stop()
		m.Restart(r.t)
	case killClient:
		// The client is the seed's: it drops its connection at its next
		// update under a lock (or as a leader).
		f.agent = -1
		w := pickClient(pick, workers, candidates)
		w.killReq.Store(true)
		f.detail = fmt.Sprintf("client %d (on agent %d) to drop its connection at its next update under a lock or a term", w.id, w.agent.idx)
	case pauseClient:
		// Among the clients with a heartbeat (the agent keeps the leases
		// of a silent client without one, docs/testing.md A3), the seed's: it
		// pauses at its next update under a lock (or as a leader).
		f.agent = -1
		w := pickClient(pick, withHeartbeat(workers), withHeartbeat(candidates))
		w.pauseReq.Store(int64(long))
		f.detail = fmt.Sprintf("client %d (on agent %d) to pause %v, pings included, between the read and the write of its next update under a lock or a term", w.id, w.agent.idx, long)
	}
	if f.end < 0 {
		f.end = r.now()
	}
	r.mu.Lock()
	r.faults = append(r.faults, f)
	r.mu.Unlock()
	r.note("fault %s", f)
}

// pickClient picks the target of a fault aimed at a client from pick: a
// candidate when bit 32 of pick is set (and there are candidates), else a
// lock client, the same one as pick chose before there were candidates,
// so that the regression seeds keep their targets.
func pickClient(pick uint64, workers, candidates []*worker) *worker {
	if len(candidates) > 0 && pick>>32&1 == 1 {
		return candidates[(pick>>33)%uint64(len(candidates))]
	}
	return workers[pick%uint64(len(workers))]
}

// withHeartbeat returns the workers whose sessions have a heartbeat.
func withHeartbeat(workers []*worker) []*worker {
	var hb []*worker
	for _, w := range workers {
		if w.heartbeat() {
			hb = append(hb, w)
		}
	}
	return hb
}

// revive restarts the agents that exited on their own (each exit is a
// violation, reported by the checks), so that the run goes on.
func (r *run) revive() {
	for _, a := range r.c.agents {
		if !a.running() {
			r.note("agent %d is not running: restarting it", a.idx)
			if err := a.start(); err != nil {
				r.t.Errorf("chaos: restarting agent %d: %v", a.idx, err)
			}
		}
	}
}

// heal ends every fault: links pass, processes run.
func (r *run) heal() {
	for _, a := range r.c.agents {
		a.pass()
		a.signal(syscall.SIGCONT)
	}
	if r.c.redis != nil {
		r.c.redis.Resume()
	} else {
		for _, m := range r.c.etcd.Members() {
			m.Resume()
		}
	}
	r.revive()
}
