package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/lockagent/lockagent/backend"
)

// State is what an agent holds, as Snapshot takes it for a new process to
// go on from (see Restore): its sessions, with their leases, acquires in
// progress, campaigns and the events kept for them, and the order of each
// name's waiters. Deadlines are what remained of them at the snapshot.
type State struct {
	Since    time.Time           `json:"since"` // see Started
	Sessions []SessionState      `json:"sessions"`
	Queues   map[string][]string `json:"queues,omitempty"` // by name: its waiters' keys, in order
}

// SessionState is one session.
type SessionState struct {
	ID        string          `json:"id"`
	Token     string          `json:"token"`
	UID       uint32          `json:"uid"`
	Peer      Peer            `json:"peer"`
	Client    string          `json:"client,omitempty"`
	Opened    time.Time       `json:"opened"`
	TTL       time.Duration   `json:"ttl,omitempty"`
	Attached  bool            `json:"attached"`
	Detaches  int             `json:"detaches,omitempty"`
	ExpiresIn time.Duration   `json:"expires_in,omitempty"` // a detached session's end
	Backlog   []Event         `json:"backlog,omitempty"`
	Leases    []LeaseState    `json:"leases,omitempty"`
	Waiters   []WaiterState   `json:"waiters,omitempty"`
	Campaigns []CampaignState `json:"campaigns,omitempty"`
}

// LeaseState is one lease.
type LeaseState struct {
	ID       string        `json:"id"`
	Name     string        `json:"name"`
	Mode     backend.Mode  `json:"mode"`
	Scope    Scope         `json:"scope"`
	TTL      time.Duration `json:"ttl"`
	Token    uint64        `json:"token"`
	Meta     string        `json:"meta,omitempty"`
	Granted  time.Time     `json:"granted"`
	ValidFor time.Duration `json:"valid_for"` // until its local deadline
	RenewIn  time.Duration `json:"renew_in"`  // until its next renewal
	AtRisk   bool          `json:"at_risk,omitempty"`
	Campaign string        `json:"campaign,omitempty"` // the campaign whose term it is
}

// WaiterState is one waiting acquire, or a campaign's attempt.
type WaiterState struct {
	Key      string        `json:"key"` // see Pending.Key
	Name     string        `json:"name"`
	Mode     backend.Mode  `json:"mode"`
	Limit    int           `json:"limit,omitempty"`
	Scope    Scope         `json:"scope"`
	TTL      time.Duration `json:"ttl"`
	Meta     string        `json:"meta,omitempty"`
	Wait     time.Duration `json:"wait"` // what remained of it, or WaitForever
	Since    time.Time     `json:"since"`
	Ticket   string        `json:"ticket"`
	Asked    bool          `json:"asked,omitempty"`
	Unknown  string        `json:"unknown,omitempty"`  // the lease id of an attempt with an unknown outcome
	Campaign string        `json:"campaign,omitempty"` // the campaign it is for
}

// CampaignState is one campaign.
type CampaignState struct {
	ID       string        `json:"id"`
	Name     string        `json:"name"`
	Scope    Scope         `json:"scope"`
	TTL      time.Duration `json:"ttl"`
	Meta     string        `json:"meta,omitempty"`
	Term     string        `json:"term,omitempty"` // its term's lease, while it leads
	Reserved bool          `json:"reserved,omitempty"`
}

// Snapshot returns the agent's state. The agent must be frozen (see
// Freeze): no step is under way, and none runs after.
func (a *Agent) Snapshot() (State, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.frozen || a.steps > 0 {
		return State{}, fmt.Errorf("agent: snapshot of an agent that is not frozen")
	}
	now := time.Now()
	st := State{Since: a.since, Queues: make(map[string][]string, len(a.queues))}
	for name, q := range a.queues {
		for _, w := range q.waiters {
			st.Queues[name] = append(st.Queues[name], w.ticket)
		}
	}
	for _, s := range a.sessions {
		ss := SessionState{ID: s.id, Token: s.token, UID: s.uid, Peer: s.currentPeer(), Client: s.client, Opened: s.opened,
			TTL: s.ttl, Attached: s.conn != nil, Detaches: s.detaches, Backlog: s.backlog}
		if s.conn == nil && s.expiry != nil {
			ss.ExpiresIn = s.expiresAt.Sub(now)
		}
		for _, l := range s.leases {
			ls := LeaseState{ID: l.id, Name: l.name, Mode: l.mode, Scope: l.scope, TTL: l.ttl, Token: l.token, Meta: l.meta,
				Granted: l.granted, ValidFor: l.validUntil.Sub(now), RenewIn: l.nextRenew.Sub(now), AtRisk: l.atRisk}
			if l.camp != nil {
				ls.Campaign = l.camp.id
			}
			ss.Leases = append(ss.Leases, ls)
		}
		for w := range s.pending.all() {
			if !w.queued || w.left {
				continue // a try ends before the agent freezes; a waiter given up leaves no trace
			}
			ws := WaiterState{Key: w.ticket, Name: w.req.Name, Mode: w.req.Mode, Limit: w.req.Limit, Scope: w.req.Scope,
				TTL: w.req.TTL, Meta: w.req.Meta, Wait: WaitForever, Since: w.since, Ticket: w.ticket, Asked: w.asked}
			if !w.until.IsZero() {
				ws.Wait = max(w.until.Sub(now), time.Nanosecond)
			}
			if w.unknown != nil {
				ws.Unknown = w.unknown.id
			}
			if w.camp != nil {
				ws.Campaign = w.camp.id
			}
			ss.Waiters = append(ss.Waiters, ws)
		}
		for _, c := range s.campaigns {
			cs := CampaignState{ID: c.id, Name: c.req.Name, Scope: c.req.Scope, TTL: c.req.TTL, Meta: c.req.Meta, Reserved: c.reserved}
			if c.term != nil {
				cs.Term = c.term.id
			}
			ss.Campaigns = append(ss.Campaigns, cs)
		}
		st.Sessions = append(st.Sessions, ss)
	}
	return st, nil
}

// Restore returns an agent that goes on from st, which another process
// took elapsed ago: cfg is this process's configuration, conn gives each
// session that was attached its connection. Every deadline falls when it
// would have, never later. The agent is frozen (see Freeze) until Thaw,
// which the caller calls once the state is its own: then its campaigns go
// on. The waiting acquires are returned, by key, for the caller to run
// (Pending.Run) and answer. Call Run then.
func Restore(cfg Config, st State, elapsed time.Duration, conn func(session string) Conn) (*Agent, map[string]*Pending, error) {
	a := New(cfg)
	a.since = st.Since
	a.frozen = true
	now := time.Now().Add(-elapsed)
	a.mu.Lock()
	defer a.mu.Unlock()
	waiters := make(map[string]*waiter)
	pending := make(map[string]*Pending)
	for _, ss := range st.Sessions {
		s := &Session{a: a, id: ss.ID, token: ss.Token, uid: ss.UID, client: ss.Client, opened: ss.Opened, ttl: ss.TTL,
			detaches: ss.Detaches, backlog: ss.Backlog}
		peer := ss.Peer
		s.peer.Store(&peer)
		if ss.Attached {
			if s.conn = conn(ss.ID); s.conn == nil {
				return nil, nil, fmt.Errorf("agent: restore: session %s has no connection", ss.ID)
			}
		}
		a.sessions[s.id] = s
		a.sessUID[s.uid]++
		camps := make(map[string]*campaign)
		ctxs := make(map[*campaign]context.Context)
		for _, cs := range ss.Campaigns {
			c, ctx := a.newCampaign(s, cs.ID, AcquireRequest{Name: cs.Name, Mode: backend.Exclusive, Scope: cs.Scope, TTL: cs.TTL, Wait: WaitForever, Meta: cs.Meta})
			c.reserved = cs.Reserved
			if c.reserved {
				a.perUID[s.uid]++
			}
			camps[c.id], ctxs[c] = c, ctx
		}
		for _, ls := range ss.Leases {
			l := &lease{id: ls.ID, name: ls.Name, mode: ls.Mode, ttl: ls.TTL, scope: ls.Scope, token: ls.Token, meta: ls.Meta,
				session: s, granted: ls.Granted, index: -1,
				validUntil: now.Add(ls.ValidFor), nextRenew: now.Add(min(ls.RenewIn, ls.ValidFor))}
			if c := camps[ls.Campaign]; c != nil {
				l.camp, c.term = c, l
			}
			a.addLease(l)
			a.setAtRisk(l, ls.AtRisk)
		}
		for _, ws := range ss.Waiters {
			req := AcquireRequest{Name: ws.Name, Mode: ws.Mode, Limit: ws.Limit, Scope: ws.Scope, TTL: ws.TTL, Wait: ws.Wait,
				Meta: ws.Meta, Conn: s.conn}
			w := &waiter{s: s, req: req, camp: camps[ws.Campaign], since: ws.Since, attached: s.detaches, queued: true,
				ticket: ws.Ticket, wake: make(chan struct{}, 1), asked: ws.Asked}
			if ws.Wait > 0 {
				w.until = now.Add(ws.Wait)
			}
			if ws.Unknown != "" {
				w.unknown = &lease{id: ws.Unknown, name: ws.Name, mode: ws.Mode, ttl: ws.TTL, scope: ws.Scope, session: s,
					index: -1, validUntil: now.Add(ws.TTL - a.margin(ws.TTL))}
			}
			s.pending.put(w)
			a.perUID[s.uid]++
			a.waiters++
			a.wg.Add(1) // as begin does: Run waits for the acquire
			waiters[w.ticket] = w
			if w.camp != nil {
				w.req = w.camp.req
				w.req.Wait = ws.Wait
				w.camp.resumed = w
			} else {
				pending[w.ticket] = &Pending{s: s, req: w.req, start: w.since, w: w}
			}
		}
		if !ss.Attached && s.ttl > 0 {
			s.expireIn(max(ss.ExpiresIn-elapsed, 0))
		}
		for c, ctx := range ctxs {
			a.wg.Add(1)
			go a.runCampaign(ctx, c)
		}
	}
	for name, keys := range st.Queues {
		q := &queue{}
		for _, k := range keys {
			if w := waiters[k]; w != nil && w.req.Name == name {
				q.waiters = append(q.waiters, w)
			}
		}
		if len(q.waiters) > 0 {
			a.queues[name] = q
		}
	}
	a.setDegraded(a.atRisk > 0)
	return a, pending, nil
}

// Session returns the session id, or nil: what a restored connection
// (see Restore) finds its session by.
func (a *Agent) Session(id string) *Session {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sessions[id]
}
