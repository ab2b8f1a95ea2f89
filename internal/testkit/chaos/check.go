package chaos

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lockagent/lockagent/internal/testkit/lockcheck"
)

// stopGrace is how soon after a SIGCONT a `lost` event counts as the
// agent's report of a deadline that passed while it was stopped: such a
// lease may have ended in Redis at any moment of the stop, and its holder
// could not be told (docs/testing.md C1: the agent reports it before anything
// else once it runs again). Measured under the race detector, during
// chaos runs, those reports came 0-7 ms after the SIGCONT of a stop, and
// up to 46 ms after the end of a starvation; a report later than that is
// late, and is judged when it came.
const stopGrace = 250 * time.Millisecond

// stoppedBefore returns the stop of an agent, ended after call, during
// which at fell or that ended shortly (within stopGrace) before it: a lease
// acquired at call and reported ended at at (or whose holder ended it then,
// closing its connection while its agent was stopped) may have ended in
// Redis during that stop, when its agent could tell nobody.
func stoppedBefore(stops []faultRec, call, at int64) *faultRec {
	for i, f := range stops {
		if f.end > call && at >= f.start && at <= f.end+int64(stopGrace) {
			return &stops[i]
		}
	}
	return nil
}

// pausedAt returns the pause of a client during which at fell (give or
// take slack), or nil. After the pause the client runs again: its
// connection must have ended by then if its agent dropped it meanwhile.
func pausedAt(pauses []pauseRec, at, slack int64) *pauseRec {
	for i, p := range pauses {
		if at >= p.start && at <= p.end+slack {
			return &pauses[i]
		}
	}
	return nil
}

// ending is one piece of evidence that a lease had ended for its holder.
type ending struct {
	at int64 // the earliest moment it had ended for its holder
	// span is the End operation it gives porcupine: the lease ended
	// somewhere in [span[0], span[1]] (lockcheck.Infinity: or later).
	span [2]int64
	how  string
}

// check runs every checker on the recorded history.
func (r *run) check() *Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := &Report{ClosestLost: -1}
	slack := int64(r.cfg.Slack)

	lostBy := map[string]lostEvent{}
	for _, e := range r.lost {
		if _, dup := lostBy[e.lease]; !dup {
			lostBy[e.lease] = e
		}
	}
	rep.Lost = len(r.lost)

	var stops, kills [][]faultRec
	var restarts []faultRec
	stops = make([][]faultRec, len(r.c.agents))
	kills = make([][]faultRec, len(r.c.agents))
	for _, f := range r.faults {
		switch f.kind {
		case stopShort, stopLong, starveAgent:
			stops[f.agent] = append(stops[f.agent], f)
		case killAgent:
			kills[f.agent] = append(kills[f.agent], f)
		case restartRedis:
			restarts = append(restarts, f)
		}
	}

	pauses := map[int][]pauseRec{}
	for _, p := range r.pauses {
		pauses[p.session] = append(pauses[p.session], p)
	}

	var h lockcheck.LeaseHistory
	var grants []lockcheck.Grant
	calls := map[int][2]int64{} // lease number -> its acquire's [call, return]
	byLease := map[string]*opRec{}
	lostFirst := map[string]int64{} // lease id -> when its lost event came
	for _, e := range r.lost {
		if at, seen := lostFirst[e.lease]; !seen || e.at < at {
			lostFirst[e.lease] = e.at
		}
	}
	for _, op := range r.ops {
		if op.outcome == none {
			continue
		}
		rep.Operations++
		if op.relOutcome != none {
			rep.Operations++
		}
		rep.FencedWrites += op.fencedWrites
		rep.Rejected += op.rejected
		switch op.outcome {
		case unknown:
			rep.Unknown++
			continue
		case failed:
			rep.Denials++
			h.Add(op.call, op.ret, lockcheck.LeaseInput{Kind: lockcheck.LeaseAcquire, Name: op.name, Client: op.session, Lease: op.seq,
				Note: fmt.Sprintf("agent %d: %s", op.agent, op.code)}, lockcheck.LeaseOutput{})
			continue
		}
		rep.Grants++
		calls[op.seq] = [2]int64{op.call, op.ret}
		byLease[op.leaseID] = op
		h.Add(op.call, op.ret, lockcheck.LeaseInput{Kind: lockcheck.LeaseAcquire, Name: op.name, Client: op.session, Lease: op.seq,
			Note: fmt.Sprintf("agent %d, ttl %dms", op.agent, op.ttl)}, lockcheck.LeaseOutput{OK: true, Token: op.token})
		// Redis restarted without persistence while the lease was held:
		// it vanished then, and a release answered afterwards says
		// released whatever the backend had (protocol.md, release).
		var wiped *faultRec
		for i, f := range restarts {
			if f.start >= op.call && (op.relCall < 0 || f.start < op.relCall) {
				wiped = &restarts[i]
				break
			}
		}
		switch {
		case op.relOutcome == ok && wiped != nil:
			h.Add(wiped.start, op.relRet, lockcheck.LeaseInput{Kind: lockcheck.LeaseEnd, Name: op.name, Client: op.session, Lease: op.seq,
				Note: "redis-server restarted; then released"}, lockcheck.LeaseOutput{})
		case op.relOutcome == ok || op.relOutcome == failed:
			h.Add(op.relCall, op.relRet, lockcheck.LeaseInput{Kind: lockcheck.LeaseRelease, Name: op.name, Client: op.session, Lease: op.seq},
				lockcheck.LeaseOutput{OK: op.relOutcome == ok})
		}

		// What ended the lease for its holder, earliest first. A holder
		// that learned of the end (a lost event, its connection ended, its
		// release failed) right after its agent was SIGCONTed, or whose
		// connection the agent dropped while the client was paused, may
		// have lost the lease in Redis at any moment since the stop or the
		// pause began: nobody could tell it (docs/testing.md C1, A3).
		var ends []ending
		excused := func(observed int64, how string, span1 int64) (ending, bool) {
			if f := stoppedBefore(stops[op.agent], op.call, observed); f != nil {
				from := max(f.start, op.call)
				return ending{at: from, span: [2]int64{from, span1}, how: how + ", after its agent was stopped"}, true
			}
			return ending{}, false
		}
		if e, ok := lostBy[op.leaseID]; ok {
			how := "lost (" + e.reason + ")"
			end, ok := excused(e.at, how, e.at)
			if !ok {
				end = ending{at: e.at, span: [2]int64{e.at - slack, e.at}, how: how}
			}
			ends = append(ends, end)
			if e.token != op.token {
				rep.Violations = append(rep.Violations, lockcheck.Violation{Name: op.name, Check: "events", At: e.at,
					Detail: fmt.Sprintf("lost event of lease #%d has token %d, granted %d", op.seq, e.token, op.token)})
			}
		}
		if s := r.sessions[op.session]; s.ended >= 0 {
			how := "connection " + s.how
			end, ok := excused(s.ended, how, lockcheck.Infinity)
			if p := pausedAt(pauses[op.session], s.ended, slack); !ok && p != nil {
				from := max(p.start, op.call)
				end, ok = ending{at: from, span: [2]int64{from, lockcheck.Infinity}, how: how + " while its client was paused"}, true
			}
			if !ok {
				end = ending{at: s.ended, span: [2]int64{s.ended, lockcheck.Infinity}, how: how}
			}
			ends = append(ends, end)
		}
		for _, f := range kills[op.agent] {
			if f.start >= op.call {
				ends = append(ends, ending{at: f.start, span: [2]int64{f.start, lockcheck.Infinity}, how: "agent killed"})
				break
			}
		}
		if wiped != nil {
			ends = append(ends, ending{at: wiped.start, span: [2]int64{wiped.start, lockcheck.Infinity}, how: "redis-server restarted"})
		}
		if op.relOutcome == unknown {
			how := "release of unknown outcome"
			end, ok := excused(op.relRet, how, lockcheck.Infinity)
			if !ok {
				end = ending{at: op.relCall, span: [2]int64{op.relCall, lockcheck.Infinity}, how: how}
			}
			ends = append(ends, end)
		}
		g := lockcheck.Grant{Name: op.name, Lease: op.seq, Agent: op.agent, Token: op.token, Call: op.call, Return: op.ret,
			Ended: lockcheck.Infinity}
		if len(ends) > 0 {
			first := slices.MinFunc(ends, func(a, b ending) int { return cmp.Compare(a.at, b.at) })
			g.Ended, g.How = first.at, first.how
			// A lease released by its holder needs no End: the release
			// is in the history.
			if op.relOutcome != ok {
				h.Add(first.span[0], first.span[1], lockcheck.LeaseInput{Kind: lockcheck.LeaseEnd, Name: op.name, Client: op.session,
					Lease: op.seq, Note: first.how}, lockcheck.LeaseOutput{})
			}
		}
		// A lease the agent reported lost before it answered its release
		// (events and answers come in order on one connection) is
		// released as not_held: the lost event says its id is dead.
		if lostAt, was := lostFirst[op.leaseID]; was && op.relOutcome == ok && lostAt < op.relRet {
			rep.Violations = append(rep.Violations, lockcheck.Violation{Name: op.name, Check: "events", At: op.relRet,
				Detail: fmt.Sprintf("lease #%d (agent %d) was reported lost at %v, then its release was answered released:true at %v; after lost it must be not_held",
					op.seq, op.agent, time.Duration(lostAt), time.Duration(op.relRet))})
		}
		// C1: a release sent while the agent was stopped, answered after
		// SIGCONT when the stop had outlasted the TTL, is of a lease past
		// its local deadline (no renewal could succeed during the stop):
		// it must be answered not_held, its lost event first.
		for _, f := range stops[op.agent] {
			if f.kind != starveAgent && op.relOutcome == ok && op.ret < f.start && op.relCall > f.stopped && op.relRet >= f.end &&
				f.end-f.stopped >= int64(op.ttl)*int64(time.Millisecond) {
				rep.Violations = append(rep.Violations, lockcheck.Violation{Name: op.name, Check: "overdue", At: op.relRet,
					Detail: fmt.Sprintf("lease #%d (agent %d, ttl %dms) was released at %v while its agent was stopped (%v-%v) and answered released:true after SIGCONT: it was past its local deadline and must have been lost first (C1)",
						op.seq, op.agent, op.ttl, time.Duration(op.relCall), time.Duration(f.stopped), time.Duration(f.end))})
			}
		}
		if op.relCall >= 0 && op.relCall < g.Ended {
			g.Ended, g.How = op.relCall, "release"
		}
		grants = append(grants, g)
	}
	unknownIn := map[int]bool{} // sessions with an acquire of unknown outcome
	for _, op := range r.ops {
		if op.outcome == unknown {
			unknownIn[op.session] = true
		}
	}
	for _, e := range r.lost {
		if byLease[e.lease] == nil && !unknownIn[e.session] {
			rep.Violations = append(rep.Violations, lockcheck.Violation{Name: e.name, Check: "events", At: e.at,
				Detail: fmt.Sprintf("lost event for lease %s (token %d), which no acquire of session %d was granted", e.lease, e.token, e.session)})
		}
		h.Annotate("", e.session, e.at, e.at, "lost: "+e.reason)
	}
	r.checkLeaders(rep, &h, leaderStops{stops: stops, kills: kills, restarts: restarts, pauses: pauses})
	for _, f := range r.faults {
		h.Annotate("faults", 0, f.start, f.end, f.kind.String()+": "+f.detail)
	}
	r.leases = &h

	// The lock model.
	dir := r.artifactDir()
	if r.strict != nil {
		res, err := lockcheck.CheckStrict(r.strict, dir)
		switch {
		case err != nil:
			rep.Problems = append(rep.Problems, err.Error())
		case !res.OK:
			r.html = res.Visualization
			rep.Violations = append(rep.Violations, lockcheck.Violation{Check: "strict", At: r.now(),
				Detail: "the history is not linearizable for the Strict lock model: see " + res.Visualization})
		}
		rep.Violations = append(rep.Violations, r.unexpected...)
		for _, e := range r.lost {
			rep.Violations = append(rep.Violations, lockcheck.Violation{Name: e.name, Check: "fault-free", At: e.at,
				Detail: fmt.Sprintf("lease %s lost (%s) in a fault-free run", e.lease, e.reason)})
		}
	} else {
		res, err := lockcheck.CheckLease(&h, dir)
		switch {
		case err != nil:
			rep.Problems = append(rep.Problems, err.Error())
		case !res.OK:
			r.html = res.Visualization
			for i, n := range res.BadNames {
				rep.Violations = append(rep.Violations, lockcheck.Violation{Name: n, Check: "lease", At: r.now(),
					Detail: "not linearizable for the Lease lock model: " + res.Why[i] + "; see " + res.Visualization})
			}
		}
	}

	// Tokens, and lost before grant.
	rep.Violations = append(rep.Violations, lockcheck.CheckTokens(grants)...)
	rep.Violations = append(rep.Violations, lockcheck.CheckLostBeforeGrant(grants, r.cfg.Slack)...)
	rep.ClosestLost = closestLost(grants)

	// The fenced and unfenced counters.
	plainIncrements, plainValue := 0, 0
	for _, n := range r.names {
		rep.Violations = append(rep.Violations, checkFenced(n, r.fenced[n], calls)...)
		p := r.plain[n]
		plainIncrements += p.increments
		plainValue += p.value
		if r.strict != nil && p.value != p.increments {
			rep.Violations = append(rep.Violations, lockcheck.Violation{Name: n, Check: "fault-free", Detail: fmt.Sprintf(
				"the unfenced counter is %d after %d increments under the lock: two holders at once", p.value, p.increments)})
		}
	}
	rep.PlainIncrements, rep.PlainLost = plainIncrements, plainIncrements-plainValue
	if r.strict == nil && !r.cfg.NoTeeth && rep.PlainLost == 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf(
			"the harness has no teeth: the unfenced counters lost none of %d increments under faults", plainIncrements))
	}

	// The agents themselves.
	for _, a := range r.c.agents {
		for _, u := range a.unexpectedExits() {
			rep.Violations = append(rep.Violations, lockcheck.Violation{Check: "agent", At: r.now(), Detail: u})
		}
		log, _ := os.ReadFile(a.logPath)
		for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
			if n := strings.Count(string(log), bad); n > 0 {
				rep.Violations = append(rep.Violations, lockcheck.Violation{Check: "agent", At: r.now(),
					Detail: fmt.Sprintf("agent %d's log has %d × %q", a.idx, n, bad)})
			}
		}
	}
	rep.Faults = len(r.faults)
	slices.SortStableFunc(rep.Violations, func(a, b lockcheck.Violation) int { return cmp.Compare(a.At, b.At) })
	return rep
}

// closestLost is the smallest time from a `lost` event to the grant of the
// same name with the next token, among leases ended by their event.
func closestLost(grants []lockcheck.Grant) time.Duration {
	byName := map[string][]lockcheck.Grant{}
	for _, g := range grants {
		byName[g.Name] = append(byName[g.Name], g)
	}
	closest := time.Duration(-1)
	for _, gs := range byName {
		slices.SortFunc(gs, func(a, b lockcheck.Grant) int { return cmp.Compare(a.Token, b.Token) })
		for i := 1; i < len(gs); i++ {
			l, g := gs[i-1], gs[i]
			if !strings.HasPrefix(l.How, "lost") || strings.Contains(l.How, "stopped") {
				continue
			}
			if d := time.Duration(g.Return - l.Ended); closest < 0 || d < closest {
				closest = d
			}
		}
	}
	return closest
}

// artifactDir is where this run's artifacts go: Config.Artifacts, else
// $LOCKAGENT_ARTIFACTS, else the temporary directory, in a directory named
// by the test, the seed and the time. It is created only when something is
// written there.
func (r *run) artifactDir() string {
	if r.artifacts != "" {
		return r.artifacts
	}
	base := r.cfg.Artifacts
	if base == "" {
		base = os.Getenv("LOCKAGENT_ARTIFACTS")
	}
	if base == "" {
		base = os.TempDir()
	}
	name := fmt.Sprintf("chaos-%s-seed-%d-%s", strings.ReplaceAll(r.t.Name(), "/", "_"), r.cfg.Seed, r.start.Format("20060102-150405"))
	r.artifacts = filepath.Join(base, name)
	return r.artifacts
}

// saveArtifacts writes what a failed run leaves for study, and returns
// the directory.
func (r *run) saveArtifacts(rep *Report) string {
	dir := r.artifactDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.t.Logf("chaos: artifacts: %v", err)
		return dir
	}
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			r.t.Logf("chaos: artifacts: %v", err)
		}
	}
	write("seed", fmt.Sprintf("%d\n", rep.Seed))
	write("README", fmt.Sprintf("%s\n%s\n\nReplay the fault schedule with:\n  go test -race ./internal/testkit/chaos -run '%s$' -chaos.seed=%d -chaos.duration=%v\n",
		rep.Summary(), rep.Details(), r.t.Name(), rep.Seed, r.cfg.Duration))
	var b strings.Builder
	for _, v := range rep.Violations {
		fmt.Fprintln(&b, v)
	}
	for _, p := range rep.Problems {
		fmt.Fprintln(&b, "problem:", p)
	}
	write("violations.txt", b.String())

	r.mu.Lock()
	b.Reset()
	for _, line := range r.timeline {
		fmt.Fprintln(&b, line)
	}
	r.mu.Unlock()
	fmt.Fprintln(&b, "\nfaults:")
	for _, f := range r.sortedFaults() {
		fmt.Fprintln(&b, f)
	}
	write("timeline.txt", b.String())
	write("history.txt", r.dumpHistory())

	if r.leases != nil {
		if err := r.leases.WriteJSON(filepath.Join(dir, "lease-history.jsonl")); err != nil {
			r.t.Logf("chaos: artifacts: %v", err)
		}
	}
	if r.html == "" && r.leases != nil {
		if path, err := lockcheck.VisualizeLease(r.leases, dir); err == nil {
			r.html = path
		} else {
			r.t.Logf("chaos: artifacts: %v", err)
		}
	}
	for _, a := range r.c.agents {
		if log, err := os.ReadFile(a.logPath); err == nil {
			write(fmt.Sprintf("agent-%d.log", a.idx), string(log))
		}
	}
	if r.c.redis != nil {
		if log, err := os.ReadFile(filepath.Join(r.c.redis.Dir(), "out.log")); err == nil {
			write("redis-server.log", string(log))
		}
	} else {
		for _, m := range r.c.etcd.Members() {
			if log, err := os.ReadFile(m.LogPath()); err == nil {
				write("etcd-"+m.Name()+".log", string(log))
			}
		}
	}
	return dir
}

// dumpHistory renders every operation, session and event, in time order.
func (r *run) dumpHistory() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	type line struct {
		at   int64
		text string
	}
	var lines []line
	sec := func(t int64) string { return fmt.Sprintf("%9.4fs", time.Duration(t).Seconds()) }
	for _, op := range r.ops {
		if op.outcome == none {
			continue
		}
		lines = append(lines, line{op.call, fmt.Sprintf("%s acquire #%d %s session %d agent %d ttl %dms wait %dms -> %s %s token %d lease %s (returned %s)",
			sec(op.call), op.seq, op.name, op.session, op.agent, op.ttl, op.wait, op.outcome, op.code, op.token, op.leaseID, sec(op.ret))})
		if op.relOutcome != none {
			lines = append(lines, line{op.relCall, fmt.Sprintf("%s release #%d %s session %d -> %s %s (returned %s); fenced writes %d, rejected %d",
				sec(op.relCall), op.seq, op.name, op.session, op.relOutcome, op.relCode, sec(op.relRet), op.fencedWrites, op.rejected)})
		}
	}
	for _, s := range r.sessions {
		lines = append(lines, line{s.opened, fmt.Sprintf("%s session %d of client %d opened on agent %d", sec(s.opened), s.id, s.worker, s.agent)})
		if s.ended >= 0 {
			lines = append(lines, line{s.ended, fmt.Sprintf("%s session %d ended: %s", sec(s.ended), s.id, s.how)})
		}
	}
	for _, e := range r.lost {
		lines = append(lines, line{e.at, fmt.Sprintf("%s lost %s lease %s token %d session %d: %s", sec(e.at), e.name, e.lease, e.token, e.session, e.reason)})
	}
	for _, f := range r.faults {
		lines = append(lines, line{f.start, fmt.Sprintf("%s FAULT %s", sec(f.start), f)})
	}
	for _, c := range r.campaigns {
		if c.outcome == none {
			continue
		}
		lines = append(lines, line{c.call, fmt.Sprintf("%s campaign #%d %s session %d agent %d ttl %dms -> %s %s (returned %s)",
			sec(c.call), c.seq, c.name, c.session, c.agent, c.ttl, c.outcome, c.code, sec(c.ret))})
		if c.resignCall >= 0 {
			lines = append(lines, line{c.resignCall, fmt.Sprintf("%s resign campaign #%d %s session %d -> %s %s (returned %s)",
				sec(c.resignCall), c.seq, c.name, c.session, c.resignOutcome, c.resignCode, sec(c.resignRet))})
		}
	}
	for _, t := range r.terms {
		c := t.campaign
		lines = append(lines, line{t.start, fmt.Sprintf("%s elected term #%d %s campaign #%d session %d agent %d token %d lease %s",
			sec(t.start), t.seq, c.name, c.seq, c.session, c.agent, t.token, t.lease)})
		if t.done >= 0 {
			lines = append(lines, line{t.done, fmt.Sprintf("%s term #%d %s ended: %s; fenced writes %d, rejected %d",
				sec(t.done), t.seq, c.name, t.reason, t.fencedWrites, t.rejected)})
		}
	}
	slices.SortStableFunc(lines, func(a, b line) int { return cmp.Compare(a.at, b.at) })
	var b strings.Builder
	for _, l := range lines {
		fmt.Fprintln(&b, l.text)
	}
	return b.String()
}
