package socketapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// Client is a Go client of the wire protocol, used by ctl, run and the
// tests. Requests may be made from several goroutines; responses are matched
// to them by id. Events arrive on Events.
type Client struct {
	nc     net.Conn
	events chan Event

	wmu       sync.Mutex // serializes writes
	mu        sync.Mutex // guards nextID, pending, campaigns and err; never held while writing
	nextID    int64
	pending   map[string]pendingCall
	campaigns map[string]*Campaign // by id: their events go to them, not to Events
	err       error                // why the connection ended
	closing   chan struct{}        // closed by Close: stop delivering events
	once      sync.Once
	done      chan struct{}
}

// pendingCall is a request awaiting its response. hook, if set, sees a
// successful response on the reading goroutine before the next line is
// read.
type pendingCall struct {
	ch   chan response
	hook func(body []byte)
}

// Event is an event pushed by the agent.
type Event struct {
	Event    string `json:"event"`
	Campaign string `json:"campaign"`
	Lease    string `json:"lease"`
	Name     string `json:"name"`
	Token    uint64 `json:"token"`
	Reason   string `json:"reason"`
	State    string `json:"state"`
	Message  string `json:"message"`
}

// Error is a response with ok false.
type Error struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Lease   json.RawMessage `json:"lease,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

type response struct {
	body []byte
	err  error
}

// ErrClosed is returned for calls on a connection that has ended.
var ErrClosed = errors.New("socketapi: connection closed")

// eventBuffer is how many events the client holds for a reader of Events
// before it stops reading the connection.
const eventBuffer = 1024

// Dial connects to the agent at path.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", path, err)
	}
	c := &Client{nc: nc, events: make(chan Event, eventBuffer), pending: make(map[string]pendingCall),
		closing: make(chan struct{}), done: make(chan struct{})}
	go c.read()
	return c, nil
}

// Events delivers the agent's events. It is closed when the connection ends.
func (c *Client) Events() <-chan Event { return c.events }

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
	sc := bufio.NewScanner(c.nc)
	sc.Buffer(make([]byte, 4096), 16<<20)
	for sc.Scan() {
		var head struct {
			ID    json.RawMessage `json:"id"`
			Event string          `json:"event"`
		}
		line := sc.Bytes()
		if err := json.Unmarshal(line, &head); err != nil {
			continue
		}
		if head.Event != "" {
			var ev Event
			if json.Unmarshal(line, &ev) != nil {
				continue
			}
			c.mu.Lock()
			cp := c.campaigns[ev.Campaign]
			c.mu.Unlock()
			if cp != nil {
				cp.deliver(ev, c.closing)
				continue
			}
			select {
			case c.events <- ev:
			case <-c.closing:
			}
			continue
		}
		c.mu.Lock()
		p, ok := c.pending[string(head.ID)]
		delete(c.pending, string(head.ID))
		c.mu.Unlock()
		if ok {
			body := append([]byte(nil), line...)
			if p.hook != nil {
				p.hook(body)
			}
			p.ch <- response{body: body}
		}
	}
	err := sc.Err()
	if err == nil {
		err = ErrClosed
	}
	c.mu.Lock()
	c.err = err
	for id, p := range c.pending {
		p.ch <- response{err: err}
		delete(c.pending, id)
	}
	campaigns := c.campaigns
	c.campaigns = nil
	c.mu.Unlock()
	for _, cp := range campaigns {
		cp.finish("connection closed")
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
	ch := make(chan response, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return c.err
	}
	c.nextID++
	id := strconv.FormatInt(c.nextID, 10)
	line, err := requestLine(id, op, args)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	c.pending[id] = pendingCall{ch: ch, hook: hook}
	c.mu.Unlock()
	c.wmu.Lock()
	_, err = c.nc.Write(line)
	c.wmu.Unlock()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	select {
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return ctx.Err()
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("%s: %w", op, r.err)
		}
		return decodeResponse(r.body, result)
	}
}

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
		OK    bool   `json:"ok"`
		Error *Error `json:"error"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		return fmt.Errorf("bad response: %w", err)
	}
	if !head.OK {
		if head.Error == nil {
			return errors.New("bad response: ok is false without an error")
		}
		return head.Error
	}
	if result == nil {
		return nil
	}
	return json.Unmarshal(body, result)
}
