package chaos

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit/lockcheck"
)

// Leader election under the same faults. Some client sessions are
// candidates: each campaigns (connection scope) on one of a few leader
// names, records every term it wins (when its `elected` event came, its
// token, and when and how it ended), and while it leads does the same
// read-modify-write updates as the lock clients, on counters of the leader
// name, fenced by the term's token. A leader leads for a while and then
// resigns, or drops its connection, or leads on; a candidate that waited
// long gives up and resigns; the client-kill and client-pause faults strike
// candidates too (at their next update as leaders).

const (
	// giveUpLo and giveUpHi bound how long a candidate contends before it
	// resigns and campaigns again, perhaps for another name.
	giveUpLo, giveUpHi = 2000, 8000 // ms
	// resignPercent of the leaders that finish a stint resign; quitPercent
	// drop their connection; the others lead on for another stint.
	resignPercent = 50
	quitPercent   = 15
)

// campaignRec is one campaign: its call and its answer, and its resign.
type campaignRec struct {
	seq     int // unique in the run, among campaigns
	session int
	agent   int
	name    string
	ttl     int

	call, ret int64
	outcome   outcome
	code      string

	resignCall, resignRet int64 // -1: never resigned
	resignOutcome         outcome
	resignCode            string
}

// termRec is one term a campaign won, as its candidate saw it. The
// campaign's reading goroutine sets start, a watcher of the term sets
// done and reason (under run.mu), and the candidate the rest; it is read
// after they have all finished.
type termRec struct {
	seq      int // unique in the run, among terms
	campaign *campaignRec
	token    uint64
	lease    string
	// contend is the earliest moment the backend could have granted the
	// term: its campaign's call, or the start of its previous term.
	contend int64
	start   int64 // when its `elected` event reached the candidate
	done    int64 // when the client saw it end (-1: never)
	reason  string

	fencedWrites, rejected int
}

// liveTerm is a term being led: its record and the client's handle.
type liveTerm struct {
	rec  *termRec
	term *client.Term
}

// lead is a candidate's loop: a session with its agent, and campaign after
// campaign on it.
func (w *worker) lead() {
	for !w.r.stopped() {
		s := w.connect()
		if s == nil {
			w.sleep(w.ms(50, 200))
			continue
		}
		for !w.r.stopped() && !s.ended() && w.campaign(s) {
		}
		w.r.closeSession(s, "closed")
	}
}

// campaign runs one campaign, through its terms, until the candidate
// resigns; it returns false when the session must be dropped.
func (w *worker) campaign(s *session) bool {
	r := w.r
	rec := &campaignRec{
		session: s.rec.id, agent: w.agent.idx,
		name: r.leaderNames[w.rng.IntN(len(r.leaderNames))], ttl: 1000 + w.rng.IntN(1001),
		resignCall: -1, resignRet: -1,
	}
	r.mu.Lock()
	rec.seq = len(r.campaigns) + 1
	r.campaigns = append(r.campaigns, rec)
	r.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), callSlack)
	rec.call = r.now()
	cp, err := s.c.Campaign(ctx, rec.name, client.CampaignOptions{
		TTL: time.Duration(rec.ttl) * time.Millisecond, Meta: fmt.Sprintf("chaos client %d", w.id)})
	rec.ret = r.now()
	cancel()
	rec.outcome, rec.code = classify(err)
	if r.strict != nil && rec.outcome != ok {
		r.unexpectedError(rec.ret, rec.name, fmt.Sprintf("campaign #%d on agent %d: %s %s", rec.seq, rec.agent, rec.outcome, rec.code))
	}
	switch rec.outcome {
	case unknown:
		return false // the agent may have started it: drop the session
	case failed:
		w.sleep(w.ms(20, 100))
		return true
	}
	terms := make(chan liveTerm, 64)
	r.aux.Go(func() { r.recordTerms(rec, cp, terms) })

	giveUp := time.NewTimer(w.ms(giveUpLo, giveUpHi))
	defer giveUp.Stop()
	for {
		select {
		case t, open := <-terms:
			if !open {
				return false // the connection ended
			}
			switch w.leadTerm(s, t) {
			case stintResign:
				return w.resign(s, cp, rec)
			case stintDrop:
				return false
			}
			giveUp.Reset(w.ms(giveUpLo, giveUpHi))
		case <-giveUp.C:
			return w.resign(s, cp, rec)
		case <-s.done:
			return false
		case <-r.stop:
			return false
		}
	}
}

// recordTerms records each term of the campaign as its `elected` event
// comes, and its end as the client sees it; it forwards the terms to the
// candidate and closes terms when the campaign has ended.
func (r *run) recordTerms(c *campaignRec, cp *client.Campaign, terms chan<- liveTerm) {
	defer close(terms)
	contend := c.call
	for t := range cp.Elected() {
		rec := &termRec{campaign: c, token: t.Token, lease: t.Lease, contend: contend, start: r.now(), done: -1}
		contend = rec.start
		r.mu.Lock()
		rec.seq = len(r.terms) + 1
		r.terms = append(r.terms, rec)
		r.mu.Unlock()
		r.aux.Go(func() {
			<-t.Done()
			at := r.now()
			r.mu.Lock()
			rec.done, rec.reason = at, t.Reason()
			r.mu.Unlock()
		})
		terms <- liveTerm{rec: rec, term: t}
	}
}

// stint is how a leader's stint ended.
type stint uint8

const (
	stintOver   stint = iota // the term ended, or the run: contend on
	stintResign              // the leader is to resign
	stintDrop                // the session is gone, or must be dropped
)

// leadTerm leads a term: stints of updates under its token until it ends.
func (w *worker) leadTerm(s *session, t liveTerm) stint {
	r := w.r
	name := t.rec.campaign.name
	what := fmt.Sprintf("%s term #%d (token %d)", name, t.rec.seq, t.rec.token)
	fc, pc := r.fenced[name], r.plain[name]
	for {
		steps := 5 + w.rng.IntN(40)
		if w.rng.IntN(100) < longHoldPercent {
			steps = 60 + w.rng.IntN(140)
		}
		for range steps {
			if r.stopped() || s.ended() || termOver(t.term) {
				return stintOver
			}
			if w.killReq.Swap(false) {
				r.note("client %d killed (its connection closed) leading %s on agent %d", w.id, what, w.agent.idx)
				r.closeSession(s, "killed")
				return stintDrop
			}
			if w.update(s, fc, pc, t.rec.token, t.rec.seq, what) {
				t.rec.fencedWrites++
			} else {
				t.rec.rejected++
			}
			time.Sleep(w.ms(10, 50))
		}
		switch roll := w.rng.IntN(100); {
		case roll < resignPercent:
			return stintResign
		case roll < resignPercent+quitPercent:
			r.closeSession(s, "quit")
			return stintDrop
		}
	}
}

// termOver tells whether the client has seen t end.
func termOver(t *client.Term) bool {
	select {
	case <-t.Done():
		return true
	default:
		return false
	}
}

// resign resigns the campaign. It returns false when the session must be
// dropped.
func (w *worker) resign(s *session, cp *client.Campaign, c *campaignRec) bool {
	r := w.r
	ctx, cancel := context.WithTimeout(context.Background(), callSlack)
	defer cancel()
	c.resignCall = r.now()
	err := cp.Resign(ctx)
	c.resignRet = r.now()
	c.resignOutcome, c.resignCode = classify(err)
	if r.strict != nil && c.resignOutcome != ok {
		r.unexpectedError(c.resignRet, c.name, fmt.Sprintf("resign of campaign #%d on agent %d: %s %s", c.seq, c.agent, c.resignOutcome, c.resignCode))
	}
	if c.resignOutcome != ok {
		// A campaign that ended meanwhile is not_held: the session is
		// gone, or going.
		return false
	}
	w.sleep(w.ms(20, 200))
	return !s.ended()
}

// leaderStops is what excuses a term's end without a lost event: the
// faults of the run, by agent where they strike one.
type leaderStops struct {
	stops, kills [][]faultRec
	restarts     []faultRec
	pauses       map[int][]pauseRec
}

// termEnd returns the earliest evidence that t had ended for its leader,
// and whether there is any. As for a lease (check), a term ends without a
// lost event only when its leader resigned, or its connection, its agent or
// Redis's data died; a loss learned just after its agent was SIGCONTed, or a
// connection the agent dropped while its client was paused, may have ended
// it at any moment since the stop or the pause began.
func (r *run) termEnd(t *termRec, ls leaderStops, slack int64) (ending, bool) {
	c := t.campaign
	var ends []ending
	excused := func(observed int64, how string, span1 int64) (ending, bool) {
		if f := stoppedBefore(ls.stops[c.agent], t.start, observed); f != nil {
			from := max(f.start, t.start)
			return ending{at: from, span: [2]int64{from, span1}, how: how + ", after its agent was stopped"}, true
		}
		return ending{}, false
	}
	switch t.reason {
	case "", "resigned", "connection closed":
		// Not seen to end, or ended by what the evidence below records.
	default:
		how := "lost (" + t.reason + ")"
		end, ok := excused(t.done, how, t.done)
		if !ok {
			end = ending{at: t.done, span: [2]int64{t.done - slack, t.done}, how: how}
		}
		ends = append(ends, end)
	}
	if c.resignCall >= 0 {
		// The candidate stopped leading when it asked to resign, whether
		// or not it knew it led: the term may have come meanwhile.
		ret := c.resignRet
		if c.resignOutcome == unknown {
			ret = lockcheck.Infinity
		}
		at := max(c.resignCall, t.start)
		ends = append(ends, ending{at: at, span: [2]int64{at, max(ret, at)}, how: "resigned"})
	}
	if s := r.sessions[c.session]; s.ended >= 0 {
		how := "connection " + s.how
		end, ok := excused(s.ended, how, lockcheck.Infinity)
		if p := pausedAt(ls.pauses[c.session], s.ended, slack); !ok && p != nil {
			from := max(p.start, t.start)
			end, ok = ending{at: from, span: [2]int64{from, lockcheck.Infinity}, how: how + " while its client was paused"}, true
		}
		if !ok {
			end = ending{at: s.ended, span: [2]int64{s.ended, lockcheck.Infinity}, how: how}
		}
		ends = append(ends, end)
	}
	for _, f := range ls.kills[c.agent] {
		if f.start >= t.start {
			ends = append(ends, ending{at: f.start, span: [2]int64{f.start, lockcheck.Infinity}, how: "agent killed"})
			break
		}
	}
	for _, f := range ls.restarts {
		// Granted in Redis at any moment since it contended.
		if f.start >= t.contend && (c.resignCall < 0 || f.start < c.resignCall) {
			ends = append(ends, ending{at: f.start, span: [2]int64{f.start, lockcheck.Infinity}, how: "redis-server restarted"})
			break
		}
	}
	if len(ends) == 0 {
		return ending{}, false
	}
	first := slices.MinFunc(ends, func(a, b ending) int { return cmp.Compare(a.at, b.at) })
	// Evidence from before the term began (its connection closing as its
	// elected event came, Redis restarting while it contended) ends it as
	// it began.
	first.at = max(first.at, t.start)
	return first, true
}

// checkLeaders checks the terms: at most one leader of a name at a time,
// each new leader's token above every earlier one's (lockcheck.
// CheckLeaders, where a term ends at its termEnd), and in h for the Lease
// model, a term being an exclusive lease granted when its elected event
// came. It fills the report's leader counts. It runs under r.mu, after
// every client has finished.
func (r *run) checkLeaders(rep *Report, h *lockcheck.LeaseHistory, ls leaderStops) {
	slack := int64(r.cfg.Slack)
	for _, c := range r.campaigns {
		if c.outcome == none {
			continue
		}
		rep.Campaigns++
		rep.Operations++
		if c.resignCall >= 0 {
			rep.Resigns++
			rep.Operations++
		}
	}
	var terms []lockcheck.Term
	handovers := map[string][]time.Duration{}
	spans := map[string]map[int][2]int64{} // by leader name: term number -> its election
	for _, n := range r.leaderNames {
		spans[n] = map[int][2]int64{}
	}
	for _, t := range r.terms {
		c := t.campaign
		rep.Terms++
		rep.LeaderFencedWrites += t.fencedWrites
		rep.LeaderRejected += t.rejected
		spans[c.name][t.seq] = [2]int64{t.start, t.start}
		lease := len(r.ops) + t.seq // a lease number of its own in h
		h.Add(t.contend, t.start, lockcheck.LeaseInput{Kind: lockcheck.LeaseAcquire, Name: c.name, Client: c.session, Lease: lease,
			Note: fmt.Sprintf("term #%d of campaign #%d, agent %d, ttl %dms", t.seq, c.seq, c.agent, c.ttl)},
			lockcheck.LeaseOutput{OK: true, Token: t.token})
		lt := lockcheck.Term{Name: c.name, Candidate: c.seq, Agent: c.agent, Token: t.token, Start: t.start, End: lockcheck.Infinity}
		if end, ok := r.termEnd(t, ls, slack); ok {
			lt.End, lt.How = end.at, end.how
			h.Add(end.span[0], end.span[1], lockcheck.LeaseInput{Kind: lockcheck.LeaseEnd, Name: c.name, Client: c.session, Lease: lease,
				Note: fmt.Sprintf("term #%d: %s", t.seq, end.how)}, lockcheck.LeaseOutput{})
			switch {
			case strings.HasPrefix(end.how, "lost"):
				rep.TermsLost++
			case end.how == "resigned":
				rep.TermsResigned++
			default:
				rep.TermsCut++
			}
		}
		if t.done >= 0 && t.reason != "resigned" && t.reason != "connection closed" {
			h.Annotate("", c.session, t.done, t.done, "term lost: "+t.reason)
		}
		switch {
		case t.reason == "released":
			// The client ends a term so when a newer term of its campaign
			// begins without a lost event; the candidates release nothing.
			rep.Violations = append(rep.Violations, lockcheck.Violation{Name: c.name, Check: "leader-events", At: t.done,
				Detail: fmt.Sprintf("term #%d (campaign #%d, agent %d, token %d) ended without a lost event: another term of its campaign began",
					t.seq, c.seq, c.agent, t.token)})
		case r.strict != nil && strings.HasPrefix(lt.How, "lost"):
			rep.Violations = append(rep.Violations, lockcheck.Violation{Name: c.name, Check: "fault-free", At: t.done,
				Detail: fmt.Sprintf("term #%d (campaign #%d, agent %d) %s in a fault-free run", t.seq, c.seq, c.agent, lt.How)})
		}
		terms = append(terms, lt)
	}
	rep.Violations = append(rep.Violations, lockcheck.CheckLeaders(terms, r.cfg.Slack)...)

	// From a term's end to the next election of the name, by what ended it;
	// the ends backdated to an agent stop or a client pause say nothing of
	// the handover's speed.
	byName := map[string][]lockcheck.Term{}
	for _, t := range terms {
		byName[t.Name] = append(byName[t.Name], t)
	}
	for _, ts := range byName {
		slices.SortFunc(ts, func(a, b lockcheck.Term) int { return cmp.Compare(a.Start, b.Start) })
		for i := 1; i < len(ts); i++ {
			p := ts[i-1]
			if p.End == lockcheck.Infinity || p.End > ts[i].Start || strings.Contains(p.How, "stopped") || strings.Contains(p.How, "paused") {
				continue
			}
			kind := "cut"
			switch {
			case strings.HasPrefix(p.How, "lost"):
				kind = "lost"
			case p.How == "resigned":
				kind = "resigned"
			}
			d := time.Duration(ts[i].Start - p.End)
			handovers[kind] = append(handovers[kind], d)
			handovers[""] = append(handovers[""], d)
		}
	}
	rep.Handover, rep.HandoverAfter = -1, map[string]time.Duration{}
	for kind, ds := range handovers {
		slices.Sort(ds)
		if kind == "" {
			rep.Handover = ds[len(ds)/2]
		} else {
			rep.HandoverAfter[kind] = ds[len(ds)/2]
		}
	}

	// The leaders' counters: the fenced ones lose nothing.
	for _, n := range r.leaderNames {
		rep.Violations = append(rep.Violations, checkFenced(n, r.fenced[n], spans[n])...)
		p := r.plain[n]
		rep.LeaderPlainIncrements += p.increments
		rep.LeaderPlainLost += p.increments - p.value
		if r.strict != nil && p.value != p.increments {
			rep.Violations = append(rep.Violations, lockcheck.Violation{Name: n, Check: "fault-free", Detail: fmt.Sprintf(
				"the leaders' unfenced counter is %d after %d increments: two leaders at once", p.value, p.increments)})
		}
	}
}
