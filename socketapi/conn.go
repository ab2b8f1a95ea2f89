package socketapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
)

// conn is one client connection: a read loop that decodes and dispatches
// requests, and exactly one writer at a time that drains a bounded queue of
// responses and events.
type conn struct {
	srv  *Server
	nc   *net.UnixConn
	fd   int32       // nc's descriptor, for idle; -1: unknown
	idle *idlePoller // where the connection waits while idle; nil: none
	out  *output     // what is written to the peer
	peer agent.Peer
	log  hclog.Logger
	ctx  context.Context // the connection's own (see end)

	// Owned by the read loop.
	sess         *agent.Session
	heartbeat    time.Duration
	lr           lineReader
	hbDeadline   time.Time // when the heartbeat runs out; zero: none
	lineDeadline time.Time // when the line begun must end; zero: none
	readDeadline time.Time // the socket's
	ended        func()    // called once the connection is over

	// mu guards the pending requests. It is never held while calling the
	// agent.
	mu      sync.Mutex
	pending map[string]*pendingReq // cancellable requests by id key
	reqWG   sync.WaitGroup         // request goroutines

	// end ends the connection's context, and with it every request in
	// flight: when the connection ends, and when the agent closes it (its
	// session ended, or another connection resumed it).
	end context.CancelFunc
}

// newConn returns the connection of nc, a socket accepted from peer, whose
// context end ends.
func newConn(s *Server, nc *net.UnixConn, idle *idlePoller, peer agent.Peer, end context.CancelFunc) *conn {
	fd, raw := descriptor(nc)
	c := &conn{srv: s, nc: nc, fd: fd, idle: idle, log: s.Logger, end: end, peer: peer}
	c.out = &output{
		w:        newLineWriter(nc, raw, s.WriteTimeout),
		maxBytes: s.MaxQueueBytes,
		budget:   s.budget,
		uid:      peer.UID,
		closeSocket: func() {
			// A parked connection is first taken out of the idle
			// poller, before its descriptor can be reused, and its read
			// loop started: it finds the socket closed and finishes the
			// connection.
			if c.idle != nil {
				c.idle.unpark(c.fd)
			}
			c.nc.Close()
		},
		warn: func(msg string, args ...any) {
			s.PeerLog.Log(s.Logger, hclog.Warn, c.peer.UID, msg, append([]any{"pid", c.peer.PID, "uid", c.peer.UID}, args...)...)
		},
		debug: func(msg string, args ...any) {
			c.log.Debug(msg, append([]any{"pid", c.peer.PID, "uid", c.peer.UID}, args...)...)
		},
	}
	return c
}

// pendingReq is a waiting acquire that cancel can name.
type pendingReq struct {
	cancel   context.CancelFunc
	done     chan struct{} // closed once the acquire is answered
	canceled bool          // it was answered canceled; set before done is closed
}

// serve starts the connection's read loop and returns; once the
// connection has ended and every goroutine it started has finished, ended
// is called. ctx is the connection's own (see cancel).
func (c *conn) serve(ctx context.Context, ended func()) {
	groups, err := c.srv.groups.groups(c.peer.UID)
	if err != nil {
		// The peer keeps its primary group only: rules can match less,
		// never more.
		c.srv.PeerLog.Log(c.srv.Logger, hclog.Warn, c.peer.UID, "cannot read the groups of the peer's uid", "pid", c.peer.PID, "uid", c.peer.UID, "error", err)
	}
	c.peer.Groups = groups
	c.ctx, c.ended = ctx, ended
	c.lr = lineReader{r: c.nc, max: c.srv.MaxLineBytes, begun: c.lineBegun}
	c.armHeartbeat()
	go c.readLoop()
}

// armHeartbeat starts the wait for the next request: it must come within
// the heartbeat, if the session has one.
func (c *conn) armHeartbeat() {
	c.hbDeadline = time.Time{}
	if c.heartbeat > 0 {
		c.hbDeadline = time.Now().Add(c.heartbeat)
	}
}

// lineBegun arms the line's own deadline: a line begun must end within
// LineTimeout (and before the heartbeat runs out), so that a peer that
// trickles bytes cannot hold its connection.
func (c *conn) lineBegun() {
	c.lineDeadline = time.Now().Add(c.srv.LineTimeout)
	c.setReadDeadline(soonest(c.hbDeadline, c.lineDeadline))
}

// setReadDeadline sets the socket's read deadline, unless it is set
// already.
func (c *conn) setReadDeadline(t time.Time) {
	if !t.Equal(c.readDeadline) {
		c.readDeadline = t
		c.nc.SetReadDeadline(t)
	}
}

// readLoop reads and handles requests until the connection ends.
//
// Handling a request grows the goroutine's stack to several KiB, which the
// runtime gives back only a half at a time at each garbage collection:
// thousands of idle connections would each keep that much. So a read loop
// that is waiting for a request Server.IdleHandoff after the first it
// handled returns, and the connection waits without a goroutine (see
// park).
func (c *conn) readLoop() {
	ctx := c.ctx
	var idle time.Time // when to park, once a request was handled
	for {
		c.lineDeadline = time.Time{}
		c.setReadDeadline(soonest(c.hbDeadline, idle))
		line, err := c.lr.readLine()
		if err != nil {
			if c.idleTimeout(err, idle) {
				c.lr.idle()
				c.park()
				return
			}
			c.readFailed(err)
			break
		}
		if ctx.Err() != nil {
			break // closed by the agent: what was read is not its session's any more
		}
		if len(bytes.Trim(line, " \t")) == 0 {
			c.armHeartbeat() // a blank line is a line all the same
			continue
		}
		if !c.handle(ctx, line) {
			break
		}
		if idle.IsZero() {
			// Armed once, not for every request: a busy connection
			// moves to a new goroutine once in a while, at no cost.
			idle = time.Now().Add(c.srv.IdleHandoff)
		}
		c.armHeartbeat()
	}
	c.finish()
}

// park hands the wait for the next request over to the server's idle
// poller, which starts a new read loop when the peer writes or hangs up,
// or the connection is closed. A connection with a heartbeat, whose
// deadline the read loop keeps, or one the poller cannot take, goes on
// waiting in a new goroutine, whose stack starts small again.
func (c *conn) park() {
	if c.hbDeadline.IsZero() && c.idle != nil && c.fd >= 0 {
		// While the socket is sure to stay open: it is unparked before
		// it is closed (newConn).
		if c.out.whileOpen(func() bool { return c.idle.park(c.fd, c.readLoop) }) {
			return
		}
	}
	go c.readLoop()
}

// idleTimeout tells whether err is the end of the idle wait that ends at
// idle (if set), rather than of the heartbeat or of a line begun.
func (c *conn) idleTimeout(err error, idle time.Time) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout() && !idle.IsZero() && c.lineDeadline.IsZero() &&
		(c.hbDeadline.IsZero() || idle.Before(c.hbDeadline))
}

// readFailed logs why reading ended, and answers a line too long.
func (c *conn) readFailed(err error) {
	if errors.Is(err, errLineTooLong) {
		c.srv.PeerLog.Log(c.srv.Logger, hclog.Warn, c.peer.UID, "line too long; connection closed", "pid", c.peer.PID, "uid", c.peer.UID, "max", c.srv.MaxLineBytes)
		c.out.enqueue(encodeError(nil, CodeLineTooLong, fmt.Sprintf("a line is at most %d bytes", c.srv.MaxLineBytes), nil), true)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		if !c.lineDeadline.IsZero() && (c.hbDeadline.IsZero() || c.lineDeadline.Before(c.hbDeadline)) {
			c.srv.PeerLog.Log(c.srv.Logger, hclog.Warn, c.peer.UID, "line not completed in time; connection closed", "pid", c.peer.PID, "uid", c.peer.UID, "line_timeout", c.srv.LineTimeout)
		} else {
			c.log.Debug("heartbeat missed; connection dropped", "pid", c.peer.PID, "uid", c.peer.UID, "heartbeat", c.heartbeat)
		}
	}
}

// finish ends the connection once reading has: it abandons the pending
// requests, detaches the connection so that events go to the session's
// backlog and its connection-scoped leases are released, then flushes and
// closes, waits for every goroutine the connection started, and calls
// ended.
func (c *conn) finish() {
	c.end()
	if c.sess != nil {
		c.sess.Detach(c)
	}
	c.reqWG.Wait()
	c.Close()
	c.out.writers.Wait()
	c.ended()
}

// Send queues an event; part of agent.Conn.
func (c *conn) Send(ev agent.Event) { c.out.send(encodeEvent(ev)) }

// Written returns a channel closed once every line queued so far, events
// held back included, has been written, or the connection has closed;
// part of agent.Conn.
func (c *conn) Written() <-chan struct{} { return c.out.written() }

// Close closes the connection once what is queued is written; part of
// agent.Conn. It does not block.
func (c *conn) Close() {
	c.end()
	c.out.close()
}

// reply sends a response; a nil result error sends the error's code.
func (c *conn) reply(id json.RawMessage, result any, err error) {
	if err != nil {
		c.out.enqueue(c.errorLine(id, err), true)
		return
	}
	c.out.enqueue(encodeOK(id, result), true)
}

func (c *conn) errorLine(id json.RawMessage, err error) []byte {
	code, known := errorCode(err)
	if !known {
		c.srv.PeerLog.Log(c.srv.Logger, hclog.Error, c.peer.UID, "internal error", "pid", c.peer.PID, "uid", c.peer.UID, "error", err)
		return encodeError(id, CodeInternal, "internal error", nil)
	}
	if code == CodePermissionDenied || code == CodeLimitExceeded {
		c.srv.PeerLog.Log(c.srv.Logger, hclog.Warn, c.peer.UID, "request refused", "pid", c.peer.PID, "uid", c.peer.UID, "code", code, "error", err)
	}
	var ah *agent.AlreadyHeldError
	if errors.As(err, &ah) {
		l := toLeaseJSON(ah.Lease)
		return encodeError(id, code, err.Error(), &l)
	}
	return encodeError(id, code, err.Error(), nil)
}

// handle decodes and runs one request line. It returns false when the
// connection must end.
func (c *conn) handle(ctx context.Context, line []byte) bool {
	if !utf8.Valid(line) {
		c.out.enqueue(encodeError(nil, CodeBadRequest, "a request is UTF-8", nil), true)
		return true
	}
	if loneSurrogate(line) {
		c.out.enqueue(encodeError(nil, CodeBadRequest, "a request is Unicode text: a string escapes a lone surrogate", nil), true)
		return true
	}
	var req request
	if err := decodeRequest(line, &req); err != nil {
		id := req.ID
		if err.code == CodeBadRequest || !validID(id) {
			id = nil
		}
		c.out.enqueue(encodeError(id, err.code, err.msg, nil), true)
		return true
	}
	if !validID(req.ID) {
		c.out.enqueue(encodeError(nil, CodeBadRequest, "id must be a string or an integer", nil), true)
		return true
	}
	id := req.ID
	if id == nil {
		id = nullID
	}
	if req.Op == "" {
		c.out.enqueue(encodeError(id, CodeBadRequest, "op is required", nil), true)
		return true
	}

	if req.Op == "hello" {
		if c.sess != nil {
			c.out.enqueue(encodeError(id, CodeBadRequest, "hello must be the first request", nil), true)
			return true
		}
		c.out.hold()
		res, err := c.hello(&req)
		c.reply(id, res, err)
		c.out.release()
		// Without a session the connection is of no use.
		return !errors.Is(err, agent.ErrLimitExceeded)
	}
	op, known := ops[req.Op]
	if !known {
		c.out.enqueue(encodeError(id, CodeUnknownOp, fmt.Sprintf("unknown op %q", req.Op), nil), true)
		return true
	}
	if c.sess == nil {
		s, err := c.srv.Agent.Open(c.peer, agent.SessionOptions{}, c)
		if err != nil {
			if req.Op == "acquire" {
				mode, _ := parseMode(req.Mode) // exclusive if it is not a mode
				c.srv.Agent.Refused(mode, err)
			}
			c.reply(id, nil, err)
			// Without a session the connection is of no use.
			return !errors.Is(err, agent.ErrLimitExceeded)
		}
		c.sess = s
	}
	c.sess.LoseOverdue()
	return op(c, ctx, id, &req)
}

// ops runs every op but hello. An op returns false to end the connection.
var ops = map[string]func(c *conn, ctx context.Context, id json.RawMessage, req *request) bool{
	"acquire": (*conn).acquire,
	"release": (*conn).release,
	"check":   (*conn).check,
	"inspect": (*conn).inspect,
	"list":    (*conn).list,
	"break":   (*conn).breakOp,
	"cancel":  (*conn).cancel,
	"ping":    (*conn).ping,
	"status":  (*conn).status,
	"bye":     (*conn).bye,

	"campaign": (*conn).campaign,
	"resign":   (*conn).resign,
}

// opNames are the names of the ops, which a request's op is set to
// rather than to a copy of its own.
var opNames = func() map[string]string {
	names := map[string]string{"hello": "hello"}
	for name := range ops {
		names[name] = name
	}
	return names
}()

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
	return helloResult{
		Session:     s.ID(),
		ResumeToken: s.ResumeToken(),
		Resumed:     req.Resume != nil,
		Agent: agentInfo{
			Version:      info.Version,
			Backend:      info.Backend,
			MaxLineBytes: c.srv.MaxLineBytes,
			TTLMs:        ttlBounds{info.DefaultTTL.Milliseconds(), info.MinTTL.Milliseconds(), info.MaxTTL.Milliseconds()},
		},
	}, nil
}

func parseMode(s *string) (backend.Mode, error) {
	switch {
	case s == nil || *s == "exclusive":
		return backend.Exclusive, nil
	case *s == "shared":
		return backend.Shared, nil
	}
	return 0, fmt.Errorf("%w: mode must be exclusive or shared", agent.ErrInvalidArgument)
}

func parseScope(s *string) (agent.Scope, error) {
	switch {
	case s == nil || *s == "connection":
		return agent.ScopeConnection, nil
	case *s == "session":
		return agent.ScopeSession, nil
	}
	return 0, fmt.Errorf("%w: scope must be connection or session", agent.ErrInvalidArgument)
}

// maxMillis bounds every *_ms argument, so that converting it to a
// time.Duration cannot overflow.
const maxMillis = int64(1<<63-1) / int64(time.Millisecond)

func millis(field string, v *int64) (time.Duration, error) {
	if v == nil {
		return 0, nil
	}
	if *v > maxMillis || *v < -maxMillis {
		return 0, fmt.Errorf("%w: %s is out of range", agent.ErrInvalidArgument, field)
	}
	return time.Duration(*v) * time.Millisecond, nil
}

func (c *conn) parseAcquire(req *request) (agent.AcquireRequest, error) {
	var ar agent.AcquireRequest
	var err error
	if req.Name == nil {
		return ar, fmt.Errorf("%w: name is required", agent.ErrInvalidName)
	}
	ar.Name = *req.Name
	if ar.Mode, err = parseMode(req.Mode); err != nil {
		return ar, err
	}
	if ar.Scope, err = parseScope(req.Scope); err != nil {
		return ar, err
	}
	if req.Limit != nil {
		if *req.Limit < 1 || *req.Limit > 1<<31 {
			return ar, fmt.Errorf("%w: limit must be a positive integer", agent.ErrInvalidArgument)
		}
		ar.Limit = int(*req.Limit)
	}
	if ar.TTL, err = millis("ttl_ms", req.TTLMs); err != nil {
		return ar, err
	}
	if req.TTLMs != nil && *req.TTLMs <= 0 {
		return ar, fmt.Errorf("%w: ttl_ms must be positive", agent.ErrInvalidArgument)
	}
	if ar.Wait, err = millis("wait_ms", req.WaitMs); err != nil {
		return ar, err
	}
	if req.WaitMs != nil && *req.WaitMs < 0 {
		if *req.WaitMs != -1 {
			return ar, fmt.Errorf("%w: wait_ms must be -1, 0 or positive", agent.ErrInvalidArgument)
		}
		ar.Wait = agent.WaitForever
	}
	if req.Meta != nil {
		ar.Meta = *req.Meta
	}
	return ar, nil
}

// acquire answers a try (wait_ms 0) at once, like the other ops. A waiting
// acquire runs in its own goroutine, so that it never delays the
// connection's other requests, and can be cancelled by its id.
func (c *conn) acquire(ctx context.Context, id json.RawMessage, req *request) bool {
	ar, err := c.parseAcquire(req)
	if err != nil {
		mode, _ := parseMode(req.Mode) // exclusive if it is not a mode
		c.srv.Agent.Refused(mode, err)
		c.reply(id, nil, err)
		return true
	}
	// The grant is queued with the agent's lock held, so that it goes out
	// before any event of the new lease.
	ar.Granted = func(l agent.Lease) {
		c.out.queue(encodeOK(id, grantedResult{Acquired: true, leaseJSON: toLeaseJSON(l)}))
	}
	ar.Conn = c // refused once a resume took the session
	if ar.Wait == 0 {
		res, err := c.sess.Acquire(ctx, ar)
		c.replyAcquire(id, res, err)
		return true
	}
	ctx, cancel := context.WithCancel(ctx)
	key, cancellable := idKey(id)
	p := &pendingReq{cancel: cancel, done: make(chan struct{})}
	c.mu.Lock()
	if cancellable {
		if _, dup := c.pending[key]; dup {
			c.mu.Unlock()
			cancel()
			err := fmt.Errorf("%w: id is already used by a pending request", agent.ErrInvalidArgument)
			c.srv.Agent.Refused(ar.Mode, err)
			c.reply(id, nil, err)
			return true
		}
		if c.pending == nil {
			c.pending = make(map[string]*pendingReq)
		}
		c.pending[key] = p
	}
	c.mu.Unlock()
	// Its place is taken now, so that the requests read after it come
	// after it, then it runs on its own.
	acq := c.sess.Begin(ar)
	c.reqWG.Add(1)
	go func() {
		defer c.reqWG.Done()
		defer cancel()
		res, err := acq.Run(ctx)
		if cancellable {
			c.mu.Lock()
			if c.pending[key] == p {
				delete(c.pending, key)
			}
			c.mu.Unlock()
		}
		c.replyAcquire(id, res, err)
		p.canceled = errors.Is(err, context.Canceled)
		close(p.done)
	}()
	return true
}

// replyAcquire answers an acquire; a grant is already queued (Granted).
func (c *conn) replyAcquire(id json.RawMessage, res agent.AcquireResult, err error) {
	switch {
	case err != nil:
		c.reply(id, nil, err)
	case res.Acquired:
		c.out.enqueue(nil, true)
	default:
		c.replyLarge(id, deniedResult{Reason: res.Reason, Holders: toHolders(res.Holders)})
	}
}

func leaseArg(req *request) (string, error) {
	if req.Lease == nil {
		return "", fmt.Errorf("%w: lease is required", agent.ErrNotHeld)
	}
	return *req.Lease, nil
}

func (c *conn) release(ctx context.Context, id json.RawMessage, req *request) bool {
	l, err := leaseArg(req)
	if err == nil {
		err = c.sess.Release(ctx, l)
	}
	c.reply(id, releaseResult{Released: true}, err)
	return true
}

func (c *conn) check(ctx context.Context, id json.RawMessage, req *request) bool {
	l, err := leaseArg(req)
	var res agent.CheckResult
	if err == nil {
		res, err = c.sess.Check(ctx, l)
	}
	c.reply(id, checkResult{Held: res.Held, Token: res.Token, ExpiresInMs: res.ExpiresIn.Milliseconds()}, err)
	return true
}

func (c *conn) inspect(ctx context.Context, id json.RawMessage, req *request) bool {
	if req.Name == nil {
		c.reply(id, nil, fmt.Errorf("%w: name is required", agent.ErrInvalidName))
		return true
	}
	info, err := c.sess.Inspect(ctx, *req.Name)
	if err != nil {
		c.reply(id, nil, err)
		return true
	}
	res := inspectResult{Holders: toHolders(info.Holders), LastToken: info.LastToken, Queued: info.Queued}
	if len(info.Holders) > 0 {
		res.Locked = true
		m := info.Holders[0].Mode.String()
		res.Mode = &m
	}
	c.replyLarge(id, res)
	return true
}

// listChunk is how many sessions list asks the agent for at a time.
const listChunk = 256

// listPageBytes bounds a list answer with a limit: it ends before a
// session that would take it past this size (but never before its first
// session), and next says where to go on.
const listPageBytes = 256 << 10

// list answers with the sessions asked for, encoded a chunk at a time and
// charged to the output budget as the answer grows. The lists of one uid
// are built one at a time.
func (c *conn) list(ctx context.Context, id json.RawMessage, req *request) bool {
	all := req.All != nil && *req.All
	limit := 0 // every session
	if req.Limit != nil {
		if *req.Limit < 1 || *req.Limit > 1<<31 {
			c.reply(id, nil, fmt.Errorf("%w: limit must be a positive integer", agent.ErrInvalidArgument))
			return true
		}
		limit = int(*req.Limit)
	}
	after := ""
	if req.After != nil {
		after = *req.After
	}
	release, err := c.srv.lists.take(ctx, c.peer.UID)
	if err != nil {
		return false // the connection is ending
	}
	line := c.buildList(id, all, limit, after)
	release()
	c.out.put(line, true)
	return true
}

// buildList builds list's answer, or the error that goes in its place,
// charged to the output budget.
func (c *conn) buildList(id json.RawMessage, all bool, limit int, after string) []byte {
	ans := answerBuf{o: c.out}
	if !ans.add([]byte(`{"id":`), id, []byte(`,"ok":true,"sessions":[`)) {
		return c.refused(id, 0)
	}
	n, next := 0, ""
	for next == "" {
		chunk := listChunk
		if limit > 0 {
			chunk = min(chunk, limit-n)
		}
		infos, more, err := c.sess.List(agent.ListRequest{All: all, After: after, Limit: chunk})
		if err != nil {
			ans.drop()
			line := c.errorLine(id, err)
			c.out.charge(len(line), false)
			return line
		}
		for _, si := range infos {
			sj := marshalValue(toSessionJSON(si))
			if limit > 0 && n > 0 && len(ans.b)+len(sj) > listPageBytes {
				next = after
				break
			}
			sep := []byte{','}
			if n == 0 {
				sep = nil
			}
			if !ans.add(sep, sj) {
				size := len(ans.b) + len(sj)
				ans.drop()
				return c.refused(id, size)
			}
			n++
			after = si.ID
		}
		if !more {
			break
		}
		if limit > 0 && n == limit {
			next = after
		}
	}
	nextJSON := []byte("null")
	if next != "" {
		nextJSON = appendString(nil, next)
	}
	if !ans.add([]byte(`],"next":`), nextJSON, []byte("}\n")) {
		size := len(ans.b)
		ans.drop()
		return c.refused(id, size)
	}
	return ans.b
}

// refused is tooLarge's line, charged.
func (c *conn) refused(id json.RawMessage, size int) []byte {
	line := c.tooLarge(id, size)
	c.out.charge(len(line), false)
	return line
}

// tooLarge is the answer that goes in place of one of size bytes (0: not
// known) that the output budget has no room for.
func (c *conn) tooLarge(id json.RawMessage, size int) []byte {
	c.srv.PeerLog.Log(c.srv.Logger, hclog.Warn, c.peer.UID, "answer refused: no room for it in the output budget", "pid", c.peer.PID, "uid", c.peer.UID, "size", size)
	return encodeError(id, CodeLimitExceeded, fmt.Sprintf("the answer does not fit the room the agent keeps for output not yet read by uid %d: read what it sent, or ask for less (list with a limit)", c.peer.UID), nil)
}

// replyLarge sends the result of an op that changes nothing and may be
// large (inspect, a denied acquire's holders): if the output budget has
// no room for it, a limit_exceeded error goes instead.
func (c *conn) replyLarge(id json.RawMessage, result any) {
	c.out.answer(encodeOK(id, result), func(size int) []byte { return c.tooLarge(id, size) })
}

func (c *conn) breakOp(ctx context.Context, id json.RawMessage, req *request) bool {
	if req.Name == nil {
		c.reply(id, nil, fmt.Errorf("%w: name is required", agent.ErrInvalidName))
		return true
	}
	n, err := c.sess.Break(ctx, *req.Name)
	c.reply(id, breakResult{Broken: n}, err)
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
	c.reply(id, cancelResult{Canceled: p != nil && p.canceled}, nil)
	return true
}

func (c *conn) ping(_ context.Context, id json.RawMessage, _ *request) bool {
	c.reply(id, pongResult{Pong: true}, nil)
	return true
}

func (c *conn) bye(ctx context.Context, id json.RawMessage, _ *request) bool {
	c.sess.Bye(ctx, c)
	c.reply(id, struct{}{}, nil)
	return false
}

// soonest is the earlier of two deadlines, where the zero time is none.
func soonest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
