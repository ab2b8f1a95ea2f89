package socketapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/internal/wire"
)

// The dispatch of a request line to its op, and the answers' lines.

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
		return encodeError(id, wire.CodeInternal, "internal error", nil)
	}
	if code == wire.CodePermissionDenied || code == wire.CodeLimitExceeded {
		c.srv.PeerLog.Log(c.srv.Logger, hclog.Warn, c.peer.UID, "request refused", "pid", c.peer.PID, "uid", c.peer.UID, "code", code, "error", err)
	}
	var ah *agent.AlreadyHeldError
	if errors.As(err, &ah) {
		l := toLease(ah.Lease)
		return encodeError(id, code, err.Error(), &l)
	}
	var ae *agent.ArgError
	if errors.As(err, &ae) {
		return encodeError(id, code, argMessage(ae), nil)
	}
	return encodeError(id, code, err.Error(), nil)
}

// requests holds request values not in use (see handle).
var requests = sync.Pool{New: func() any { return new(request) }}

// handle decodes and runs one request line. It returns false when the
// connection must end.
func (c *conn) handle(ctx context.Context, line []byte) bool {
	if !utf8.Valid(line) {
		c.out.enqueue(encodeError(nil, wire.CodeBadRequest, "a request is UTF-8", nil), true)
		return true
	}
	if loneSurrogate(line) {
		c.out.enqueue(encodeError(nil, wire.CodeBadRequest, "a request is Unicode text: a string escapes a lone surrogate", nil), true)
		return true
	}
	// Request values are reused: the ops copy what they keep (an id and
	// a target are copies of the line already), and strings do not
	// change.
	req := requests.Get().(*request)
	defer func() {
		*req = request{}
		requests.Put(req)
	}()
	if err := decodeRequest(line, req); err != nil {
		id := req.ID
		if err.code == wire.CodeBadRequest || !validID(id) {
			id = nil
		}
		c.out.enqueue(encodeError(id, err.code, err.msg, nil), true)
		return true
	}
	if !validID(req.ID) {
		c.out.enqueue(encodeError(nil, wire.CodeBadRequest, "id must be a string or an integer", nil), true)
		return true
	}
	id := req.ID
	if id == nil {
		id = nullID
	}
	if req.Op == "" {
		c.out.enqueue(encodeError(id, wire.CodeBadRequest, "op is required", nil), true)
		return true
	}

	if req.Op == "hello" {
		if c.sess != nil {
			c.out.enqueue(encodeError(id, wire.CodeBadRequest, "hello must be the first request", nil), true)
			return true
		}
		c.out.hold()
		res, err := c.hello(req)
		c.reply(id, res, err)
		c.out.release()
		// Without a session the connection is of no use.
		return !errors.Is(err, agent.ErrLimitExceeded)
	}
	op, known := ops[req.Op]
	if !known {
		c.out.enqueue(encodeError(id, wire.CodeUnknownOp, fmt.Sprintf("unknown op %q", req.Op), nil), true)
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
	return op(c, ctx, id, req)
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
	"upgrade":  (*conn).upgrade,
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

// tooLarge is the answer that goes in place of one of size bytes (0: not
// known) that the output budget has no room for.
func (c *conn) tooLarge(id json.RawMessage, size int) []byte {
	if c.srv.Observer != nil {
		c.srv.Observer.AnswerRefused()
	}
	c.srv.PeerLog.Log(c.srv.Logger, hclog.Warn, c.peer.UID, "answer refused: no room for it in the output budget", "pid", c.peer.PID, "uid", c.peer.UID, "size", size)
	return encodeError(id, wire.CodeLimitExceeded, fmt.Sprintf("the answer does not fit the room the agent keeps for output not yet read by uid %d: read what it sent, or ask for less (list with a limit)", c.peer.UID), nil)
}

// replyLarge sends the result of an op that changes nothing and may be
// large (inspect, a denied acquire's holders): if the output budget has
// no room for it, a limit_exceeded error goes instead.
func (c *conn) replyLarge(id json.RawMessage, result any) {
	c.out.answer(encodeOK(id, result), func(size int) []byte { return c.tooLarge(id, size) }, true)
}
