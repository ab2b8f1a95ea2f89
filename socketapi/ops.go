package socketapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/internal/wire"
)

// The ops of sessions and locks; list has a file of its own, and so do
// campaign and resign, and status.

func (c *conn) hello(req *request) (any, error) {
	if req.Version != nil && *req.Version != 1 {
		return nil, fmt.Errorf("%w: version must be 1", agent.ErrInvalidArgument)
	}
	opts := agent.SessionOptions{Client: req.Client}
	if req.SessionTTLMs != nil {
		ttl, err := millis("session_ttl_ms", req.SessionTTLMs)
		if err != nil {
			return nil, err
		}
		opts.SessionTTL = &ttl
	}
	var hb time.Duration
	if req.HeartbeatMs != nil {
		var err error
		if hb, err = millis("heartbeat_ms", req.HeartbeatMs); err != nil {
			return nil, err
		}
		if *req.HeartbeatMs != 0 && (*req.HeartbeatMs < agent.MinHeartbeat.Milliseconds() || hb > agent.MaxHeartbeat) {
			return nil, fmt.Errorf("%w: heartbeat_ms must be 0 or between %d and %d", agent.ErrInvalidArgument, agent.MinHeartbeat.Milliseconds(), agent.MaxHeartbeat.Milliseconds())
		}
	}
	var s *agent.Session
	var err error
	if req.Resume != nil {
		s, err = c.srv.Agent.Resume(c.peer, req.Resume.Session, req.Resume.Token, opts, c)
	} else {
		s, err = c.srv.Agent.Open(c.peer, opts, c)
	}
	if err != nil {
		return nil, err
	}
	c.sess = s
	c.heartbeat = hb
	info := c.srv.Agent.Info()
	return wire.HelloResult{
		Session:     s.ID(),
		ResumeToken: s.ResumeToken(),
		Resumed:     req.Resume != nil,
		Agent: wire.AgentInfo{
			Version:      info.Version,
			Backend:      info.Backend,
			MaxLineBytes: c.srv.MaxLineBytes,
			TTLMs:        wire.TTLBounds{Default: info.DefaultTTL.Milliseconds(), Min: info.MinTTL.Milliseconds(), Max: info.MaxTTL.Milliseconds()},
		},
	}, nil
}

// acquire answers a try (wait_ms 0) at once, like the other ops. A waiting
// acquire runs in its own goroutine, so that it never delays the
// connection's other requests, and can be cancelled by its id.
func (c *conn) acquire(ctx context.Context, id json.RawMessage, req *request) bool {
	ar, err := parseAcquire(req)
	if err != nil {
		mode, _ := parseMode(req.Mode) // exclusive if it is not a mode
		c.srv.Agent.Refused(mode, err)
		c.reply(id, nil, err)
		return true
	}
	// The grant is queued with the agent's lock held, so that it goes out
	// before any event of the new lease.
	ar.Granted = func(l agent.Lease) {
		c.out.queue(encodeGranted(id, l))
	}
	ar.Conn = c // refused once a resume took the session
	if ar.Wait == 0 {
		res, err := c.sess.Acquire(ctx, ar)
		c.replyAcquire(id, res, err)
		return true
	}
	// Its place is taken now, so that the requests read after it come
	// after it, then it runs on its own.
	if err := c.await(ctx, id, func() *agent.Pending { return c.sess.Begin(ar) }); err != nil {
		c.srv.Agent.Refused(ar.Mode, err)
		c.reply(id, nil, err)
	}
	return true
}

// await runs a waiting acquire, which begin places, in a goroutine of its
// own, so that it never delays the connection's other requests: cancel
// can name it by its id, and the agent answers it (AcquireRequest.Answered)
// when it ends. A pending request's id used again is an error.
func (c *conn) await(ctx context.Context, id json.RawMessage, begin func() *agent.Pending) error {
	ctx, cancel := context.WithCancel(ctx)
	key, cancellable := idKey(id)
	p := &pendingReq{cancel: cancel, done: make(chan struct{})}
	c.mu.Lock()
	if cancellable {
		if _, dup := c.pending[key]; dup {
			c.mu.Unlock()
			cancel()
			return fmt.Errorf("%w: id is already used by a pending request", agent.ErrInvalidArgument)
		}
		if c.pending == nil {
			c.pending = make(map[string]*pendingReq)
		}
		c.pending[key] = p
	}
	c.mu.Unlock()
	acq := begin()
	if k := acq.Key(); k != "" {
		c.mu.Lock()
		if c.waiting == nil {
			c.waiting = make(map[string]json.RawMessage)
		}
		c.waiting[k] = id
		c.mu.Unlock()
	}
	// Told in the agent's step: a connection handed over has either
	// queued the answer or kept the acquire (see Server.Snapshot).
	acq.Answered(func(res agent.AcquireResult, err error) {
		c.mu.Lock()
		if cancellable && c.pending[key] == p {
			delete(c.pending, key)
		}
		delete(c.waiting, acq.Key())
		c.mu.Unlock()
		c.queueAcquire(id, res, err)
	})
	c.reqWG.Add(1)
	go func() {
		defer c.reqWG.Done()
		defer cancel()
		res, err := acq.Run(ctx)
		if acq.Key() == "" {
			// Refused before it took a place: nobody told it.
			c.mu.Lock()
			if cancellable && c.pending[key] == p {
				delete(c.pending, key)
			}
			c.mu.Unlock()
			c.queueAcquire(id, res, err)
		}
		c.out.enqueue(nil, true)
		p.canceled = errors.Is(err, context.Canceled)
		close(p.done)
	}()
	return nil
}

// queueAcquire queues the answer of a waiting acquire, without writing it:
// a grant's is queued already (Granted).
func (c *conn) queueAcquire(id json.RawMessage, res agent.AcquireResult, err error) {
	switch {
	case err != nil:
		c.out.enqueue(c.errorLine(id, err), false)
	case res.Acquired:
	default:
		c.out.answer(encodeOK(id, wire.Denied{Reason: res.Reason, Holders: toHolders(res.Holders)}),
			func(size int) []byte { return c.tooLarge(id, size) }, false)
	}
}

// replyAcquire answers an acquire; a grant is already queued (Granted).
func (c *conn) replyAcquire(id json.RawMessage, res agent.AcquireResult, err error) {
	switch {
	case err != nil:
		c.reply(id, nil, err)
	case res.Acquired:
		c.out.enqueue(nil, true)
	default:
		c.replyLarge(id, wire.Denied{Reason: res.Reason, Holders: toHolders(res.Holders)})
	}
}

func (c *conn) release(ctx context.Context, id json.RawMessage, req *request) bool {
	l, err := leaseArg(req)
	if err == nil {
		err = c.sess.Release(ctx, l)
	}
	c.reply(id, wire.ReleaseResult{Released: true}, err)
	return true
}

func (c *conn) check(ctx context.Context, id json.RawMessage, req *request) bool {
	l, err := leaseArg(req)
	var res agent.CheckResult
	if err == nil {
		res, err = c.sess.Check(ctx, l)
	}
	c.reply(id, wire.CheckResult{Held: res.Held, Token: res.Token, ExpiresInMs: res.ExpiresIn.Milliseconds()}, err)
	return true
}

func (c *conn) inspect(ctx context.Context, id json.RawMessage, req *request) bool {
	info, err := c.sess.Inspect(ctx, nameArg(req))
	if err != nil {
		c.reply(id, nil, err)
		return true
	}
	res := wire.InspectResult{Holders: toHolders(info.Holders), LastToken: info.LastToken, Queued: info.Queued}
	if len(info.Holders) > 0 {
		res.Locked = true
		m := info.Holders[0].Mode.String()
		res.Mode = &m
	}
	c.replyLarge(id, res)
	return true
}

func (c *conn) breakOp(ctx context.Context, id json.RawMessage, req *request) bool {
	n, err := c.sess.Break(ctx, nameArg(req))
	c.reply(id, wire.BreakResult{Broken: n}, err)
	return true
}

func (c *conn) cancel(_ context.Context, id json.RawMessage, req *request) bool {
	key, ok := idKey(req.Target)
	var p *pendingReq
	if ok {
		c.mu.Lock()
		p = c.pending[key]
		delete(c.pending, key)
		c.mu.Unlock()
	}
	if p != nil {
		// Answer once the acquire has been: its canceled error comes
		// first, and its name is free for the session again. An acquire
		// granted (or ended otherwise) meanwhile was not canceled.
		p.cancel()
		<-p.done
	}
	c.reply(id, wire.CancelResult{Canceled: p != nil && p.canceled}, nil)
	return true
}

func (c *conn) ping(_ context.Context, id json.RawMessage, _ *request) bool {
	c.reply(id, wire.PongResult{Pong: true}, nil)
	return true
}

func (c *conn) bye(ctx context.Context, id json.RawMessage, _ *request) bool {
	c.sess.Bye(ctx, c)
	c.reply(id, struct{}{}, nil)
	return false
}
