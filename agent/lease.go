package agent

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/lockagent/lockagent/backend"
)

// Lease is a granted lock, as a session sees it.
type Lease struct {
	ID    string
	Name  string
	Mode  backend.Mode
	Scope Scope
	Token uint64
	TTL   time.Duration
}

// lease is the agent's record of a grant. Its fields camp and granted, and
// those of its renewals (validUntil to index), are guarded by Agent.mu.
//
// What every renewal reads and writes comes first, within 128 bytes: with
// 100,000 leases scattered in memory, a renewal touches two cache lines of
// its lease (the runtime puts a lease of 192 bytes at the start of one)
// instead of three.
type lease struct {
	id   string
	name string
	mode backend.Mode
	ttl  time.Duration

	// validUntil is the local deadline: the send time of the last successful
	// renewal (or of the acquire) + ttl - margin, on the monotonic clock.
	// At validUntil the lease is lost unless a newer renewal succeeded.
	validUntil time.Time
	nextRenew  time.Time
	renewing   bool // a renewal is in flight
	atRisk     bool // the last renewal's outcome is unknown
	index      int  // in Agent.sched; -1 when not there

	scope   Scope
	token   uint64
	meta    string
	session *Session
	camp    *campaign // the campaign whose term this lease is, or nil
	granted time.Time
}

func (l *lease) public() Lease {
	return Lease{ID: l.id, Name: l.name, Mode: l.mode, Scope: l.scope, Token: l.token, TTL: l.ttl}
}

// due is when the scheduler must next look at the lease: its next renewal,
// or, while one is in flight, its local deadline.
func (l *lease) due() time.Time {
	if l.renewing {
		return l.validUntil
	}
	return l.nextRenew
}

// reschedule puts l in its place in the schedule after its due time
// changed. a.mu is held.
func (a *Agent) reschedule(l *lease) { a.sched.fix(l) }

// renewInterval is about a third of the TTL, with ±10% jitter so that
// leases granted together spread out.
func renewInterval(ttl time.Duration) time.Duration {
	third := ttl / 3
	return third - third/10 + rand.N(third/5+1)
}

// addLease records a grant. a.mu is held.
func (a *Agent) addLease(l *lease) {
	a.leases[l.id] = l
	if l.session.leases == nil {
		l.session.leases = make(map[string]*lease)
	}
	l.session.leases[l.name] = l
	a.perUID[l.session.uid]++
	a.sched.push(l)
	if l.due().Before(a.nextWake) {
		a.kickScheduler()
	}
}

// key is l's key in the backend.
func (l *lease) key() backend.LeaseKey {
	return backend.LeaseKey{Name: l.name, LeaseID: l.id, Mode: l.mode}
}

// dropLease forgets a lease and wakes the local waiters for its name. It
// does not touch the backend. a.mu is held.
func (a *Agent) dropLease(l *lease) {
	if a.leases[l.id] != l {
		return
	}
	delete(a.leases, l.id)
	a.uncount(l.session.uid)
	if l.session.leases[l.name] == l {
		delete(l.session.leases, l.name)
	}
	if l.index >= 0 {
		a.sched.remove(l)
	}
	if l.atRisk {
		a.atRisk-- // l keeps its flag: lose reads it for the reason
		if a.atRisk == 0 && a.degraded {
			// The last lease at risk is gone (lost, released): the
			// scheduler says so, after this lease's own events.
			a.kickScheduler()
		}
	}
	if l.camp != nil {
		l.camp.termEnded(l)
	}
	a.wakeQueue(l.name)
}

// lose ends a lease the agent can no longer assume held: the session is told
// first, then the lease is released in the background in case the backend
// still has it. a.mu is held.
func (a *Agent) lose(l *lease, reason string) {
	if a.dropLost(l, reason) {
		a.releaseLater([]*lease{l})
	}
}

// dropLost drops a lost lease and tells its session, leaving the backend to
// the caller. It reports whether the lease was still there. a.mu is held.
func (a *Agent) dropLost(l *lease, reason string) bool {
	if a.leases[l.id] != l {
		return false
	}
	a.dropLease(l)
	a.log.Info("lease lost", "name", l.name, "lease", l.id, "token", l.token, "reason", reason, "session", l.session.id)
	if o := a.cfg.Observer; o != nil {
		o.Lost(reason)
	}
	ev := Event{Kind: EventLost, Lease: l.id, Name: l.name, Token: l.token, Reason: reason}
	if l.camp != nil {
		ev.Campaign = l.camp.id
	}
	l.session.send(ev)
	if c := l.session.conn; c != nil {
		a.told(l.name, c)
	}
	return true
}

// telling is the lost events of a name's holders on their way to the
// holders' connections.
type telling struct {
	until   time.Time         // when grants of the name stop waiting for them
	written []<-chan struct{} // closed once each connection has written its event
}

// told notes that the holder of a lease of name on conn was just told it
// lost the lease: the next grant of name waits until conn has written the
// event, NotifyBudget at most (see awaitTold), so that the holder hears of
// its loss before anybody else can hear of the name's grant. a.mu is held.
func (a *Agent) told(name string, conn Conn) {
	now := time.Now()
	t := a.telling[name]
	if t == nil || !now.Before(t.until) {
		t = &telling{}
		a.telling[name] = t
	}
	t.until = now.Add(a.cfg.NotifyBudget)
	t.written = append(t.written, conn.Written())
}

// awaitTold is the last step of every grant of name (see attempt), which
// follows the rule of guarantee 3: a lease is reported lost before its
// name can be granted to anybody else. Leases past their local deadline
// are lost first: an agent stopped or starved past them had no time to,
// and the backend may grant their names as they expire there. Then the
// grant waits for the lost events of name's holders on this agent to be
// written (see told). a.mu is held, and released while it waits.
func (a *Agent) awaitTold(name string) {
	for {
		now := time.Now()
		a.loseOverdue(now)
		t := a.telling[name]
		if t == nil {
			return
		}
		if !now.Before(t.until) {
			delete(a.telling, name)
			return
		}
		t.written = slices.DeleteFunc(t.written, isClosed)
		if len(t.written) == 0 {
			delete(a.telling, name)
			return
		}
		written, until := slices.Clone(t.written), t.until
		a.mu.Unlock()
		waitAll(written, until)
		a.mu.Lock()
	}
}

// forgetTold drops what grants no longer wait for. a.mu is held.
func (a *Agent) forgetTold(now time.Time) {
	for name, t := range a.telling {
		if !now.Before(t.until) {
			delete(a.telling, name)
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitAll waits until every channel is closed, or until.
func waitAll(chs []<-chan struct{}, until time.Time) {
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	for _, ch := range chs {
		select {
		case <-ch:
		case <-t.C:
			return
		}
	}
}

func (a *Agent) kickScheduler() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// A lease's renewal may be sent early, by a share 1/coalesce of its TTL
// and at most maxEarly, to go in the same batch as others due about then.
// Every early renewal is one more renewal: under a heavy load batches
// fill within a few milliseconds anyway, and maxEarly keeps the leases
// renewing at a third of their TTL on average (ttl/30 alone made 15 s
// leases renew about 5% more often).
const (
	coalesce = 30
	maxEarly = 100 * time.Millisecond
)

// LoseOverdue loses every lease whose local deadline has passed, at once.
// The scheduler does it as deadlines fall due; socketapi calls this before
// it serves a request, so that after the agent was stopped or starved
// (SIGSTOP, a swapped-out process) a request is never answered as if such
// a lease were still held, and its lost event comes first.
func (s *Session) LoseOverdue() {
	a := s.a
	// The scheduler wakes no later than the earliest due time, which is
	// at or before every local deadline: while it is not late, no deadline
	// has passed, and the agent's lock is not needed to know it.
	// time.Since reads only the monotonic clock: half the cost of Now,
	// on the path of every request.
	if time.Since(a.started) < time.Duration(a.wakeBy.Load()) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.loseOverdue(time.Now())
}

// loseOverdue loses every lease whose local deadline is at or before now.
// A lease is due no later than its deadline, so only the leases due by
// now are looked at. a.mu is held.
func (a *Agent) loseOverdue(now time.Time) {
	if a.sched.len() == 0 || a.sched.next().After(now) {
		return
	}
	for _, l := range a.sched.dueBy(now, nil) {
		if !now.Before(l.validUntil) {
			a.lose(l, lostReason(l))
		}
	}
}

// lostReason is why a lease reached its local deadline: the backend's
// doing when a renewal is unanswered or failed; otherwise the agent itself
// was late (stopped or starved). a.mu is held.
func lostReason(l *lease) string {
	if l.atRisk || l.renewing {
		return ReasonBackendUnavailable
	}
	return ReasonExpired
}

// scheduleLoop renews leases as they fall due, in batches, and loses those
// whose local deadline passes, until ctx is done.
func (a *Agent) scheduleLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	a.mu.Lock()
	a.lastSeen = a.now()
	a.mu.Unlock()
	for {
		a.mu.Lock()
		for a.frozen { // see Freeze: no renewal starts
			a.stepped.Wait()
		}
		st := a.now()
		now := st.mono
		if slept := st.suspendedSince(a.lastSeen); slept > suspendThreshold {
			a.resumed(slept)
		}
		a.lastSeen = st
		a.forgetTold(now)
		if a.atRisk == 0 {
			a.setDegraded(false)
		}
		var healthy, atRisk []*lease
		for a.sched.len() > 0 {
			l := a.sched.top()
			if !now.Before(l.validUntil) {
				a.lose(l, lostReason(l))
				continue
			}
			early := min(l.ttl/coalesce, maxEarly)
			if l.atRisk {
				early = 0 // retried on their own schedule, never sooner
			}
			if l.renewing || l.nextRenew.After(now.Add(early)) {
				break
			}
			l.renewing = true
			a.reschedule(l)
			if l.atRisk {
				atRisk = append(atRisk, l)
			} else {
				healthy = append(healthy, l)
			}
		}
		wait := time.Hour
		if a.sched.len() > 0 {
			wait = min(a.sched.next().Sub(now), suspendCheck)
		}
		a.nextWake = now.Add(wait)
		a.wakeBy.Store(int64(a.nextWake.Sub(a.started)))
		// Leases at risk have near deadlines, and their batch is bounded
		// by them: they go apart, so as not to cut the others' short.
		type renewal struct {
			batch    []*lease
			deadline time.Time
		}
		var renewals []renewal
		for _, batch := range [][]*lease{healthy, atRisk} {
			if len(batch) > 0 {
				renewals = append(renewals, renewal{batch, renewDeadline(batch, now)})
			}
		}
		// Each batch is a step of the handover's gate (see Freeze).
		a.steps += len(renewals)
		a.mu.Unlock()

		for _, r := range renewals {
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				defer a.exit()
				parts := a.parts(r.batch)
				var partsWG sync.WaitGroup
				for _, batch := range parts[1:] {
					partsWG.Go(func() { a.renew(ctx, batch, r.deadline) })
				}
				a.renew(ctx, parts[0], r.deadline)
				partsWG.Wait()
			}()
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-a.kick:
		}
	}
}

// parts splits a batch of renewals by the backend's parts (see
// backend.Parted), in order; most often there is one, and no copy.
func (a *Agent) parts(batch []*lease) [][]*lease {
	p, ok := a.b.(backend.Parted)
	if !ok || len(batch) < 2 {
		return [][]*lease{batch}
	}
	first := p.Part(batch[0].name)
	var byPart map[string][]*lease
	var order []string
	for i, l := range batch[1:] {
		part := p.Part(l.name)
		if byPart == nil {
			if part == first {
				continue
			}
			byPart = map[string][]*lease{first: slices.Clone(batch[:i+1])}
			order = append(order, first)
		}
		if byPart[part] == nil {
			order = append(order, part)
		}
		byPart[part] = append(byPart[part], l)
	}
	if byPart == nil {
		return [][]*lease{batch}
	}
	parts := make([][]*lease, len(order))
	for i, part := range order {
		parts[i] = byPart[part]
	}
	return parts
}

// renewRequests holds the slices of requests of renewals done, to be used
// again: an agent renewing 100,000 leases would otherwise allocate them
// anew 20,000 times a second.
var renewRequests = sync.Pool{New: func() any { return new([]backend.RenewRequest) }}

// renew sends one batch of renewals and applies the answers.
// renewDeadline bounds the wait for a batch's answer: a sixth of the TTL
// at most, so that a renewal lost on a dead connection is tried again (at
// ttl/10) while the lease is still valid; and never past the earliest
// local deadline, when the answer would come too late to count. a.mu is
// held: resumed moves the local deadlines.
func renewDeadline(batch []*lease, now time.Time) time.Time {
	deadline := batch[0].validUntil
	for _, l := range batch {
		deadline = earliest(deadline, l.validUntil, now.Add(l.ttl/6))
	}
	return deadline
}

func (a *Agent) renew(ctx context.Context, batch []*lease, deadline time.Time) {
	p := renewRequests.Get().(*[]backend.RenewRequest)
	reqs := slices.Grow((*p)[:0], len(batch))[:len(batch)]
	defer func() {
		clear(reqs) // the strings they point to
		*p = reqs
		renewRequests.Put(p)
	}()
	sent := time.Now()
	for i, l := range batch {
		// Fields set when the lease is granted, and never changed.
		reqs[i] = backend.RenewRequest{LeaseKey: l.key(), TTL: l.ttl}
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	errs := a.b.Renew(rctx, reqs)
	cancel()
	a.noteRenewals(errs)
	a.observeRenew(errs, time.Since(sent))
	if ctx.Err() != nil {
		return // shutting down: every lease is being released
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if sleptDuring(sent, now) > suspendThreshold {
		// The host slept during the round trip: when the renewals were
		// applied is unknown on the monotonic clock.
		for i, err := range errs {
			if err == nil {
				errs[i] = errSuspended
			}
		}
	}
	wake := false
	for i, l := range batch {
		if l.index < 0 {
			continue // released or lost meanwhile: out of the schedule
		}
		l.renewing = false
		err := errs[i]
		switch {
		case !now.Before(l.validUntil):
			// The answer came at or after the local deadline: the lease was
			// already given up, whatever the backend says. Unless the
			// backend says why, it was too slow: the reason the scheduler
			// gives a lease whose renewal is unanswered at its deadline.
			switch {
			case errors.Is(err, backend.ErrTakenOver):
				a.lose(l, ReasonTakenOver)
			case errors.Is(err, backend.ErrNotHeld):
				a.lose(l, ReasonExpired)
			default:
				a.lose(l, ReasonBackendUnavailable)
			}
			continue
		case err == nil:
			l.validUntil = sent.Add(l.ttl - a.margin(l.ttl))
			l.nextRenew = sent.Add(renewInterval(l.ttl))
			a.setAtRisk(l, false)
		case errors.Is(err, backend.ErrTakenOver):
			a.lose(l, ReasonTakenOver)
			continue
		case errors.Is(err, backend.ErrNotHeld):
			a.lose(l, ReasonExpired)
			continue
		default:
			a.setAtRisk(l, true)
			l.nextRenew = now.Add(l.ttl / 10)
			if l.nextRenew.After(l.validUntil) {
				l.nextRenew = l.validUntil
			}
			a.log.Debug("renewal failed", "name", l.name, "lease", l.id, "error", err)
		}
		a.reschedule(l)
		wake = wake || l.due().Before(a.nextWake)
	}
	a.setDegraded(a.atRisk > 0)
	if wake {
		// A lease is due before the scheduler wakes anyway (a failed
		// renewal retried at a tenth of its TTL, a short TTL); with many
		// leases, a renewed one is seldom due that soon.
		a.kickScheduler()
	}
}

// noteRenewals notes what a batch of renewals says of the backend (see
// note): reached if one of them was answered.
func (a *Agent) noteRenewals(errs []error) {
	var failed error
	for _, err := range errs {
		if !errors.Is(err, backend.ErrUnavailable) {
			a.note(err)
			return
		}
		failed = err
	}
	a.note(failed)
}

func earliest(t time.Time, more ...time.Time) time.Time {
	for _, u := range more {
		if u.Before(t) {
			t = u
		}
	}
	return t
}

// errSuspended stands for a renewal whose round trip spanned a suspend of
// the host: its outcome is treated as unknown.
var errSuspended = errors.New("agent: the host was suspended during the renewal")

// resumed adjusts every lease after the host slept for slept: their local
// deadlines, counted on a clock that did not run, come that much sooner,
// and those already past are lost. a.mu is held.
func (a *Agent) resumed(slept time.Duration) {
	a.log.Warn("the host was suspended; leases' deadlines moved accordingly", "suspended", slept)
	for _, l := range a.leases {
		l.validUntil = l.validUntil.Add(-slept)
		if l.nextRenew.After(l.validUntil) {
			l.nextRenew = l.validUntil
		}
		if l.index >= 0 {
			a.reschedule(l)
		}
	}
}

// setAtRisk records whether the last renewal of l had an unknown outcome,
// and keeps count of the leases at risk. a.mu is held.
func (a *Agent) setAtRisk(l *lease, risk bool) {
	if l.atRisk == risk {
		return
	}
	l.atRisk = risk
	if risk {
		a.atRisk++
	} else {
		a.atRisk--
	}
}

// setDegraded tells every session with leases when renewals start failing
// (a lease is at risk) and when they recover (none is). a.mu is held.
func (a *Agent) setDegraded(failed bool) {
	if failed == a.degraded {
		return
	}
	a.degraded = failed
	ev := Event{Kind: EventBackend, State: "ok", Message: "no lease is at risk: renewals recovered, or the leases at risk are gone"}
	if failed {
		ev = Event{Kind: EventBackend, State: "degraded", Message: "renewals are failing; leases stay valid until their local deadline"}
		a.log.Warn("backend degraded: renewals are failing")
	} else {
		a.log.Info("no lease is at risk any more: renewals recovered, or the leases at risk are gone")
	}
	for _, s := range a.sessions {
		if len(s.leases) > 0 {
			s.send(ev)
		}
	}
}
