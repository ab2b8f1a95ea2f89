package client

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/lockagent/lockagent/internal/wire"
)

// The typed ops of sessions and locks: hello, acquire, release, check,
// inspect and break.

// Modes and scopes of AcquireOptions (and CampaignOptions.Scope).
const (
	ModeExclusive   = wire.ModeExclusive   // one holder (the default)
	ModeShared      = wire.ModeShared      // any number of holders, or Limit
	ScopeConnection = wire.ScopeConnection // the lease ends with the connection (the default)
	ScopeSession    = wire.ScopeSession    // the lease ends with the session
)

// WaitForever, as AcquireOptions.Wait, waits until the lock is granted,
// the context ends or the connection does.
const WaitForever time.Duration = -1

// HelloOptions are the arguments of Hello. Zero values take the agent's
// defaults.
type HelloOptions struct {
	Client     string        // a name for the session, shown by `lockagent ctl list`
	SessionTTL time.Duration // how long the session outlives its connection: 0 (default), not at all
	// Heartbeat, if not 0, has the agent drop the connection (and its
	// connection-scoped leases) when no request arrives for that long:
	// call Ping more often. At least 100ms.
	Heartbeat time.Duration
	// Resume, if set, takes over this session (from an earlier Hello by
	// the same uid, with SessionTTL set) with its session-scoped leases.
	// The lost events it missed arrive on Events.
	Resume *Session
}

// Session is what Hello tells of the session and of the agent.
type Session struct {
	ID          string
	ResumeToken string // resumes the session with HelloOptions.Resume; keep it private
	Resumed     bool   // the session was resumed
	Agent       AgentInfo
}

// AgentInfo describes the agent.
type AgentInfo struct {
	Version      string
	Backend      string // memory or redis
	MaxLineBytes int    // the longest request line it reads
	DefaultTTL   time.Duration
	MinTTL       time.Duration
	MaxTTL       time.Duration
}

// Hello opens the session with opts, or resumes one. It must be the first
// request of the connection: without it, the first request opens a
// session with the defaults.
func (c *Client) Hello(ctx context.Context, opts HelloOptions) (*Session, error) {
	args := map[string]any{"version": wire.Version}
	if opts.Client != "" {
		args["client"] = opts.Client
	}
	if opts.SessionTTL != 0 {
		args["session_ttl_ms"] = opts.SessionTTL.Milliseconds()
	}
	if opts.Heartbeat != 0 {
		args["heartbeat_ms"] = opts.Heartbeat.Milliseconds()
	}
	if opts.Resume != nil {
		args["resume"] = wire.Resume{Session: opts.Resume.ID, Token: opts.Resume.ResumeToken}
	}
	var r wire.HelloResult
	if err := c.Call(ctx, "hello", args, &r); err != nil {
		return nil, err
	}
	return &Session{ID: r.Session, ResumeToken: r.ResumeToken, Resumed: r.Resumed, Agent: AgentInfo{
		Version: r.Agent.Version, Backend: r.Agent.Backend, MaxLineBytes: r.Agent.MaxLineBytes,
		DefaultTTL: msDuration(r.Agent.TTLMs.Default), MinTTL: msDuration(r.Agent.TTLMs.Min), MaxTTL: msDuration(r.Agent.TTLMs.Max),
	}}, nil
}

// AcquireOptions are the arguments of Acquire. Zero values take the
// agent's defaults: an exclusive, connection-scoped lease with the
// default TTL, tried once.
type AcquireOptions struct {
	Mode  string // ModeExclusive (default) or ModeShared
	Limit int    // with ModeShared: at most Limit holders (a semaphore); 0, no limit
	Scope string // ScopeConnection (default) or ScopeSession
	// TTL is how long the lock outlives an agent (or host) that dies; the
	// agent renews the lease as long as it lives.
	TTL time.Duration
	// Wait is how long to wait for the lock: 0 (default) tries once,
	// WaitForever waits without a limit. Ending the context cancels the
	// wait.
	Wait time.Duration
	Meta string // free text shown to inspect, list and denied acquires
}

// ErrNotAcquired matches, with errors.Is, the *NotAcquiredError of an
// Acquire that was denied.
var ErrNotAcquired = errors.New("client: not acquired")

// NotAcquiredError is Acquire's error when the lock was not granted: a
// normal outcome, that the agent answers with acquired false.
type NotAcquiredError struct {
	Name    string
	Reason  string   // "held" (a try, or others queue for it) or "timeout" (Wait ran out)
	Holders []Holder // the live leases on the name at that moment, by token; may be empty
}

func (e *NotAcquiredError) Error() string {
	return "client: " + e.Name + " not acquired: " + e.Reason
}

// Is makes errors.Is(err, ErrNotAcquired) true.
func (e *NotAcquiredError) Is(target error) bool { return target == ErrNotAcquired }

// Holder is a live lease on a name, as others see it.
type Holder struct {
	Mode      string
	Token     uint64
	Meta      string
	Host      string        // the host name of the holder's agent
	ExpiresIn time.Duration // until the backend drops it if its agent stops renewing it
}

// LeaseInfo is what the agent says of a granted lease.
type LeaseInfo struct {
	ID    string
	Name  string
	Mode  string
	Scope string
	// Token is the fencing token: larger than every earlier grant's of the
	// name. Hand it to what the lock protects, so that it can refuse a
	// token smaller than one it has seen.
	Token uint64
	TTL   time.Duration
}

func leaseInfo(l wire.Lease) LeaseInfo {
	return LeaseInfo{ID: l.ID, Name: l.Name, Mode: l.Mode, Scope: l.Scope, Token: l.Token, TTL: msDuration(l.TTLMs)}
}

// Lease is a granted lock, from Acquire. The agent renews it until it is
// released or lost: watch Done, and stop using what the lock protects
// when it is closed.
type Lease struct {
	LeaseInfo

	c      *Client
	done   chan struct{}
	once   sync.Once
	reason string
}

// Done is closed when the lease has ended, for the reason Reason gives.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Reason is why the lease ended, once Done is closed (it waits for it): a
// lost event's reason (expired, taken_over, broken, backend_unavailable),
// "released" (by Release) or "connection closed" (a session-scoped lease
// may live on in its session; this client no longer hears of it).
func (l *Lease) Reason() string {
	<-l.done
	return l.reason
}

func (l *Lease) end(reason string) {
	l.once.Do(func() {
		l.reason = reason
		close(l.done)
	})
}

// Acquire takes the lock name. It returns the lease, or a
// *NotAcquiredError (errors.Is ErrNotAcquired) if the agent denied it, or
// an *Error for a refused request (ErrAlreadyHeld for a name the session
// holds).
//
// If ctx ends first, Acquire returns ctx.Err() at once; a waiting acquire
// is cancelled, and a lease granted meanwhile is released when its grant
// arrives. A later Acquire of the same name on this client waits for that.
func (c *Client) Acquire(ctx context.Context, name string, opts AcquireOptions) (*Lease, error) {
	c.mu.Lock()
	settling := c.settling[name]
	c.mu.Unlock()
	if settling != nil {
		select {
		case <-settling:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	args := map[string]any{"name": name}
	if opts.Mode != "" {
		args["mode"] = opts.Mode
	}
	if opts.Limit != 0 {
		args["limit"] = opts.Limit
	}
	if opts.Scope != "" {
		args["scope"] = opts.Scope
	}
	if opts.TTL != 0 {
		args["ttl_ms"] = opts.TTL.Milliseconds()
	}
	switch {
	case opts.Wait < 0:
		args["wait_ms"] = -1
	case opts.Wait > 0:
		args["wait_ms"] = (opts.Wait + time.Millisecond - 1).Milliseconds()
	}
	if opts.Meta != "" {
		args["meta"] = opts.Meta
	}
	// The lease is registered before the line after the answer is read:
	// its lost event may be that line.
	var lease *Lease
	register := func(body []byte) {
		if lease = c.granted(body); lease != nil {
			c.mu.Lock()
			if c.leases == nil {
				c.leases = make(map[string]*Lease)
			}
			c.leases[lease.ID] = lease
			c.mu.Unlock()
		}
	}
	var r wire.AcquireResult
	settled := make(chan struct{})
	err := c.do(ctx, "acquire", args, &r, pendingCall{hook: register, cancel: opts.Wait != 0,
		abandon: func() {
			if c.settling == nil {
				c.settling = make(map[string]chan struct{})
			}
			c.settling[name] = settled
		},
		orphan: func(body []byte) {
			if l := c.granted(body); l != nil {
				c.post("release", map[string]any{"lease": l.ID})
			}
			c.mu.Lock()
			if c.settling[name] == settled {
				delete(c.settling, name)
			}
			c.mu.Unlock()
			close(settled)
		}})
	switch {
	case err != nil:
		return nil, err
	case !r.Acquired:
		return nil, &NotAcquiredError{Name: name, Reason: r.Reason, Holders: holders(r.Holders)}
	}
	return lease, nil
}

// granted returns the lease an acquire's answer grants, or nil.
func (c *Client) granted(body []byte) *Lease {
	var r struct {
		OK bool `json:"ok"`
		wire.AcquireResult
	}
	if json.Unmarshal(body, &r) != nil || !r.OK || !r.Acquired {
		return nil
	}
	return &Lease{LeaseInfo: leaseInfo(r.Lease), c: c, done: make(chan struct{})}
}

// Release releases the lease; Done is then closed, with reason
// "released". A lease that has ended already gets ErrNotHeld.
func (l *Lease) Release(ctx context.Context) error {
	released := func(body []byte) {
		var r struct {
			OK bool `json:"ok"`
		}
		if json.Unmarshal(body, &r) != nil || !r.OK {
			return
		}
		l.c.mu.Lock()
		if l.c.leases[l.ID] == l {
			delete(l.c.leases, l.ID)
		}
		l.c.mu.Unlock()
		l.end("released")
	}
	return l.c.do(ctx, "release", map[string]any{"lease": l.ID}, nil, pendingCall{hook: released, orphan: released})
}

// Check asks the agent to confirm with the backend that the lease is
// still held, and how long the backend would keep it without a renewal.
// If it is not, the lease is lost, and Done is closed before Check returns.
func (l *Lease) Check(ctx context.Context) (held bool, expiresIn time.Duration, err error) {
	var r wire.CheckResult
	err = l.c.Call(ctx, "check", map[string]any{"lease": l.ID}, &r)
	switch {
	case errors.Is(err, ErrNotHeld): // it ended earlier
		return false, 0, nil
	case err != nil:
		return false, 0, err
	}
	return r.Held, msDuration(r.ExpiresInMs), nil
}

// Inspection is what Inspect tells of a name.
type Inspection struct {
	Locked    bool
	Mode      string   // of the live leases; "" when not locked
	Holders   []Holder // the live leases, by token
	LastToken uint64   // the last token granted for the name; 0 if none is known
	Queued    int      // waiting acquires and campaigns, on every agent
}

// Inspect reports who holds the lock name.
func (c *Client) Inspect(ctx context.Context, name string) (*Inspection, error) {
	var r wire.InspectResult
	if err := c.Call(ctx, "inspect", map[string]any{"name": name}, &r); err != nil {
		return nil, err
	}
	in := &Inspection{Locked: r.Locked, Holders: holders(r.Holders), LastToken: r.LastToken, Queued: r.Queued}
	if r.Mode != nil {
		in.Mode = *r.Mode
	}
	return in, nil
}

// Break ends every lease on name, whoever holds it, and returns how many
// it ended: each holder gets a lost event with reason "broken". Admins
// only (ErrPermissionDenied for others).
func (c *Client) Break(ctx context.Context, name string) (int, error) {
	var r wire.BreakResult
	if err := c.Call(ctx, "break", map[string]any{"name": name}, &r); err != nil {
		return 0, err
	}
	return r.Broken, nil
}

func holders(hs []wire.Holder) []Holder {
	out := make([]Holder, len(hs))
	for i, h := range hs {
		out[i] = Holder{Mode: h.Mode, Token: h.Token, Meta: h.Meta, Host: h.Host, ExpiresIn: msDuration(h.ExpiresInMs)}
	}
	return out
}

func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
