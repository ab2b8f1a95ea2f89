package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit/lockcheck"
)

const (
	// callSlack is how long past its wait_ms an acquire may take before
	// its outcome is unknown; releases and hellos get as long.
	callSlack = 5 * time.Second
	// longHoldPercent of the holds last seconds rather than milliseconds,
	// so that a holder whose agent is stopped, or whose lease Redis lost,
	// is still at work when another holder is granted the name.
	longHoldPercent = 20
	// heartbeat is the heartbeat_ms of half the clients, and pingEvery how
	// often they ping: such a client paused longer than the heartbeat
	// loses its connection, and its locks, while it sleeps (docs/testing.md A3).
	heartbeat = time.Second
	pingEvery = heartbeat / 4
)

// outcome of an operation, as its client saw it.
type outcome uint8

const (
	none    outcome = iota // not invoked
	ok                     // answered: granted, released
	failed                 // answered: denied, refused (an error code)
	unknown                // no answer: the call timed out or the connection died
)

func (o outcome) String() string {
	return [...]string{"none", "ok", "fail", "unknown"}[o]
}

// opRec is one acquire and, if granted, what its holder did with it. Only
// its worker writes it; it is read after the workers have finished.
type opRec struct {
	seq     int // the lease number, unique in the run
	worker  int
	session int
	agent   int
	name    string
	ttl     int
	wait    int

	call, ret int64
	outcome   outcome
	code      string // denial reason or error
	token     uint64
	leaseID   string

	relCall, relRet int64
	relOutcome      outcome
	relCode         string

	fencedWrites, rejected, plainWrites int
}

// sessRec is one connection to an agent (one session).
type sessRec struct {
	id, worker, agent int
	opened, ended     int64 // ended: -1 while open
	how               string
}

// pauseRec is a pause of a client, by the client-pause fault.
type pauseRec struct {
	session    int
	start, end int64
}

// lostEvent is a `lost` event as received.
type lostEvent struct {
	session int
	lease   string
	name    string
	token   uint64
	reason  string
	at      int64
}

// worker is one client application: it keeps a session with its agent and
// loops acquire, work under the lock, release.
type worker struct {
	r     *run
	id    int
	agent *agent
	rng   *rand.Rand

	killReq  atomic.Bool  // the client-kill fault asked it to drop its connection
	pauseReq atomic.Int64 // the client-pause fault asked it to pause this long
	paused   atomic.Bool  // it is paused: it does not even ping
}

// session is a worker's connection.
type session struct {
	rec  *sessRec
	c    *client.Client
	done chan struct{} // closed when the connection has ended and its events are read

	mu   sync.Mutex
	lost map[string]bool // lease ids reported lost
}

func (s *session) ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (s *session) isLost(lease string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost[lease]
}

// sleep sleeps d unless the run stops first.
func (w *worker) sleep(d time.Duration) {
	select {
	case <-time.After(d):
	case <-w.r.stop:
	}
}

func (w *worker) ms(lo, hi int) time.Duration {
	return time.Duration(lo+w.rng.IntN(hi-lo+1)) * time.Millisecond
}

func (w *worker) loop() {
	for !w.r.stopped() {
		s := w.connect()
		if s == nil {
			w.sleep(w.ms(50, 200))
			continue
		}
		for !w.r.stopped() && !s.ended() && w.cycle(s) {
		}
		w.r.closeSession(s, "closed")
	}
}

// connect opens a session with the worker's agent, or returns nil.
func (w *worker) connect() *session {
	ctx, cancel := context.WithTimeout(context.Background(), callSlack)
	defer cancel()
	c, err := client.Dial(ctx, w.agent.socket)
	if err != nil {
		return nil
	}
	opened := w.r.now()
	hello := map[string]any{"version": 1, "client": fmt.Sprintf("chaos-%d", w.id)}
	if w.heartbeat() {
		hello["heartbeat_ms"] = heartbeat.Milliseconds()
	}
	if err := c.Call(ctx, "hello", hello, nil); err != nil {
		c.Close()
		return nil
	}
	r := w.r
	r.mu.Lock()
	rec := &sessRec{id: len(r.sessions), worker: w.id, agent: w.agent.idx, opened: opened, ended: -1}
	r.sessions = append(r.sessions, rec)
	r.mu.Unlock()
	s := &session{rec: rec, c: c, done: make(chan struct{}), lost: map[string]bool{}}
	go r.readEvents(s)
	if w.heartbeat() {
		go w.ping(s)
	}
	return s
}

// heartbeat tells whether the worker's sessions have a heartbeat: half of
// them do, so that both an agent that drops a silent connection and one
// that keeps it are exercised.
func (w *worker) heartbeat() bool { return w.id%2 == 0 }

// ping keeps the session's heartbeat while the worker is not paused.
func (w *worker) ping(s *session) {
	t := time.NewTicker(pingEvery)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		if w.paused.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), heartbeat)
		_ = s.c.Call(ctx, "ping", nil, nil)
		cancel()
	}
}

// readEvents records the session's events until its connection ends.
func (r *run) readEvents(s *session) {
	defer close(s.done)
	for ev := range s.c.Events() {
		at := r.now()
		switch ev.Event {
		case "lost":
			if ev.Campaign != "" {
				// A term of a campaign the client had abandoned (its
				// call timed out): the session is being dropped.
				break
			}
			s.mu.Lock()
			s.lost[ev.Lease] = true
			s.mu.Unlock()
			r.mu.Lock()
			r.lost = append(r.lost, lostEvent{session: s.rec.id, lease: ev.Lease, name: ev.Name, token: ev.Token, reason: ev.Reason, at: at})
			r.mu.Unlock()
		case "backend":
			r.mu.Lock()
			r.backendEvs++
			r.mu.Unlock()
		}
	}
	r.mu.Lock()
	if s.rec.ended < 0 {
		s.rec.ended, s.rec.how = r.now(), "eof"
	}
	r.mu.Unlock()
}

// closeSession closes a session's connection, recording when and why
// first: from then on its holder holds nothing.
func (r *run) closeSession(s *session, how string) {
	r.mu.Lock()
	if s.rec.ended < 0 {
		s.rec.ended, s.rec.how = r.now(), how
	}
	r.mu.Unlock()
	s.c.Close()
	<-s.done
}

// acquireResult is acquire's answer.
type acquireResult struct {
	Acquired bool   `json:"acquired"`
	Lease    string `json:"lease"`
	Token    uint64 `json:"token"`
	Reason   string `json:"reason"`
}

// classify turns a call's error into an outcome and a code.
func classify(err error) (outcome, string) {
	var apiErr *client.Error
	switch {
	case err == nil:
		return ok, ""
	case errors.As(err, &apiErr):
		return failed, apiErr.Code
	default:
		return unknown, err.Error()
	}
}

// cycle makes one acquire and, if granted, works under the lock and
// releases it. It returns false when the session must be dropped.
func (w *worker) cycle(s *session) bool {
	r := w.r
	op := &opRec{
		worker: w.id, session: s.rec.id, agent: w.agent.idx,
		name: r.names[w.rng.IntN(len(r.names))],
		ttl:  1000 + w.rng.IntN(1001), wait: 100 + w.rng.IntN(1401),
		relCall: -1, relRet: -1,
	}
	r.mu.Lock()
	op.seq = len(r.ops) + 1
	r.ops = append(r.ops, op)
	r.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(op.wait)*time.Millisecond+callSlack)
	var res acquireResult
	var scall int64
	if r.strict != nil {
		scall = r.strict.Now()
	}
	op.call = r.now()
	err := s.c.Call(ctx, "acquire", map[string]any{"name": op.name, "ttl_ms": op.ttl, "wait_ms": op.wait}, &res)
	op.ret = r.now()
	cancel()
	op.outcome, op.code = classify(err)
	if op.outcome == ok && !res.Acquired {
		op.outcome, op.code = failed, res.Reason
	}
	op.token, op.leaseID = res.Token, res.Lease
	if r.strict != nil {
		if op.outcome == unknown || (op.outcome == failed && op.code != "timeout" && op.code != "held") {
			r.unexpectedError(op.ret, op.name, fmt.Sprintf("acquire #%d on agent %d: %s %s", op.seq, op.agent, op.outcome, op.code))
		}
		if op.outcome != unknown {
			r.strict.Add(scall, lockcheck.Input{Kind: lockcheck.Acquire, Name: op.name, Client: s.rec.id},
				lockcheck.Output{OK: op.outcome == ok, Token: op.token})
		}
	}
	switch op.outcome {
	case unknown:
		return false // the agent may still grant it: drop the session
	case failed:
		if op.code != "timeout" && op.code != "held" {
			w.sleep(w.ms(20, 100))
		}
		return true
	}
	return w.hold(s, op)
}

// hold works under a granted lease, then releases it.
func (w *worker) hold(s *session, op *opRec) bool {
	r := w.r
	steps := 1 + w.rng.IntN(6)
	if w.rng.IntN(100) < longHoldPercent {
		steps = 40 + w.rng.IntN(80)
	}
	fc, pc := r.fenced[op.name], r.plain[op.name]
	for range steps {
		if r.stopped() || s.ended() || s.isLost(op.leaseID) {
			break
		}
		if w.killReq.Swap(false) {
			r.note("client %d killed (its connection closed) holding %s lease #%d on agent %d", w.id, op.name, op.seq, op.agent)
			r.closeSession(s, "killed")
			return false
		}
		if w.update(s, fc, pc, op.token, op.seq, fmt.Sprintf("%s lease #%d", op.name, op.seq)) {
			op.fencedWrites++
		} else {
			op.rejected++
		}
		op.plainWrites++
		time.Sleep(w.ms(10, 50))
	}
	if s.ended() {
		return false
	}
	// A lost lease is released all the same: the agent must answer
	// not_held.
	ctx, cancel := context.WithTimeout(context.Background(), callSlack)
	defer cancel()
	var res struct {
		Released bool `json:"released"`
	}
	var scall int64
	if r.strict != nil {
		scall = r.strict.Now()
	}
	op.relCall = r.now()
	err := s.c.Call(ctx, "release", map[string]any{"lease": op.leaseID}, &res)
	op.relRet = r.now()
	op.relOutcome, op.relCode = classify(err)
	switch {
	case op.relOutcome == ok && !res.Released:
		op.relOutcome, op.relCode = unknown, "released false"
	case op.relOutcome == failed && op.relCode != "not_held":
		op.relOutcome = unknown // not an answer about the lease
	}
	if r.strict != nil {
		if op.relOutcome != ok {
			r.unexpectedError(op.relRet, op.name, fmt.Sprintf("release #%d on agent %d: %s %s", op.seq, op.agent, op.relOutcome, op.relCode))
		}
		if op.relOutcome != unknown {
			r.strict.Add(scall, lockcheck.Input{Kind: lockcheck.Release, Name: op.name, Client: s.rec.id},
				lockcheck.Output{OK: op.relOutcome == ok})
		}
	}
	return op.relOutcome != unknown
}

// update makes the same read-modify-write on both counters, fenced by
// token and not, as lease number seq (what names it in the timeline), and
// reports whether the fenced write was accepted. The client-pause fault
// strikes between the read and the write.
func (w *worker) update(s *session, fc *fencedCounter, pc *plainCounter, token uint64, seq int, what string) bool {
	r := w.r
	fv, fok := fc.read(token)
	pv := pc.read()
	time.Sleep(w.ms(1, 5))
	if d := time.Duration(w.pauseReq.Swap(0)); d > 0 {
		// A pause of the application (a GC, a swap storm) between its
		// check and its write: the classic case for fencing.
		r.note("client %d paused %v holding %s, mid-update", w.id, d, what)
		w.paused.Store(true)
		start := r.now()
		time.Sleep(d)
		w.paused.Store(false)
		r.mu.Lock()
		r.pauses = append(r.pauses, pauseRec{session: s.rec.id, start: start, end: r.now()})
		r.mu.Unlock()
		r.note("client %d resumed, writing its update (%s)", w.id, what)
	}
	accepted := fok && fc.write(token, fv+1, seq, r.now())
	pc.write(pv + 1)
	return accepted
}

// unexpectedError records an error in a fault-free run, where none may
// happen.
func (r *run) unexpectedError(at int64, name, detail string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unexpected = append(r.unexpected, lockcheck.Violation{Name: name, Check: "fault-free", At: at, Detail: detail})
}
