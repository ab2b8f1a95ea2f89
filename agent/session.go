package agent

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/lockagent/lockagent/backend"
)

// Peer is the process at the other end of a connection, from SO_PEERCRED.
type Peer struct {
	PID    int32
	UID    uint32
	GID    uint32   // the primary group of the process
	Groups []uint32 // the groups of its uid, as the system's group database says
}

// Conn is the connection attached to a session. The agent calls it with its
// lock held, so no method may block.
type Conn interface {
	// Send queues an event. A connection that cannot keep up closes itself.
	Send(Event)
	// Close ends the connection once what is queued has been written.
	Close()
	// Written returns a channel closed once every event queued so far has
	// been written to the connection, or the connection has closed. A
	// grant of a name waits on it after the name's holder was told it lost
	// the name (see Agent.told).
	Written() <-chan struct{}
}

// Event kinds.
const (
	EventLost     = "lost"
	EventBackend  = "backend"
	EventShutdown = "shutdown"
	EventElected  = "elected"
)

// Reasons of a lost event.
const (
	ReasonExpired            = "expired"
	ReasonTakenOver          = "taken_over"
	ReasonBroken             = "broken"
	ReasonBackendUnavailable = "backend_unavailable"
)

// Event is pushed to a session's connection.
type Event struct {
	Kind     string // EventLost, EventBackend, EventShutdown or EventElected
	Campaign string // elected; lost, when the lease was a campaign's term
	Lease    string // lost, elected
	Name     string // lost, elected
	Token    uint64 // lost, elected
	Reason   string // lost
	State    string // backend: "degraded" or "ok"
	Message  string // backend, shutdown
}

// Scope says when a lease ends on its own.
type Scope uint8

const (
	// ScopeConnection leases end when the connection drops.
	ScopeConnection Scope = iota
	// ScopeSession leases end when the session ends.
	ScopeSession
)

// String returns the wire name of the scope.
func (s Scope) String() string {
	if s == ScopeSession {
		return "session"
	}
	return "connection"
}

// SessionOptions are the arguments of hello. A nil field is "" or 0 for a
// new session, and leaves a resumed session's value as it was.
type SessionOptions struct {
	Client     *string
	SessionTTL *time.Duration // how long the session outlives its connection
}

// maxBacklog bounds the events kept for a detached session beyond one per
// lease (each lease is lost at most once; a term elected and lost while
// the session is away leaves no event; of the backend's events, only the
// latest is kept).
const maxBacklog = 64

// Session is one client's session. Its methods are safe for concurrent use.
type Session struct {
	a      *Agent
	id     string
	token  string               // resume token
	uid    uint32               // of the peer that opened it, as of any that resumes it
	peer   atomic.Pointer[Peer] // the process on the connection now: a resume changes it
	client string
	opened time.Time

	// Guarded by a.mu.
	ttl       time.Duration
	conn      Conn
	backlog   []Event              // events while no connection is attached
	leases    map[string]*lease    // by name
	pending   pendingAcquires      // acquires in progress, by name
	detaches  int                  // connections gone: their acquires are being given up
	campaigns map[string]*campaign // by name
	expiry    *time.Timer          // ends a detached session
	expiresAt time.Time            // when expiry fires
	ended     bool
}

// ID is the session id.
func (s *Session) ID() string { return s.id }

// ResumeToken is the secret that lets a new connection resume the session.
func (s *Session) ResumeToken() string { return s.token }

func validateSessionOptions(o SessionOptions) error {
	if t := o.SessionTTL; t != nil && (*t < 0 || *t > MaxSessionTTL) {
		return &ArgError{Arg: ArgSessionTTL, Min: 0, Max: MaxSessionTTL}
	}
	if c := o.Client; c != nil && (len(*c) > maxClientLength || !utf8.ValidString(*c)) {
		return &ArgError{Arg: ArgClient, Rule: fmt.Sprintf("must be UTF-8 of at most %d bytes", maxClientLength)}
	}
	return nil
}

// apply sets the options given on s. a.mu is held.
func (o SessionOptions) apply(s *Session) {
	if o.Client != nil {
		s.client = *o.Client
	}
	if o.SessionTTL != nil {
		s.ttl = *o.SessionTTL
	}
}

// currentPeer returns the process on the session's connection: a resume
// from another process changes it.
func (s *Session) currentPeer() Peer {
	return *s.peer.Load()
}

// AdminReserve is how many sessions, and connections, admins may open
// beyond the caps on them: an agent that other users filled up can still
// be looked at (ctl status, ctl list -all) and mended (ctl break).
const AdminReserve = 16

// Open starts a session for peer and attaches conn to it.
func (a *Agent) Open(peer Peer, opts SessionOptions, conn Conn) (*Session, error) {
	if err := validateSessionOptions(opts); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closing {
		return nil, ErrShuttingDown
	}
	if n := len(a.sessions); n >= a.cfg.MaxSessions && (n >= a.cfg.MaxSessions+AdminReserve || !a.IsAdmin(peer)) {
		return nil, fmt.Errorf("%w: %d sessions", ErrLimitExceeded, a.cfg.MaxSessions)
	}
	if n := a.cfg.MaxSessionsPerUID; n > 0 && a.sessUID[peer.UID] >= n {
		return nil, fmt.Errorf("%w: %d sessions per uid", ErrLimitExceeded, n)
	}
	s := &Session{
		a:      a,
		id:     newID("s_"),
		token:  newID(""),
		uid:    peer.UID,
		opened: time.Now(),
		conn:   conn,
	}
	s.peer.Store(&peer)
	opts.apply(s)
	a.sessions[s.id] = s
	a.sessUID[peer.UID]++
	return s, nil
}

// Resume attaches conn to an existing session of the same uid, closing the
// connection attached before, and delivers the events it missed. Every
// refusal is ErrSessionExpired, whatever its cause.
func (a *Agent) Resume(peer Peer, id, token string, opts SessionOptions, conn Conn) (*Session, error) {
	if err := validateSessionOptions(opts); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closing {
		return nil, ErrShuttingDown
	}
	s := a.sessions[id]
	if s == nil || s.ended || s.uid != peer.UID ||
		subtle.ConstantTimeCompare([]byte(s.token), []byte(token)) != 1 {
		return nil, ErrSessionExpired
	}
	if s.conn != nil {
		old := s.conn
		gone := s.detach()
		// The new connection's tries of these names wait for their
		// release (see willRelease).
		a.willRelease(gone)
		a.wg.Add(1) // under a.mu, not closing: before Run waits
		go func() {
			defer a.wg.Done()
			a.releaseAll(gone)
		}()
		old.Close()
	}
	if s.expiry != nil {
		s.expiry.Stop()
		s.expiry = nil
	}
	s.peer.Store(&peer)
	opts.apply(s)
	s.conn = conn
	for _, ev := range s.backlog {
		conn.Send(ev)
	}
	s.backlog = nil
	// The session's leases past their local deadline are lost before it
	// is handed back, and their lost events follow the ones it missed.
	a.loseOverdue(time.Now())
	return s, nil
}

// Detach tells the session that conn is gone, and closes it. Its
// connection-scoped leases are released before Detach returns; the session
// ends now, or after its TTL if it has one.
func (s *Session) Detach(conn Conn) {
	a := s.a
	a.mu.Lock()
	if s.conn != conn || s.ended {
		a.mu.Unlock()
		return
	}
	gone := s.detach()
	if s.ttl == 0 {
		gone = append(gone, s.end(false)...)
	} else {
		s.expireIn(s.ttl)
	}
	a.willRelease(gone)
	a.mu.Unlock()
	// The connection is closed before the backend is asked: its end is the
	// application's notice that its connection-scoped leases are gone, and
	// a backend that does not answer must not hold it open meanwhile.
	conn.Close()
	a.releaseAll(gone)
}

// expireIn ends the detached session after d, unless a resume comes
// first. a.mu is held.
func (s *Session) expireIn(d time.Duration) {
	a := s.a
	var expiry *time.Timer
	expiry = time.AfterFunc(d, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		// A timer that fired as a resume stopped it is not the session's
		// any more: after that resume, a new detach has a timer and a TTL
		// of its own.
		if s.expiry == expiry && s.conn == nil && !s.ended {
			a.releaseLater(s.end(false))
		}
	})
	s.expiry, s.expiresAt = expiry, time.Now().Add(d)
}

// detach drops the connection and its connection-scoped leases, and returns
// them for the caller to release in the backend. a.mu is held.
func (s *Session) detach() []*lease {
	s.conn = nil
	s.detaches++
	for _, c := range s.campaigns {
		if c.req.Scope == ScopeConnection {
			c.stop()
		}
	}
	for w := range s.pending.all() {
		// The acquires of the connection gone, and the campaigns stopped
		// with it, leave at once; an acquire made through the API
		// without a connection goes on.
		if w.superseded() && (w.req.Conn != nil || w.camp != nil) {
			s.a.forget(w)
			w.signal()
		}
	}
	var gone []*lease
	for _, l := range s.leases {
		if l.scope == ScopeConnection {
			gone = append(gone, l)
			s.a.dropLease(l)
		}
	}
	return gone
}

// end ends the session and returns its leases, dropped from the agent, for
// the caller to release in the backend. The attached connection is closed
// unless keepConn is set (bye answers before it closes). a.mu is held.
func (s *Session) end(keepConn bool) []*lease {
	if s.ended {
		return nil
	}
	s.ended = true
	if s.expiry != nil {
		s.expiry.Stop()
	}
	for _, c := range s.campaigns {
		c.stop()
	}
	var gone []*lease
	for _, l := range s.leases {
		gone = append(gone, l)
		s.a.dropLease(l)
	}
	delete(s.a.sessions, s.id)
	if s.a.sessUID[s.uid]--; s.a.sessUID[s.uid] == 0 {
		delete(s.a.sessUID, s.uid)
	}
	for w := range s.pending.all() {
		w.signal()
	}
	if s.conn != nil && !keepConn {
		s.conn.Close()
	}
	s.conn = nil
	return gone
}

// send delivers ev to the connection, or keeps it for a resume. a.mu is held.
func (s *Session) send(ev Event) {
	if s.ended {
		return
	}
	if s.conn != nil {
		s.conn.Send(ev)
		return
	}
	if ev.Kind == EventBackend {
		// Only the backend's latest state is kept: renewals failing and
		// recovering again and again must not fill the backlog, whose
		// room is for the leases' events.
		s.backlog = slices.DeleteFunc(s.backlog, func(kept Event) bool { return kept.Kind == EventBackend })
	}
	if ev.Kind == EventLost {
		// A term the client has not heard of yet ended: it hears of
		// neither, and a campaign's events stay one per campaign however
		// many terms pass while it is away.
		for i, kept := range s.backlog {
			if kept.Kind == EventElected && kept.Lease == ev.Lease {
				s.backlog = slices.Delete(s.backlog, i, i+1)
				return
			}
		}
	}
	if s.ttl > 0 && len(s.backlog) < s.a.cfg.MaxLeasesPerSession+maxBacklog {
		s.backlog = append(s.backlog, ev)
	}
}

// Bye ends the session for conn, its attached connection: every lease is
// released before it returns. From a connection the session is no longer
// attached to (another took it over with a resume), Bye does nothing: the
// session is the new connection's.
func (s *Session) Bye(ctx context.Context, conn Conn) {
	a := s.a
	a.mu.Lock()
	if s.conn != conn {
		a.mu.Unlock()
		return
	}
	gone := s.end(true)
	a.mu.Unlock()
	ctx, cancel := detached(ctx)
	defer cancel()
	for _, l := range gone {
		a.releaseBackend(ctx, l)
	}
}

// Release ends one of the session's leases.
func (s *Session) Release(ctx context.Context, leaseID string) error {
	a := s.a
	a.mu.Lock()
	l := a.leases[leaseID]
	if l == nil || l.session != s {
		a.mu.Unlock()
		return ErrNotHeld
	}
	a.dropLease(l)
	if !a.local {
		// Answered at once; the backend learns of it soon (see owe).
		a.owe(l)
		a.mu.Unlock()
		return nil
	}
	a.mu.Unlock()
	// The release outlives the request (see detached), and is not
	// bounded here: the backend is a function call.
	a.releaseBackend(context.WithoutCancel(ctx), l)
	return nil
}

// CheckResult is the answer of Check.
type CheckResult struct {
	Held      bool
	Token     uint64
	ExpiresIn time.Duration
}

// Check confirms with the backend that the session still holds a lease. A
// lease the backend no longer has is lost at once.
func (s *Session) Check(ctx context.Context, leaseID string) (CheckResult, error) {
	a := s.a
	a.mu.Lock()
	l := a.leases[leaseID]
	if l == nil || l.session != s {
		a.mu.Unlock()
		return CheckResult{}, ErrNotHeld
	}
	a.mu.Unlock()
	info, err := a.b.Inspect(ctx, l.name)
	a.note(err)
	if err != nil {
		return CheckResult{}, fmt.Errorf("check %s: %w", l.name, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// An agent stopped or starved during the round trip may have let the
	// lease pass its local deadline: then it is not held, whatever the
	// backend said before.
	a.loseOverdue(time.Now())
	if a.leases[leaseID] != l {
		return CheckResult{Held: false, Token: l.token}, nil
	}
	for _, h := range info.Holders {
		if h.LeaseID == leaseID {
			return CheckResult{Held: true, Token: l.token, ExpiresIn: h.ExpiresIn}, nil
		}
	}
	a.lose(l, ReasonExpired)
	return CheckResult{Held: false, Token: l.token}, nil
}

// Inspect reports who holds a name.
func (s *Session) Inspect(ctx context.Context, name string) (backend.LockInfo, error) {
	if err := ValidateName(name); err != nil {
		return backend.LockInfo{}, err
	}
	if err := s.a.allowAnyMode(s.currentPeer(), name); err != nil {
		return backend.LockInfo{}, err
	}
	a := s.a
	info, err := a.b.Inspect(ctx, name)
	a.note(err)
	if err != nil {
		return backend.LockInfo{}, fmt.Errorf("inspect %s: %w", name, err)
	}
	// A lease released here is not held, though the backend may not know
	// it yet.
	a.mu.Lock()
	info.Holders = slices.DeleteFunc(info.Holders, func(h backend.Holder) bool { return a.isOwed(name, h.LeaseID) })
	a.mu.Unlock()
	return info, nil
}

// Break ends every lease on a name, here and in the backend; admins only.
// Local holders get lost with reason broken. It returns how many leases
// were ended.
func (s *Session) Break(ctx context.Context, name string) (n int, err error) {
	a := s.a
	if !a.IsAdmin(s.currentPeer()) {
		return 0, fmt.Errorf("%w: break is for admins", ErrPermissionDenied)
	}
	if err := ValidateName(name); err != nil {
		return 0, err
	}
	defer func() { a.auditLog("break", s, "name", name, "broken", n, "error", err) }()
	info, err := a.b.Inspect(ctx, name)
	a.note(err)
	if err != nil {
		return 0, fmt.Errorf("break %s: %w", name, err)
	}
	// The local holders are told at once: their releases must follow.
	ctx, cancel := detached(ctx)
	defer cancel()
	for _, h := range info.Holders {
		a.mu.Lock()
		if l := a.leases[h.LeaseID]; l != nil {
			a.dropLost(l, ReasonBroken)
		}
		a.mu.Unlock()
		err := a.b.Release(ctx, backend.LeaseKey{Name: name, LeaseID: h.LeaseID, Mode: h.Mode})
		a.called("release", err)
		switch {
		case err == nil:
			n++
		case errors.Is(err, backend.ErrNotHeld): // it ended meanwhile
		default:
			return n, fmt.Errorf("break %s: %w", name, err)
		}
	}
	return n, nil
}

// LeaseInfo describes a held lease for list.
type LeaseInfo struct {
	Lease
	Meta      string
	HeldFor   time.Duration
	ExpiresIn time.Duration // until the agent would report it lost
}

// WaitInfo describes a waiting acquire for list.
type WaitInfo struct {
	Name      string
	Mode      backend.Mode
	WaitedFor time.Duration
}

// SessionInfo describes a session for list.
type SessionInfo struct {
	ID        string
	Peer      Peer
	Client    string
	Attached  bool
	OpenedFor time.Duration
	Leases    []LeaseInfo
	Waiting   []WaitInfo
	Campaigns []CampaignInfo
}

// ListRequest is what List describes.
type ListRequest struct {
	All   bool   // every session (admins only), not only the caller's uid's
	After string // only the sessions whose id sorts after it
	Limit int    // at most this many sessions; 0: as many as maxListItems allows
}

// maxListItems bounds the leases, waiting acquires and campaigns of one
// List: what it copies under the agent's lock.
const maxListItems = 4096

// List describes sessions, sorted by id: those of the caller's uid, or
// every session when req.All is set (admins only), from the first whose
// id sorts after req.After. It stops after req.Limit sessions, or once
// those it took hold maxListItems leases, waiting acquires and campaigns
// (the first always goes in whole); more tells whether sessions remain.
func (s *Session) List(req ListRequest) (infos []SessionInfo, more bool, err error) {
	a := s.a
	if req.All && !a.IsAdmin(s.currentPeer()) {
		return nil, false, fmt.Errorf("%w: list all is for admins", ErrPermissionDenied)
	}
	if req.All && req.After == "" {
		a.auditLog("list -all", s)
	}
	limit := req.Limit
	if limit <= 0 {
		limit = maxListItems
	}
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	// The first limit+1 sessions after req.After, in order: one more tells
	// whether any remain.
	var first []*Session
	for _, o := range a.sessions {
		if (!req.All && o.uid != s.uid) || o.id <= req.After {
			continue
		}
		if len(first) == limit+1 && o.id >= first[limit].id {
			continue
		}
		i, _ := slices.BinarySearchFunc(first, o.id, func(x *Session, id string) int { return strings.Compare(x.id, id) })
		if len(first) <= limit {
			first = append(first, nil)
		}
		copy(first[i+1:], first[i:])
		first[i] = o
	}
	items := 0
	for n, o := range first {
		if n == limit || (n > 0 && items >= maxListItems) {
			return infos, true, nil
		}
		si := o.describe(now)
		items += len(si.Leases) + len(si.Waiting) + len(si.Campaigns)
		infos = append(infos, si)
	}
	return infos, false, nil
}

// describe is what List says of o. a.mu is held.
func (o *Session) describe(now time.Time) SessionInfo {
	si := SessionInfo{ID: o.id, Peer: o.currentPeer(), Client: o.client, Attached: o.conn != nil, OpenedFor: now.Sub(o.opened)}
	for _, l := range o.leases {
		si.Leases = append(si.Leases, LeaseInfo{Lease: l.public(), Meta: l.meta, HeldFor: now.Sub(l.granted), ExpiresIn: l.validUntil.Sub(now)})
	}
	sort.Slice(si.Leases, func(i, j int) bool { return si.Leases[i].Name < si.Leases[j].Name })
	for w := range o.pending.all() {
		si.Waiting = append(si.Waiting, WaitInfo{Name: w.req.Name, Mode: w.req.Mode, WaitedFor: now.Sub(w.since)})
	}
	sort.Slice(si.Waiting, func(i, j int) bool { return si.Waiting[i].Name < si.Waiting[j].Name })
	for _, c := range o.campaigns {
		ci := CampaignInfo{ID: c.id, Name: c.req.Name, Leader: c.term != nil}
		if c.term != nil {
			ci.Lease = c.term.id
		}
		si.Campaigns = append(si.Campaigns, ci)
	}
	sort.Slice(si.Campaigns, func(i, j int) bool { return si.Campaigns[i].Name < si.Campaigns[j].Name })
	return si
}
