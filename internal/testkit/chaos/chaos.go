// Package chaos is lockagent's Jepsen-style safety harness (docs/testing.md's
// D1). It builds the real agent binary, starts one redis-server and three
// agent processes, each reaching Redis through its own fault proxy
// (internal/testkit/faultproxy), and drives many client sessions over a few lock
// names while a seeded schedule injects faults. Each client loops: acquire
// (wait_ms bounded, ttl_ms 1000-2000), then a few updates under the lock
// (sometimes many, for seconds), each a read-modify-write with a short
// delay inside, of a counter fenced by the lease's token and of a plain
// one, then release. Every operation is recorded with its invocation and
// return times and its outcome (ok, fail, or unknown when the call errored
// or the connection died), with every `lost` event and connection end, and
// checked afterwards:
//
//   - porcupine with a lock model partitioned by name (internal/testkit/lockcheck):
//     Strict for fault-free runs; Lease under faults, where a lease may end
//     without a release, but only around its `lost` event or once its
//     connection, its agent or Redis's data died (or its agent was stopped
//     and said so on waking, C1);
//   - the per-name token high-water: a grant asked for after another one
//     returned has a larger token;
//   - a fenced counter (a lockcheck.Register in front of a counter) must
//     lose no increment, while the same updates of the unfenced counter
//     must lose some under faults: the harness has teeth;
//   - every `lost` event arrives before the next grant of the name: each
//     lease with a smaller token had ended for its holder when a grant
//     returned;
//   - a release sent to a stopped agent and answered after SIGCONT, when
//     the stop outlasted the TTL, is answered not_held, never released (C1).
//
// Leader election runs under the same faults (leader.go): six more
// sessions are candidates, each campaigning (connection scope) for one of
// two leader names, recording each term it wins (when its `elected` event
// came, its token, when and how it ended: lost, resigned, connection
// closed). A leader does the same updates, on the counters of its leader
// name, with its term's token; it resigns, drops its connection or leads
// on, and a candidate that waited long resigns and campaigns again. The
// terms are checked with the excuses the leases get: a term may end
// without a lost event only when its leader resigned, or its connection,
// its agent or Redis's data died (or its agent was stopped and said so on
// waking):
//
//   - at most one leader of a name at a time, and each new leader's token
//     above every earlier one's (lockcheck.CheckLeaders): every term's
//     lost event came before the next elected event of the name;
//   - the same with the Lease model, a term being an exclusive lease
//     granted when its elected event came (porcupine's history.html shows
//     the leader names too);
//   - no term ends without its lost event (a newer term of its campaign
//     beginning instead);
//   - the leaders' fenced counters lose nothing.
//
// Faults (faults.go), each kind once in every round of a shuffled deck: an
// agent's Redis link black-holed shorter and longer than the TTL, its
// connections reset, or slowed; agents SIGSTOPped shorter and longer than
// the TTL, and killed with SIGKILL and restarted; redis-server paused
// shorter and longer than the TTL, and restarted without persistence; a
// client's connection closed while it holds a lock or leads; a client
// paused longer than the TTL between the read and the write of an update,
// under a lock or as a leader (half the
// clients set heartbeat_ms, and the pause is aimed at one of them, whose
// agent drops it, and its locks, meanwhile). Kinds, targets, durations and
// gaps come from a math/rand/v2 generator seeded with the run's seed,
// printed at its start and in its summary line:
//
//	chaos: seed=S duration=D operations=N faults=F violations=V
//
// followed by a line of counts and one of leader election: campaigns,
// resigns, terms (elections) and how they ended, the leaders' counters, and
// the median time from a term's end to the next election of its name.
//
// On a failure the seed, porcupine's HTML visualization, the history (also
// as JSON lines that lockcheck.ReadLeaseHistory loads), the agents' and
// redis-server's logs, the fault timeline and the violations are saved under
// $LOCKAGENT_ARTIFACTS (else the temporary directory), named in the failure
// message; -chaos.keep saves them for runs that pass too.
//
// Two more kinds of fault stay out of the deck, so that seeds keep their
// schedules: an agent starved of CPU (docs/testing.md C6), stopped and run in
// turns, for moments at a time, for seconds, which Config.Starvation makes
// the schedule's only kind; and an agent upgraded (C9), handed over to a
// new process of its binary under the load, which Config.Upgrades adds to
// the deck.
//
// The tests run a 10 s fault-free run, a 60 s run with faults, a 30 s run
// of starvation, and the seeds that found bugs (regressions). A long run
// is one command:
//
//	go test ./internal/testkit/chaos -run 'TestChaos$' -chaos.duration=10m -timeout 0
//
// A failing seed is replayed with -chaos.seed=S (with -chaos.duration as
// long as it took), against another build of the agent with
// LOCKAGENT_CHAOS_BIN=path. The clients' interleaving is the machine's, so a
// replay recreates a bug's conditions, not always the bug. It needs
// redis-server on PATH. It is test support: nothing in the agent imports it.
package chaos

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockagent/lockagent/internal/testkit/lockcheck"
)

// Config describes a run.
type Config struct {
	// Binary is the lockagent binary under test (see Build).
	Binary string
	// Seed drives the fault schedule and the clients' choices.
	Seed uint64
	// Duration is how long the clients run (faults included).
	Duration time.Duration
	// Faults turns the fault schedule on; without it the run is checked
	// with the Strict model, and must lose no lease and no update.
	Faults bool
	// Agents, Clients and Names size the run: 3, 12 and 4 by default.
	// Client i uses agent i mod Agents.
	Agents, Clients, Names int
	// Candidates campaign for Leaders names: 6 and 2 by default.
	// Candidate j is client Clients+j, on agent j mod Agents.
	Candidates, Leaders int
	// Slack is the measurement tolerance of the lost-before-grant check:
	// a `lost` event and a grant elsewhere are timed by different
	// goroutines of the test process. Default 20 ms.
	Slack time.Duration
	// Artifacts is the directory for a failed run's artifacts; default
	// $LOCKAGENT_ARTIFACTS, else the temporary directory.
	Artifacts string
	// KeepArtifacts saves the artifacts of a run that passed too.
	KeepArtifacts bool
	// NoTeeth spares a run with faults the demand that the unfenced
	// counters lose updates: for short replays of a seed.
	NoTeeth bool
	// Starvation makes the fault schedule agents starved of CPU alone
	// (docs/testing.md C6) instead of D1's mix; it needs Faults.
	Starvation bool
	// Upgrades adds agents upgraded (handed over to a new process of the
	// binary, docs/upgrades.md) to the schedule's kinds; it needs Faults.
	// The seeds of runs without it keep their schedules. UpgradesOnly
	// makes the schedule upgrades and the faults of clients (upgradeKinds).
	Upgrades, UpgradesOnly bool
	// Etcd runs the agents on a three-member etcd instead of Redis: the
	// schedule's faults of redis-server become faults of the members (a
	// member paused, the leader killed, a member restarted).
	Etcd bool
}

// Report is what a run did and found.
type Report struct {
	Seed       uint64
	Duration   time.Duration
	Operations int // acquires, releases, campaigns and resigns
	Faults     int
	Violations []lockcheck.Violation
	// Problems are failures that are not violations of a promise: the
	// harness lacked teeth, or a check could not run.
	Problems []string

	Grants, Denials, Unknown int
	Lost                     int // `lost` events received
	FencedWrites, Rejected   int // of the fenced counters
	PlainIncrements          int // of the unfenced counters
	PlainLost                int // increments of the unfenced counters lost
	// ClosestLost is the smallest time from a `lost` event (not excused by
	// an agent stop) to a grant of the name elsewhere; -1 if none.
	ClosestLost time.Duration

	// Leader election: campaigns started, terms won (each an election),
	// campaigns resigned, and how the terms ended (by a lost event, the
	// leader's resign, its connection's end or its agent's death).
	Campaigns, Terms, Resigns          int
	TermsLost, TermsResigned, TermsCut int
	// The fenced and unfenced counters of the leaders, as above.
	LeaderFencedWrites, LeaderRejected     int
	LeaderPlainIncrements, LeaderPlainLost int
	// Handover is the median time from a term's end to the next election
	// of the name, over the terms followed by another; -1 if none.
	Handover time.Duration
	// HandoverAfter is the same median by how the term ended: "lost",
	// "resigned" and "cut" (connection, agent or Redis's data gone).
	HandoverAfter map[string]time.Duration
	// Artifacts is where the failed run's artifacts are, or "".
	Artifacts string
}

// Summary is the run's one-line summary.
func (r *Report) Summary() string {
	return fmt.Sprintf("chaos: seed=%d duration=%v operations=%d faults=%d violations=%d",
		r.Seed, r.Duration.Round(time.Second), r.Operations, r.Faults, len(r.Violations))
}

// Details is a second line of counts.
func (r *Report) Details() string {
	return fmt.Sprintf("chaos: grants=%d denials=%d unknown=%d lost=%d fenced_writes=%d fenced_rejected=%d unfenced_increments=%d unfenced_lost=%d closest_lost_to_grant=%v",
		r.Grants, r.Denials, r.Unknown, r.Lost, r.FencedWrites, r.Rejected, r.PlainIncrements, r.PlainLost, r.ClosestLost)
}

// LeaderDetails is a third line, of leader election.
func (r *Report) LeaderDetails() string {
	after := ""
	for _, k := range []string{"lost", "resigned", "cut"} {
		if d, ok := r.HandoverAfter[k]; ok {
			after += fmt.Sprintf(" %s=%v", k, d.Round(100*time.Microsecond))
		}
	}
	return fmt.Sprintf("chaos: leaders: campaigns=%d resigns=%d terms=%d ended_lost=%d ended_resigned=%d ended_cut=%d fenced_writes=%d fenced_rejected=%d unfenced_increments=%d unfenced_lost=%d median_end_to_elected=%v (%s)",
		r.Campaigns, r.Resigns, r.Terms, r.TermsLost, r.TermsResigned, r.TermsCut, r.LeaderFencedWrites, r.LeaderRejected,
		r.LeaderPlainIncrements, r.LeaderPlainLost, r.Handover.Round(100*time.Microsecond), strings.TrimSpace(after))
}

// RandomSeed returns a seed for a run that was given none.
func RandomSeed() uint64 { return rand.Uint64()>>11 | 1 }

// run is one run in progress.
type run struct {
	t     *testing.T
	cfg   Config
	start time.Time
	c     *cluster
	names []string
	// leaderNames are the names the candidates campaign for; their
	// counters are in fenced and plain too.
	leaderNames []string

	fenced map[string]*fencedCounter
	plain  map[string]*plainCounter
	strict *lockcheck.History // fault-free runs only

	stop chan struct{}  // closed when the clients must finish
	aux  sync.WaitGroup // the goroutines recording terms

	mu         sync.Mutex // guards the fields below
	ops        []*opRec
	campaigns  []*campaignRec
	terms      []*termRec
	sessions   []*sessRec
	lost       []lostEvent
	faults     []faultRec
	pauses     []pauseRec
	timeline   []string
	unexpected []lockcheck.Violation // errors of a fault-free run
	backendEvs int

	// Set by check and used by saveArtifacts.
	leases    *lockcheck.LeaseHistory
	html      string // porcupine's visualization, once written
	artifacts string
}

// now is the run's clock: nanoseconds since it started, monotonic.
func (r *run) now() int64 { return int64(time.Since(r.start)) }

func (r *run) stopped() bool {
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}

// note adds a line to the timeline, and to the test's log.
func (r *run) note(format string, args ...any) {
	line := fmt.Sprintf("%9.3fs ", time.Duration(r.now()).Seconds()) + fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.timeline = append(r.timeline, line)
	r.mu.Unlock()
	r.t.Log(line)
}

// Run runs the harness as cfg says, checks the history, fails t on any
// violation (saving the artifacts), and returns the report. It logs and
// prints the summary line.
func Run(t *testing.T, cfg Config) *Report {
	t.Helper()
	if cfg.Agents == 0 {
		cfg.Agents = 3
	}
	if cfg.Clients == 0 {
		cfg.Clients = 12
	}
	if cfg.Names == 0 {
		cfg.Names = 4
	}
	if cfg.Candidates == 0 {
		cfg.Candidates = 6
	}
	if cfg.Leaders == 0 {
		cfg.Leaders = 2
	}
	if cfg.Slack == 0 {
		cfg.Slack = 20 * time.Millisecond
	}
	if cfg.Seed == 0 {
		cfg.Seed = RandomSeed()
	}
	if cfg.Upgrades || cfg.UpgradesOnly {
		// An upgraded agent's new process, the old one's child, becomes
		// this process's once the old one exits: the harness follows it.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			t.Fatalf("chaos: PR_SET_CHILD_SUBREAPER: %v", err)
		}
	}
	mode := "faults"
	if !cfg.Faults {
		mode = "fault-free"
	}
	if cfg.Etcd {
		mode += " etcd"
	}
	fmt.Printf("chaos: %s run of %v with seed=%d\n", mode, cfg.Duration, cfg.Seed)
	t.Logf("chaos: %s run of %v with seed=%d", mode, cfg.Duration, cfg.Seed)

	r := &run{
		t: t, cfg: cfg, stop: make(chan struct{}),
		fenced: map[string]*fencedCounter{}, plain: map[string]*plainCounter{},
	}
	for i := range cfg.Names {
		n := fmt.Sprintf("chaos/%d", i)
		r.names = append(r.names, n)
		r.fenced[n], r.plain[n] = &fencedCounter{}, &plainCounter{}
	}
	for i := range cfg.Leaders {
		n := fmt.Sprintf("chaos/leader/%d", i)
		r.leaderNames = append(r.leaderNames, n)
		r.fenced[n], r.plain[n] = &fencedCounter{}, &plainCounter{}
	}
	if cfg.Etcd {
		r.c = startEtcdCluster(t, cfg.Binary, cfg.Agents)
	} else {
		r.c = startCluster(t, cfg.Binary, cfg.Agents)
	}
	if !cfg.Faults {
		r.strict = lockcheck.NewHistory()
	}
	r.start = time.Now()

	workers := make([]*worker, cfg.Clients)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{r: r, id: i, agent: r.c.agents[i%cfg.Agents],
			rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i)+1))}
		workers[i] = w
		wg.Go(w.loop)
	}
	candidates := make([]*worker, cfg.Candidates)
	for j := range candidates {
		id := cfg.Clients + j
		w := &worker{r: r, id: id, agent: r.c.agents[j%cfg.Agents],
			rng: rand.New(rand.NewPCG(cfg.Seed, uint64(id)+1))}
		candidates[j] = w
		wg.Go(w.lead)
	}
	until := r.start.Add(cfg.Duration)
	if cfg.Faults {
		r.injectFaults(until, workers, candidates)
	} else {
		time.Sleep(time.Until(until))
	}
	r.heal()
	elapsed := time.Since(r.start)
	close(r.stop)
	finished := make(chan struct{})
	go func() { wg.Wait(); r.aux.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(60 * time.Second):
		// Every call has a timeout: this is a bug of the harness.
		t.Fatalf("chaos: the clients did not finish within 60s of the end of the run")
	}
	var stops []lockcheck.Violation
	for _, a := range r.c.agents {
		if err := a.stop(); err != nil {
			stops = append(stops, lockcheck.Violation{Check: "agent", At: r.now(), Detail: err.Error()})
		}
	}

	rep := r.check()
	rep.Seed, rep.Duration = cfg.Seed, elapsed
	rep.Violations = append(rep.Violations, stops...)
	r.finish(rep)
	return rep
}

// finish logs the report and, if the run failed, saves the artifacts and
// fails the test.
func (r *run) finish(rep *Report) {
	t := r.t
	failed := len(rep.Violations) > 0 || len(rep.Problems) > 0
	if failed || r.cfg.KeepArtifacts {
		rep.Artifacts = r.saveArtifacts(rep)
	}
	t.Log(rep.Summary())
	t.Log(rep.Details())
	t.Log(rep.LeaderDetails())
	fmt.Println(rep.Summary())
	fmt.Println(rep.Details())
	fmt.Println(rep.LeaderDetails())
	if !failed {
		if rep.Artifacts != "" {
			t.Logf("chaos: artifacts in %s", rep.Artifacts)
		}
		return
	}
	var b strings.Builder
	for i, v := range rep.Violations {
		if i == 50 {
			fmt.Fprintf(&b, "  ... and %d more\n", len(rep.Violations)-i)
			break
		}
		fmt.Fprintf(&b, "  %s\n", v)
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(&b, "  %s\n", p)
	}
	t.Errorf("chaos: seed=%d failed: %d violations, %d problems; artifacts (seed, history.html, agent logs, timeline) in %s\n%s",
		rep.Seed, len(rep.Violations), len(rep.Problems), rep.Artifacts, b.String())
}

// sortedFaults returns the fault records in time order.
func (r *run) sortedFaults() []faultRec {
	r.mu.Lock()
	defer r.mu.Unlock()
	fs := slices.Clone(r.faults)
	slices.SortFunc(fs, func(a, b faultRec) int { return cmp.Compare(a.start, b.start) })
	return fs
}
