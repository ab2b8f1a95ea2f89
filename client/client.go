package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lockagent/lockagent/internal/socketpath"
	"github.com/lockagent/lockagent/internal/wire"
)

// Client is a connection to the agent. Its methods may be called from
// several goroutines; answers are matched to requests by id.
//
// The typed methods (Hello, Acquire, Inspect, Break, Ping, Campaign) cover
// what an application needs; Call sends any op of the protocol. Events
// that belong to a Lease or a Campaign of this client go to it; the others
// arrive on Events.
type Client struct {
	nc         net.Conn
	events     chan Event
	eventsRead atomic.Bool // Events was called: hold events for its reader

	wmu       sync.Mutex // serializes writes
	mu        sync.Mutex // guards nextID, pending, campaigns, leases, settling and err; never held while writing
	nextID    int64
	pending   map[string]pendingCall
	campaigns map[string]*Campaign // by id: their events go to them, not to Events
	leases    map[string]*Lease    // by id: leases of Acquire; their lost events go to them
	// settling has, by name, an acquire that its caller gave up and the
	// agent has not answered yet; the channel is closed once it is
	// answered (and a grant released).
	settling map[string]chan struct{}
	err      error         // why the connection ended
	closing  chan struct{} // closed by Close: stop delivering events
	once     sync.Once
	done     chan struct{}
}

// pendingCall is a request awaiting its response.
type pendingCall struct {
	ch chan response
	// hook, if set, sees the response on the reading goroutine before the
	// next line is read, whatever its ok.
	hook func(body []byte)
	// orphan, if set, keeps the call pending when its caller gives up
	// (its ctx ends): the response then goes to orphan, on the reading
	// goroutine, instead of hook; or nil if the connection ends first.
	orphan    func(body []byte)
	abandoned bool // the caller gave up; guarded by Client.mu
	// abandon, if set, runs with Client.mu held when the caller gives up
	// a call that stays pending (one with orphan).
	abandon func()
	// cancel: a caller giving up sends a cancel request for the call (a
	// waiting acquire).
	cancel bool
}

// Event is an event pushed by the agent (docs/protocol.md, Events).
type Event struct {
	Event    string // lost, elected, backend or shutdown
	Campaign string // elected; lost, of a campaign's term
	Lease    string // lost, elected
	Name     string // lost, elected
	Token    uint64 // lost, elected
	Reason   string // lost
	State    string // backend: degraded or ok
	Message  string // backend, shutdown
}

func toEvent(e wire.Event) Event {
	ev := Event{Event: e.Event, Campaign: e.Campaign, Lease: e.Lease, Name: e.Name, Reason: e.Reason, State: e.State, Message: e.Message}
	if e.Token != nil {
		ev.Token = *e.Token
	}
	return ev
}

// Error is an answer with ok false: the agent refused a request.
type Error struct {
	Code    string     // one of the Code constants: stable, for programs
	Message string     // for people; may change between versions
	Lease   *LeaseInfo // with already_held: the lease the session holds
}

// newError is the Error of e.
func newError(e *wire.Error) *Error {
	err := &Error{Code: e.Code, Message: e.Message}
	if e.Lease != nil {
		l := leaseInfo(*e.Lease)
		err.Lease = &l
	}
	return err
}

// Error codes of the protocol (docs/protocol.md).
const (
	CodeBadRequest         = wire.CodeBadRequest
	CodeUnknownOp          = wire.CodeUnknownOp
	CodeLineTooLong        = wire.CodeLineTooLong
	CodeInvalidName        = wire.CodeInvalidName
	CodeInvalidArgument    = wire.CodeInvalidArgument
	CodeNotHeld            = wire.CodeNotHeld
	CodeAlreadyHeld        = wire.CodeAlreadyHeld
	CodeCanceled           = wire.CodeCanceled
	CodePermissionDenied   = wire.CodePermissionDenied
	CodeLimitExceeded      = wire.CodeLimitExceeded
	CodeSessionExpired     = wire.CodeSessionExpired
	CodeBackendUnavailable = wire.CodeBackendUnavailable
	CodeForeignKey         = wire.CodeForeignKey
	CodeTokensExhausted    = wire.CodeTokensExhausted
	CodeUpgradeFailed      = wire.CodeUpgradeFailed
	CodeShuttingDown       = wire.CodeShuttingDown
	CodeInternal           = wire.CodeInternal
)

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Is reports whether target is an *Error with the same code, so that
// errors.Is(err, ErrNotHeld) matches any not_held answer.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Errors to match answers with errors.Is, for the codes a program acts
// on. Compare Error.Code for the others, which mean a bad request.
var (
	// ErrNotHeld: release or check of a lease the session no longer
	// holds (released, lost); resign of a campaign that has ended.
	ErrNotHeld = &Error{Code: wire.CodeNotHeld, Message: "not held"}
	// ErrAlreadyHeld: an acquire of a name the session holds; the
	// Error's Lease is that lease.
	ErrAlreadyHeld = &Error{Code: wire.CodeAlreadyHeld, Message: "already held"}
	// ErrCanceled: a waiting acquire was cancelled, or its session ended.
	ErrCanceled = &Error{Code: wire.CodeCanceled, Message: "canceled"}
	// ErrPermissionDenied: the agent's access rules refuse the request.
	ErrPermissionDenied = &Error{Code: wire.CodePermissionDenied, Message: "permission denied"}
	// ErrLimitExceeded: one of the agent's limits was reached.
	ErrLimitExceeded = &Error{Code: wire.CodeLimitExceeded, Message: "limit exceeded"}
	// ErrSessionExpired: a resume of a session that has ended, or is not
	// the caller's.
	ErrSessionExpired = &Error{Code: wire.CodeSessionExpired, Message: "session expired"}
	// ErrBackendUnavailable: the agent could not reach its backend.
	ErrBackendUnavailable = &Error{Code: wire.CodeBackendUnavailable, Message: "backend unavailable"}
	// ErrShuttingDown: the agent is stopping.
	ErrShuttingDown = &Error{Code: wire.CodeShuttingDown, Message: "shutting down"}
)

type response struct {
	body []byte
	err  error
}

// ErrClosed matches, with errors.Is, the error of a call on a connection
// that has ended, or that ended before its answer came.
var ErrClosed = errors.New("client: connection closed")

// eventBuffer is how many events the client holds for a reader of Events
// before it stops reading the connection.
const eventBuffer = 1024

// SocketPath is where a client finds the agent: explicit if not empty
// (a -socket flag), else the LOCKAGENT_SOCKET environment variable if set
// and not empty, else the default path, computed as the agent computes
// its own: /run/lockagent/agent.sock for
// root and systemd services, $XDG_RUNTIME_DIR/lockagent.sock, or
// lockagent-UID/agent.sock in the temporary directory.
func SocketPath(explicit string) string {
	if explicit != "" {
		return explicit
	}
	if p := os.Getenv("LOCKAGENT_SOCKET"); p != "" {
		return p
	}
	return socketpath.Default()
}

// Dial connects to the agent at path, or at SocketPath("") if path is
// empty. The session opens with the first request: call Hello first to
// set its options. Its errors are *net.OpError, naming the path.
func Dial(ctx context.Context, path string) (*Client, error) {
	path = SocketPath(path)
	// In the temporary directory, anybody could have made the directory
	// and serve an agent of theirs there.
	if dir := filepath.Dir(path); dir == socketpath.PrivateDir() {
		if err := socketpath.CheckPrivate(dir); err != nil {
			return nil, &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: path, Net: "unix"}, Err: err}
		}
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err // a *net.OpError, naming the path
	}
	c := &Client{nc: nc, events: make(chan Event, eventBuffer), pending: make(map[string]pendingCall),
		closing: make(chan struct{}), done: make(chan struct{})}
	go c.read()
	return c, nil
}

// Events delivers the agent's events that no Lease or Campaign of this
// client takes: backend and shutdown events, and lost events of leases
// not acquired with Acquire (by Call, or before a resume). It is closed
// when the connection ends.
//
// Once Events has been called, the client holds up to 1024 events for its
// reader, then stops reading the connection until there is room: keep
// reading it. Until then, events beyond that many are dropped.
func (c *Client) Events() <-chan Event {
	c.eventsRead.Store(true)
	return c.events
}

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Close closes the connection, whether or not Events was drained.
func (c *Client) Close() error {
	c.once.Do(func() { close(c.closing) })
	err := c.nc.Close()
	<-c.done
	return err
}

func (c *Client) read() {
	defer close(c.done)
	defer close(c.events)
	// The agent's lines have no length limit: a list answer grows with
	// the sessions it shows.
	r := bufio.NewReaderSize(c.nc, 64<<10)
	var rerr error
	var reason *Error // the agent's last error that answers no request
	for {
		var line []byte
		if line, rerr = r.ReadBytes('\n'); rerr != nil {
			break
		}
		var head struct {
			ID    json.RawMessage `json:"id"`
			Event string          `json:"event"`
			Error *wire.Error     `json:"error"`
		}
		if err := json.Unmarshal(line, &head); err != nil {
			continue
		}
		if head.Event != "" {
			var ev wire.Event
			if json.Unmarshal(line, &ev) == nil {
				c.deliver(toEvent(ev))
			}
			continue
		}
		if string(head.ID) == "null" {
			// Why the agent closes the connection: a limit reached, a
			// line too long.
			if head.Error != nil {
				reason = newError(head.Error)
			}
			continue
		}
		c.mu.Lock()
		p, ok := c.pending[string(head.ID)]
		delete(c.pending, string(head.ID))
		c.mu.Unlock()
		if !ok {
			continue
		}
		body := line
		if p.abandoned {
			p.orphan(body)
			continue
		}
		if p.hook != nil {
			p.hook(body)
		}
		p.ch <- response{body: body}
	}
	err := ErrClosed
	switch {
	case reason != nil:
		err = fmt.Errorf("%w: %w", ErrClosed, reason)
	case rerr != io.EOF:
		err = fmt.Errorf("%w: %w", ErrClosed, rerr)
	}
	c.mu.Lock()
	c.err = err
	var orphans []func([]byte)
	for id, p := range c.pending {
		if p.abandoned {
			orphans = append(orphans, p.orphan)
		} else {
			p.ch <- response{err: err}
		}
		delete(c.pending, id)
	}
	campaigns, leases := c.campaigns, c.leases
	c.campaigns, c.leases = nil, nil
	c.mu.Unlock()
	for _, orphan := range orphans {
		orphan(nil)
	}
	for _, cp := range campaigns {
		cp.finish("connection closed")
	}
	for _, l := range leases {
		l.end("connection closed")
	}
}

// deliver hands an event to its campaign, to its lease, or to Events.
func (c *Client) deliver(ev Event) {
	c.mu.Lock()
	cp := c.campaigns[ev.Campaign]
	l := c.leases[ev.Lease]
	if ev.Event == "lost" && l != nil {
		delete(c.leases, ev.Lease)
	} else {
		l = nil
	}
	c.mu.Unlock()
	switch {
	case cp != nil:
		cp.deliver(ev, c.closing)
	case l != nil:
		l.end(ev.Reason)
	case c.eventsRead.Load():
		select {
		case c.events <- ev:
		case <-c.closing:
		}
	default:
		select {
		case c.events <- ev:
		default: // nobody reads Events, and it is full
		}
	}
}

// Call sends op with args (a map or struct whose fields are the request's
// arguments; nil for none) and decodes the result into result (may be nil).
// An answer with ok false is an *Error.
func (c *Client) Call(ctx context.Context, op string, args any, result any) error {
	return c.call(ctx, op, args, result, nil)
}

// call is Call with a hook (see pendingCall).
func (c *Client) call(ctx context.Context, op string, args any, result any, hook func([]byte)) error {
	return c.do(ctx, op, args, result, pendingCall{hook: hook})
}

// do sends a request, registered as p, and waits for its response or
// the end of ctx (see pendingCall for what happens then).
func (c *Client) do(ctx context.Context, op string, args any, result any, p pendingCall) error {
	p.ch = make(chan response, 1)
	id, err := c.send(op, args, p)
	if err != nil {
		return err
	}
	var r response
	select {
	case r = <-p.ch:
	case <-ctx.Done():
		c.mu.Lock()
		q, waiting := c.pending[id]
		switch {
		case !waiting: // the response is being handled: take it
		case p.orphan != nil:
			q.abandoned = true
			c.pending[id] = q
			if p.abandon != nil {
				p.abandon()
			}
		default:
			delete(c.pending, id)
		}
		c.mu.Unlock()
		if waiting {
			if p.cancel {
				c.post("cancel", map[string]any{"target": json.Number(id)})
			}
			return ctx.Err()
		}
		r = <-p.ch
	}
	if r.err != nil {
		return fmt.Errorf("%s: %w", op, r.err)
	}
	return decodeResponse(r.body, result)
}

// post sends a request whose response nobody awaits. It may be called on
// the reading goroutine: the agent reads requests whether or not its
// answers are read, so the write does not wait for this goroutine.
func (c *Client) post(op string, args any) {
	c.send(op, args, pendingCall{abandoned: true, orphan: func([]byte) {}})
}

// send registers p and writes the request; it returns the request's id.
func (c *Client) send(op string, args any, p pendingCall) (string, error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return "", c.err
	}
	c.nextID++
	id := strconv.FormatInt(c.nextID, 10)
	line, err := requestLine(id, op, args)
	if err != nil {
		c.mu.Unlock()
		return "", err
	}
	c.pending[id] = p
	c.mu.Unlock()
	c.wmu.Lock()
	_, err = c.nc.Write(line)
	c.wmu.Unlock()
	if err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		// A post may be on the reading goroutine, which must not wait for
		// itself.
		return "", fmt.Errorf("%s: %w", op, c.writeFailed(err, !p.abandoned))
	}
	return id, nil
}

// writeFailed is the error of a write that failed with err. When the
// agent closed the connection, it may have said why first (a limit
// reached): the reading goroutine soon reads that, and its reason is the
// error, if wait lets the caller wait for it.
func (c *Client) writeFailed(err error, wait bool) error {
	if !wait || !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		return err
	}
	t := time.NewTimer(closeReasonWait)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var reason *Error
	if !errors.As(c.err, &reason) {
		return err
	}
	return c.err
}

// closeReasonWait bounds how long a failed write waits for the agent's
// reason for closing the connection.
const closeReasonWait = time.Second

// requestLine builds {"id":id,"op":op,...args}.
func requestLine(id, op string, args any) ([]byte, error) {
	m := map[string]any{}
	if args != nil {
		b, err := json.Marshal(args)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%s: arguments are not an object: %w", op, err)
		}
	}
	m["id"] = json.Number(id)
	m["op"] = op
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return append(b, '\n'), nil
}

func decodeResponse(body []byte, result any) error {
	var head struct {
		OK    bool        `json:"ok"`
		Error *wire.Error `json:"error"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		return fmt.Errorf("bad response: %w", err)
	}
	if !head.OK {
		if head.Error == nil {
			return errors.New("bad response: ok is false without an error")
		}
		return newError(head.Error)
	}
	if result == nil {
		return nil
	}
	return json.Unmarshal(body, result)
}
