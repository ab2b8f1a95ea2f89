package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"github.com/lockagent/lockagent/backend"
)

// Denial reasons of an acquire.
const (
	ReasonHeld    = "held"
	ReasonTimeout = "timeout"
)

// WaitForever as AcquireRequest.Wait waits until granted, cancelled or the
// connection ends.
const WaitForever time.Duration = -1

// maxPoll bounds the time between two attempts of a waiter that heard no
// notification: the backstop if one is lost.
const maxPoll = time.Second

// deniedInspectTimeout bounds the wait for the holders of a denial.
const deniedInspectTimeout = 2 * time.Second

// unavailableBackoff is how soon a waiting acquire asks again after the
// backend was unavailable; it doubles with each failure, up to maxPoll.
const unavailableBackoff = 50 * time.Millisecond

// AcquireRequest is the arguments of acquire.
type AcquireRequest struct {
	Name  string
	Mode  backend.Mode
	Limit int // shared only: at most Limit shared holders; 0: no limit
	Scope Scope
	TTL   time.Duration // 0: the default
	Wait  time.Duration // 0: try once; > 0: wait up to Wait; WaitForever
	Meta  string
	// Granted, if set, is called with the new lease with the agent's lock
	// held, before any event of the lease can be sent. It must not block.
	Granted func(Lease)
	// Answered, if set, is called with the outcome of a waiting acquire
	// (its grant, after Granted) as a step of the handover's gate (see
	// Freeze): an agent frozen, and handed over, has either answered a
	// waiter or kept it, for the new process to answer. It must not block.
	Answered func(AcquireResult, error)
	// Conn, if set, is the connection asking. Once another connection
	// has taken the session over (a resume), its acquires are refused as
	// cancelled, not made the new connection's.
	Conn Conn
}

// AcquireResult is the answer of acquire: a lease, or a denial with its
// reason and the holders at that moment.
type AcquireResult struct {
	Acquired bool
	Lease    Lease
	Reason   string // ReasonHeld or ReasonTimeout when not acquired
	Holders  []backend.Holder
}

// ValidateName checks a lock name: 1–256 bytes of UTF-8 without whitespace,
// control or format characters.
func ValidateName(name string) error {
	if name == "" || len(name) > MaxNameBytes {
		return fmt.Errorf("%w: a name is 1 to %d bytes", ErrInvalidName, MaxNameBytes)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("%w: a name is UTF-8", ErrInvalidName)
	}
	for _, r := range name {
		if r > ' ' && r < 0x7f {
			continue // printable ASCII, the common case
		}
		if unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zs, unicode.Zl, unicode.Zp) {
			return fmt.Errorf("%w: %U is not allowed in a name", ErrInvalidName, r)
		}
	}
	return nil
}

func (a *Agent) validateAcquire(req *AcquireRequest) error {
	if err := ValidateName(req.Name); err != nil {
		return err
	}
	if req.Limit < 0 || req.Limit > MaxLimit || (req.Limit > 0 && req.Mode != backend.Shared) {
		return &ArgError{Arg: ArgLimit, Rule: fmt.Sprintf("must be a positive integer up to %d, with mode shared", MaxLimit)}
	}
	if req.TTL == 0 {
		req.TTL = a.cfg.DefaultTTL
	}
	if req.TTL < a.cfg.MinTTL || req.TTL > a.cfg.MaxTTL {
		return &ArgError{Arg: ArgTTL, Min: a.cfg.MinTTL, Max: a.cfg.MaxTTL}
	}
	if req.Wait < 0 && req.Wait != WaitForever {
		return &ArgError{Arg: ArgWait, Rule: "must be WaitForever, 0 or positive"}
	}
	if len(req.Meta) > MaxMetaBytes || !utf8.ValidString(req.Meta) {
		return &ArgError{Arg: ArgMeta, Rule: fmt.Sprintf("must be UTF-8 of at most %d bytes", MaxMetaBytes)}
	}
	return nil
}

// queue is the local first-come-first-served line of waiters for one name.
type queue struct {
	waiters []*waiter
}

// waiter is one acquire in progress.
type waiter struct {
	s     *Session
	req   AcquireRequest
	camp  *campaign // the campaign it is for, or nil
	since time.Time
	// attached is the session's detach count when the acquire began: an
	// acquire (not a campaign's) is given up once its connection is gone
	// (see superseded).
	attached int
	queued   bool          // in the name's queue (a waiting acquire, not a try)
	ticket   string        // its place in the backend's queue, when queued; its key (see Pending.Key)
	until    time.Time     // when its wait ends; zero: never
	wake     chan struct{} // a value when the queue ahead changed; nil for a try
	// unknown is a queued waiter's last attempt whose outcome is unknown
	// (the backend was unavailable): the next attempt asks again with its
	// lease id, which a grant made all the same answers, and wait gives it
	// back, once, should the wait end without it. Only wait's goroutine
	// uses it.
	unknown *lease

	// Guarded by Agent.mu.
	asked   bool // it has asked the backend: its ticket may be queued there
	granted bool
	left    bool // out of its session, its queue and the counts (see forget)

	// afterRelease, for a try, is closed once the releases of the name
	// from a connection gone are done (see willRelease); nil if none.
	afterRelease chan struct{}
}

// eligible tells whether w may ask the backend: every waiter ahead of it
// on this agent has asked already. The backend's queue orders the waiters
// of every agent by their first request; this keeps the waiters of one
// agent in the order they came. a.mu is held.
func (a *Agent) eligible(w *waiter) bool {
	q := a.queues[w.req.Name]
	if q == nil {
		return false // w left (see forget)
	}
	for _, o := range q.waiters {
		if o == w {
			return true
		}
		if !o.asked {
			return false
		}
	}
	return false
}

// wakeQueue signals the waiters of name that may ask the backend for the
// first time now. a.mu is held.
func (a *Agent) wakeQueue(name string) {
	q := a.queues[name]
	if q == nil {
		return
	}
	for _, w := range q.waiters {
		w.signal()
		if !w.asked {
			break
		}
	}
}

// signal wakes w to look at its queue and session again.
func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Acquire takes a name for the session: at once, within req.Wait, or never,
// behind the waiters already queued for it on this agent. Cancelling ctx
// abandons the request (its error is ctx's).
func (s *Session) Acquire(ctx context.Context, req AcquireRequest) (AcquireResult, error) {
	p := s.place(req)
	return p.Run(ctx)
}

// Pending is an acquire whose place is taken, or that was refused: Run
// runs it to its end.
type Pending struct {
	s     *Session
	req   AcquireRequest
	start time.Time
	w     *waiter // its place, or nil
	err   error   // why it was refused, or nil
}

// Begin checks an acquire and, if it may go on, takes its place at once:
// the name pending in the session, and a waiter's place in the name's
// queue. So a connection that runs its waiting acquires in goroutines
// keeps the order it read them in. Run must then be called, once.
func (s *Session) Begin(req AcquireRequest) *Pending {
	p := s.place(req)
	return &p
}

func (s *Session) place(req AcquireRequest) Pending {
	a := s.a
	p := Pending{s: s, req: req, start: time.Now()}
	if p.err = a.validateAcquire(&p.req); p.err == nil {
		if p.err = a.allow(s.currentPeer(), p.req.Name, p.req.Mode); p.err == nil {
			p.w, p.err = s.begin(p.req, nil, p.start)
		}
	}
	return p
}

// Key names a waiting acquire in its agent's State (see Snapshot); "" for
// a try, or an acquire refused.
func (p *Pending) Key() string {
	if p.w == nil {
		return ""
	}
	return p.w.ticket
}

// Granted sets what a waiting acquire that Restore returned calls with its
// lease when it is granted (see AcquireRequest.Granted). Call it before
// Run.
func (p *Pending) Granted(f func(Lease)) {
	p.req.Granted = f
	if p.w != nil {
		p.w.req.Granted = f
	}
}

// Answered sets what a waiting acquire calls with its outcome (see
// AcquireRequest.Answered); one refused by Begin calls nothing. Call it
// before Run.
func (p *Pending) Answered(f func(AcquireResult, error)) {
	p.req.Answered = f
	if p.w != nil {
		p.w.req.Answered = f
	}
}

// Run runs the acquire to its end, as Acquire does.
func (p *Pending) Run(ctx context.Context) (res AcquireResult, err error) {
	a := p.s.a
	defer func() { a.observeAcquire(p.req.Mode, p.start, res, err) }()
	return a.run(ctx, p.req.Name, p.w, p.err)
}

// acquire runs a validated and allowed acquire, asked for at since, for
// the session itself or for one of its campaigns (camp), whose place the
// session's limit already counts.
func (s *Session) acquire(ctx context.Context, req AcquireRequest, camp *campaign, since time.Time) (AcquireResult, error) {
	w, err := s.begin(req, camp, since)
	return s.a.run(ctx, req.Name, w, err)
}

// errBehindWaiters refuses a try while waiters queue for its name.
var errBehindWaiters = errors.New("agent: waiters queue for the name")

// begin takes the place of a validated and allowed acquire (see acquire)
// and returns its waiter, or refuses it.
func (s *Session) begin(req AcquireRequest, camp *campaign, since time.Time) (*waiter, error) {
	a := s.a
	w := &waiter{s: s, req: req, camp: camp, since: since, queued: req.Wait != 0}
	if w.queued {
		// Only a queued waiter is woken: a try's signals go nowhere.
		w.ticket = newID("q_")
		w.wake = make(chan struct{}, 1)
	}
	if req.Wait > 0 {
		w.until = since.Add(req.Wait)
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	w.attached = s.detaches
	busy, replaces := s.pendingFor(req.Name)
	// A campaign's first attempt takes over the place the campaign
	// reserved in its uid's count.
	reserved := 0
	if camp != nil && camp.reserved {
		reserved = 1
	}
	switch {
	case a.closing:
		return nil, ErrShuttingDown
	case s.ended:
		return nil, ErrSessionEnded
	case req.Conn != nil && req.Conn != s.conn:
		return nil, context.Canceled
	case s.leases[req.Name] != nil:
		return nil, &AlreadyHeldError{Lease: s.leases[req.Name].public()}
	case camp == nil && s.campaigns[req.Name] != nil:
		return nil, invalidArg("the session campaigns for %q: resign first", req.Name)
	case busy:
		return nil, invalidArg("an acquire of %q is already in progress in this session", req.Name)
	case camp == nil && s.held()-replaces >= a.cfg.MaxLeasesPerSession:
		return nil, fmt.Errorf("%w: %d leases per session", ErrLimitExceeded, a.cfg.MaxLeasesPerSession)
	case a.cfg.MaxLeasesPerUID > 0 && a.perUID[s.uid]-replaces-reserved >= a.cfg.MaxLeasesPerUID:
		return nil, fmt.Errorf("%w: %d leases per uid", ErrLimitExceeded, a.cfg.MaxLeasesPerUID)
	}
	q := a.queues[req.Name]
	if !w.queued && q != nil {
		return nil, errBehindWaiters // a try never jumps ahead of queued waiters
	}
	if g := a.gone[req.Name]; g != nil && !w.queued {
		w.afterRelease = g.done
	}
	if w.queued {
		if a.waiters >= a.cfg.MaxWaiters {
			return nil, fmt.Errorf("%w: %d waiters", ErrLimitExceeded, a.cfg.MaxWaiters)
		}
		if q == nil {
			q = &queue{}
			a.queues[req.Name] = q
		}
		q.waiters = append(q.waiters, w)
		a.waiters++
	}
	s.pending.put(w)
	if reserved == 1 {
		camp.reserved = false
	} else {
		a.perUID[s.uid]++
	}
	// Run waits for acquires in flight (closing is false here, under
	// a.mu), so that a grant that lands during shutdown is released before
	// the backend closes.
	a.wg.Add(1)
	return w, nil
}

// run runs to its end an acquire of name whose place begin took (w), or
// answers its refusal (err).
func (a *Agent) run(ctx context.Context, name string, w *waiter, err error) (AcquireResult, error) {
	switch {
	case errors.Is(err, errBehindWaiters):
		return a.denied(ctx, name, ReasonHeld), nil
	case err != nil:
		return AcquireResult{}, err
	}
	defer a.wg.Done()
	res, err := a.runPlaced(ctx, name, w)
	// The waiter leaves, and its outcome is told, in one step: a frozen
	// agent's snapshot still has the waiter of an outcome untold.
	a.enter()
	defer a.exit()
	a.leave(w)
	if w.req.Answered != nil {
		w.req.Answered(res, err)
	}
	return res, err
}

// runPlaced runs an acquire whose place begin took.
func (a *Agent) runPlaced(ctx context.Context, name string, w *waiter) (AcquireResult, error) {
	if !w.queued {
		if w.afterRelease != nil {
			select {
			case <-w.afterRelease:
			case <-ctx.Done():
				return AcquireResult{}, ctx.Err()
			}
		}
		l, _, err := a.attempt(ctx, w, time.Time{})
		switch {
		case err != nil:
			return AcquireResult{}, err
		case l == nil:
			return a.denied(ctx, name, ReasonHeld), nil
		}
		return AcquireResult{Acquired: true, Lease: l.public()}, nil
	}
	return a.wait(ctx, w)
}

// wait runs a queued acquire to its end.
func (a *Agent) wait(ctx context.Context, w *waiter) (AcquireResult, error) {
	var timeout <-chan time.Time
	until := w.until
	if !until.IsZero() {
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		timeout = t.C
	}
	var freed <-chan struct{} // the backend's notifications, once eligible
	poll := time.NewTimer(time.Hour)
	defer poll.Stop()
	var failed error // the last attempt's, while the backend is unavailable
	var retryAt time.Time
	backoff := unavailableBackoff
	defer func() {
		if w.unknown != nil {
			a.mu.Lock()
			a.releaseLater([]*lease{w.unknown})
			a.mu.Unlock()
		}
	}()
	for {
		a.mu.Lock()
		ok := a.eligible(w)
		ended, closing, left, peer := w.s.ended, a.closing, w.left, w.s.currentPeer()
		a.mu.Unlock()
		switch {
		case closing:
			return AcquireResult{}, ErrShuttingDown
		case ended:
			return AcquireResult{}, ErrSessionEnded
		case left:
			return AcquireResult{}, errSuperseded // see forget
		}
		if ok && w.camp != nil {
			// A campaign's term is granted under the rules of the moment,
			// also to a campaign that queued before a reload.
			if err := a.allow(peer, w.req.Name, backend.Exclusive); err != nil {
				return AcquireResult{}, err
			}
		}
		if ok && failed != nil && time.Now().Before(retryAt) {
			// Backing off after an outage: woken early (the queue ahead
			// changed, a notification), it asks again only at retryAt.
			poll.Reset(time.Until(retryAt))
		} else if ok {
			if freed == nil {
				ch, stop, err := a.b.Watch(ctx, w.req.Name, w.ticket)
				if err != nil {
					a.called("acquire", err)
					return AcquireResult{}, a.ctxErr(ctx, fmt.Errorf("watch %s: %w", w.req.Name, err))
				}
				defer stop()
				freed = ch
			}
			asked := time.Now()
			l, retryIn, err := a.attempt(ctx, w, until)
			a.mu.Lock()
			if !w.asked {
				// Its ticket is in the backend's queue: the next local
				// waiter may take its place behind it.
				w.asked = true
				a.wakeQueue(w.req.Name)
			}
			a.mu.Unlock()
			switch {
			case errors.Is(err, errWaitOver) && failed != nil:
				return AcquireResult{}, failed
			case errors.Is(err, errWaitOver):
				return a.denied(ctx, w.req.Name, ReasonTimeout), nil
			case errors.Is(err, backend.ErrUnavailable) && ctx.Err() == nil:
				// An outage (a restart, a failover) does not end a wait:
				// the backend is asked again, backing off, until the wait
				// ends, when the acquire fails with this error. An
				// attempt left unanswered until the wait ended fails it
				// so too, whether the name was free being unknown, if
				// it had time to be answered; one sent just before the
				// end, cut short by it, says nothing of the backend.
				if !until.IsZero() && !time.Now().Before(until) {
					if failed != nil || !cutShort(asked, until, w.req.Wait) {
						return AcquireResult{}, err
					}
					return a.denied(ctx, w.req.Name, ReasonTimeout), nil
				}
				if failed == nil {
					a.cfg.PeerLog.Log(a.log, hclog.Warn, peer.UID, "waiting acquire: the backend is unavailable; asking again until the wait ends",
						"name", w.req.Name, "uid", peer.UID, "error", err)
				}
				failed = err
				retryAt = time.Now().Add(min(backoff, w.req.TTL/3))
				poll.Reset(time.Until(retryAt))
				backoff = min(2*backoff, maxPoll)
			case err != nil:
				return AcquireResult{}, err
			case l != nil:
				return AcquireResult{Acquired: true, Lease: l.public()}, nil
			default:
				failed, backoff = nil, unavailableBackoff
				// Asking again also keeps the ticket alive in the queue.
				poll.Reset(min(max(retryIn, time.Millisecond), maxPoll, w.req.TTL/3))
			}
		}
		select {
		case <-ctx.Done():
			return AcquireResult{}, ctx.Err()
		case <-timeout:
			if failed != nil {
				return AcquireResult{}, failed
			}
			return a.denied(ctx, w.req.Name, ReasonTimeout), nil
		case <-w.wake:
		case <-freed:
		case <-poll.C:
		}
	}
}

// unansweredAfter is how long an attempt cut short by the end of its wait
// must have waited for the backend (or half the wait, if less) for the
// acquire to fail as backend_unavailable rather than time out.
const unansweredAfter = time.Second

// cutShort tells an attempt sent at sent that the end of its wait (until,
// after wait) cut short before it had time to be answered: it says
// nothing of the backend.
func cutShort(sent, until time.Time, wait time.Duration) bool {
	return !until.IsZero() && !time.Now().Before(until) && time.Since(sent) < min(unansweredAfter, wait/2)
}

// errSuperseded, a cancellation: the acquire's connection is gone, and
// another connection has the session.
var errSuperseded = fmt.Errorf("agent: the connection is gone, and a new one has the session: %w", context.Canceled)

// superseded tells whether w is being given up: an acquire of a
// connection that is gone, or the attempt of a campaign that was stopped
// (resigned, or its connection gone). An acquire or a campaign of the
// name may take its place in the session at once, rather than be refused
// as a second acquire of the name. a.mu is held.
func (w *waiter) superseded() bool {
	if w.camp != nil {
		return w.s.campaigns[w.req.Name] != w.camp
	}
	return w.attached != w.s.detaches
}

// pendingFor tells whether an acquire of name is in progress in the
// session (busy), and whether one being given up is there (see
// superseded), whose place a new acquire or campaign of name takes: it
// counts against the limits no more (replaces is 1, else 0). a.mu is
// held.
func (s *Session) pendingFor(name string) (busy bool, replaces int) {
	o := s.pending.get(name)
	switch {
	case o == nil:
		return false, 0
	case o.superseded():
		return false, 1
	}
	return true, 0
}

// errWaitOver: an attempt was cut short by the end of its wait.
var errWaitOver = errors.New("agent: the wait is over")

// attempt asks the backend once. It returns the new lease, or nil and a
// retry hint when the name is held. The backend's answer is awaited until
// the grant's local deadline at most (a later one could not be handed out,
// and a retry sent later could grant the name to nobody), and until the
// wait ends, if until is set (then the error is errWaitOver).
func (a *Agent) attempt(ctx context.Context, w *waiter, until time.Time) (*lease, time.Duration, error) {
	a.enter()
	defer a.exit()
	s, req := w.s, w.req
	id := newID("l_")
	if w.unknown != nil {
		// See waiter.unknown: this attempt takes its place, and gives it
		// back itself on any outcome but another outage.
		id, w.unknown = w.unknown.id, nil
	}
	l := &lease{
		id: id, name: req.Name, mode: req.Mode, scope: req.Scope,
		ttl: req.TTL, meta: req.Meta, session: s, camp: w.camp, index: -1,
	}
	// The releases of the name this agent owes go first (see owe).
	a.mu.Lock()
	releases, took := a.takeOwed(req.Name)
	a.mu.Unlock()
	sent := time.Now()
	// Until the grant's answer says better: a grant whose answer is lost
	// is released, with retries, until then (see retryRelease).
	l.validUntil = sent.Add(req.TTL - a.margin(req.TTL))
	deadline := l.validUntil
	if !until.IsZero() {
		deadline = earliest(deadline, until)
	}
	g, err := a.b.Acquire(ctx, backend.AcquireRequest{
		Name: req.Name, LeaseID: l.id, Mode: req.Mode, Limit: req.Limit,
		TTL: req.TTL, Meta: req.Meta, Host: a.cfg.Host, Ticket: w.ticket, Deadline: deadline,
		Releases: releases,
	})
	if len(took) > 0 {
		a.mu.Lock()
		a.settleTaken(took, err)
		a.mu.Unlock()
	}
	if !errors.Is(err, backend.ErrUnavailable) || !cutShort(sent, until, req.Wait) {
		a.called("acquire", err)
	}
	var held *backend.HeldError
	switch {
	case errors.As(err, &held):
		w.unknown = nil // the lease id holds nothing
		return nil, held.RetryIn, nil
	case err != nil && w.queued && errors.Is(err, backend.ErrUnavailable) && ctx.Err() == nil:
		// The grant may have been made all the same (an answer lost on
		// the way): the wait asks again with its lease id, or gives it
		// back when it ends.
		w.unknown = l
		return nil, 0, fmt.Errorf("acquire %s: %w", req.Name, err)
	case err != nil:
		// The grant may have been made all the same (an answer lost on
		// the way): release it rather than leave the name blocked.
		a.mu.Lock()
		a.releaseLater([]*lease{l})
		a.mu.Unlock()
		if ctx.Err() == nil && !until.IsZero() && !time.Now().Before(until) {
			return nil, 0, errWaitOver
		}
		return nil, 0, a.ctxErr(ctx, fmt.Errorf("acquire %s: %w", req.Name, err))
	}
	w.unknown = nil // l has its id: granted, or released below
	answered := time.Now()
	l.token = g.Token
	l.granted = answered
	// A suspend of the host during the round trip shortens the lease by as
	// much, on the monotonic clock.
	l.validUntil = sent.Add(req.TTL - a.margin(req.TTL) - max(sleptDuring(sent, answered), 0))
	l.nextRenew = sent.Add(renewInterval(req.TTL))

	a.mu.Lock()
	defer a.mu.Unlock()
	a.awaitTold(req.Name)
	now := time.Now()
	var refuse error
	switch {
	case a.closing:
		refuse = ErrShuttingDown
	case s.ended:
		refuse = ErrSessionEnded
	case ctx.Err() != nil:
		refuse = ctx.Err()
	case s.pending.get(req.Name) != w:
		refuse = errSuperseded
	case !now.Before(l.validUntil):
		// The answer came too late to be handed out as valid.
		a.log.Warn("grant arrived after its local deadline; released", "name", req.Name, "took", answered.Sub(sent))
		a.releaseLater([]*lease{l})
		return nil, 0, nil
	}
	if refuse != nil {
		a.releaseLater([]*lease{l})
		return nil, 0, refuse
	}
	a.addLease(l)
	w.granted = true
	// The name counts as held now, no more as pending too.
	a.forget(w)
	if req.Granted != nil {
		req.Granted(l.public())
	}
	return l, 0, nil
}

// ctxErr prefers the context's error: a backend call that failed because the
// request was cancelled is a cancellation.
func (a *Agent) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// leave ends w: its ticket is taken out of the backend's queue, and w out
// of the agent's, if that was not done already.
func (a *Agent) leave(w *waiter) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.queued && w.asked && !w.granted {
		a.leaveLater(w.req.Name, w.ticket)
	}
	a.forget(w)
}

// forget takes w out of its session, its queue and the counts, and wakes
// whoever may go next: when w ends (leave), or at once when its
// connection goes (see Session.detach), so that a waiter whose goroutine
// has yet to notice neither counts against the limits nor holds up the
// queue and the tries behind it. a.mu is held.
func (a *Agent) forget(w *waiter) {
	if w.left {
		return
	}
	w.left = true
	a.uncount(w.s.uid)
	w.s.pending.remove(w)
	if !w.queued {
		return
	}
	q := a.queues[w.req.Name]
	q.waiters = slices.DeleteFunc(q.waiters, func(o *waiter) bool { return o == w })
	a.waiters--
	if len(q.waiters) == 0 {
		delete(a.queues, w.req.Name)
		return
	}
	a.wakeQueue(w.req.Name)
}

// denied builds a denial with the holders the backend reports now.
func (a *Agent) denied(ctx context.Context, name, reason string) AcquireResult {
	res := AcquireResult{Reason: reason, Holders: []backend.Holder{}}
	if ctx.Err() != nil {
		return res
	}
	// The denial is the answer; its holders are worth a short wait only.
	ctx, cancel := context.WithTimeout(ctx, deniedInspectTimeout)
	defer cancel()
	info, err := a.b.Inspect(ctx, name)
	a.note(err)
	if err == nil {
		res.Holders = info.Holders
	}
	return res
}
