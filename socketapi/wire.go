package socketapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/internal/wire"
)

// errorCode maps an error to its wire code: the one place where it is done.
// ok is false for an unexpected error, which is sent as internal.
func errorCode(err error) (code string, ok bool) {
	switch {
	case errors.Is(err, agent.ErrInvalidName):
		return wire.CodeInvalidName, true
	case errors.Is(err, agent.ErrInvalidArgument):
		return wire.CodeInvalidArgument, true
	case errors.Is(err, agent.ErrNotHeld):
		return wire.CodeNotHeld, true
	case errors.Is(err, agent.ErrAlreadyHeld):
		return wire.CodeAlreadyHeld, true
	case errors.Is(err, agent.ErrPermissionDenied):
		return wire.CodePermissionDenied, true
	case errors.Is(err, agent.ErrLimitExceeded):
		return wire.CodeLimitExceeded, true
	case errors.Is(err, agent.ErrSessionExpired):
		return wire.CodeSessionExpired, true
	case errors.Is(err, agent.ErrShuttingDown):
		return wire.CodeShuttingDown, true
	case errors.Is(err, agent.ErrSessionEnded), errors.Is(err, context.Canceled):
		return wire.CodeCanceled, true
	case errors.Is(err, backend.ErrUnavailable), errors.Is(err, backend.ErrClosed),
		errors.Is(err, context.DeadlineExceeded):
		return wire.CodeBackendUnavailable, true
	case errors.Is(err, backend.ErrForeignKey):
		return wire.CodeForeignKey, true
	case errors.Is(err, backend.ErrTokensExhausted):
		return wire.CodeTokensExhausted, true
	}
	return wire.CodeInternal, false
}

// request is every field any op takes, as decodeRequest fills it.
// Pointers tell absent (or null) from zero.
type request struct {
	ID json.RawMessage
	Op string

	// hello
	Version      *int64
	Client       *string
	SessionTTLMs *int64
	HeartbeatMs  *int64
	Resume       *wire.Resume

	// acquire, release, check, inspect, break, list, cancel
	Name   *string
	Mode   *string
	Limit  *int64
	Scope  *string
	TTLMs  *int64
	WaitMs *int64
	Meta   *string
	Lease  *string
	All    *bool
	After  *string // list
	Target json.RawMessage

	// resign
	Campaign *string

	// vals holds the values the pointers above point to, so that
	// decoding a field allocates no more than its string.
	vals struct {
		client, name, mode, scope, meta, lease, campaign, after  string
		version, sessionTTLMs, heartbeatMs, limit, ttlMs, waitMs int64
	}
}

// toLease is a lease as the wire shows it.
func toLease(l agent.Lease) wire.Lease {
	return wire.Lease{ID: l.ID, Name: l.Name, Mode: l.Mode.String(), Scope: l.Scope.String(), Token: l.Token, TTLMs: l.TTL.Milliseconds()}
}

func toHolders(hs []backend.Holder) []wire.Holder {
	out := make([]wire.Holder, len(hs))
	for i, h := range hs {
		out[i] = wire.Holder{Mode: h.Mode.String(), Token: h.Token, Meta: h.Meta, Host: h.Host, ExpiresInMs: h.ExpiresIn.Milliseconds()}
	}
	return out
}

// toSession is a session in a list answer.
func toSession(si agent.SessionInfo) wire.Session {
	ws := wire.Session{Session: si.ID, PID: si.Peer.PID, UID: si.Peer.UID, Client: si.Client, Attached: si.Attached,
		Leases: make([]wire.ListLease, 0, len(si.Leases)), Waiting: make([]wire.Waiting, 0, len(si.Waiting)),
		Campaigns: make([]wire.Campaign, 0, len(si.Campaigns))}
	for _, l := range si.Leases {
		ws.Leases = append(ws.Leases, wire.ListLease{Lease: toLease(l.Lease), Meta: l.Meta, HeldForMs: l.HeldFor.Milliseconds(), ExpiresInMs: l.ExpiresIn.Milliseconds()})
	}
	for _, w := range si.Waiting {
		ws.Waiting = append(ws.Waiting, wire.Waiting{Name: w.Name, Mode: w.Mode.String(), WaitedMs: w.WaitedFor.Milliseconds()})
	}
	for _, c := range si.Campaigns {
		ws.Campaigns = append(ws.Campaigns, wire.Campaign{Campaign: c.ID, Name: c.Name, Leader: c.Leader, Lease: c.Lease})
	}
	return ws
}

func encodeEvent(ev agent.Event) []byte {
	e := wire.Event{Event: ev.Kind, Campaign: ev.Campaign, Lease: ev.Lease, Name: ev.Name, Reason: ev.Reason, State: ev.State, Message: ev.Message}
	if ev.Kind == agent.EventLost || ev.Kind == agent.EventElected {
		e.Token = &ev.Token
	}
	return marshalLine(e)
}

var nullID = json.RawMessage("null")

// encodeGranted builds the answer of a grant of lease l: one allocation
// when its strings need no escaping.
func encodeGranted(id json.RawMessage, l agent.Lease) []byte {
	b := okPrefix(id, 192+len(l.ID)+len(l.Name))
	return append(wire.Granted{Acquired: true, Lease: toLease(l)}.AppendFields(b), '}', '\n')
}

// okPrefix starts an answer, {"id":ID,"ok":true, in a buffer of size
// bytes more.
func okPrefix(id json.RawMessage, size int) []byte {
	b := make([]byte, 0, size+len(id))
	b = append(b, `{"id":`...)
	b = append(b, id...)
	return append(b, `,"ok":true`...)
}

// encodeOK builds {"id":ID,"ok":true,...result}.
func encodeOK(id json.RawMessage, result any) []byte {
	b := okPrefix(id, 64)
	if fa, ok := result.(wire.FieldsAppender); ok {
		return append(fa.AppendFields(b), '}', '\n')
	}
	body, err := json.Marshal(result)
	if err != nil || len(body) < 2 || body[0] != '{' {
		panic("socketapi: result is not a JSON object") // results are this package's own types
	}
	if len(body) > 2 {
		b = append(b, ',')
		b = append(b, body[1:]...)
	} else {
		b = append(b, '}')
	}
	return append(b, '\n')
}

// errorResponse is an answer with ok false.
type errorResponse struct {
	ID    json.RawMessage `json:"id"`
	OK    bool            `json:"ok"`
	Error wire.Error      `json:"error"`
}

func encodeError(id json.RawMessage, code, message string, lease *wire.Lease) []byte {
	if id == nil {
		id = nullID
	}
	return marshalLine(errorResponse{ID: id, Error: wire.Error{Code: code, Message: message, Lease: lease}})
}

// marshalValue encodes v as marshalLine does, without the line's end.
func marshalValue(v any) []byte {
	b := marshalLine(v)
	return b[:len(b)-1]
}

// marshalLine encodes v as a line. HTML characters are not escaped: a
// client's id comes back as it was sent, and names as they were given.
func marshalLine(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // Encode ends the line
		panic("socketapi: " + err.Error()) // only this package's own types are marshalled
	}
	return b.Bytes()
}

// validID tells whether raw is a JSON string or integer, the ids a client
// may use. An absent id (nil) is valid and answered as null.
func validID(raw json.RawMessage) bool {
	if len(raw) == 0 {
		return true
	}
	switch raw[0] {
	case '"':
		return true
	case 'n':
		return string(raw) == "null"
	}
	_, err := strconv.ParseInt(string(raw), 10, 64)
	if err == nil {
		return true
	}
	// Integers beyond int64 are still integers.
	for i, c := range raw {
		if !(c >= '0' && c <= '9' || i == 0 && c == '-') {
			return false
		}
	}
	return true
}

// idKey is a canonical form of an id, so that a cancel's target matches the
// id of the request it names however the string was escaped.
func idKey(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" || !validID(raw) {
		return "", false
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return "s:" + s, true
	}
	return "n:" + string(raw), true
}
