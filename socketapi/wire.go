package socketapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf8"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
)

// Error codes of the wire protocol.
const (
	CodeBadRequest         = "bad_request"
	CodeUnknownOp          = "unknown_op"
	CodeLineTooLong        = "line_too_long"
	CodeInvalidName        = "invalid_name"
	CodeInvalidArgument    = "invalid_argument"
	CodeNotHeld            = "not_held"
	CodeAlreadyHeld        = "already_held"
	CodeCanceled           = "canceled"
	CodePermissionDenied   = "permission_denied"
	CodeLimitExceeded      = "limit_exceeded"
	CodeSessionExpired     = "session_expired"
	CodeBackendUnavailable = "backend_unavailable"
	CodeForeignKey         = "foreign_key"
	CodeTokensExhausted    = "tokens_exhausted"
	CodeShuttingDown       = "shutting_down"
	CodeInternal           = "internal"
)

// errorCode maps an error to its wire code: the one place where it is done.
// ok is false for an unexpected error, which is sent as internal.
func errorCode(err error) (code string, ok bool) {
	switch {
	case errors.Is(err, agent.ErrInvalidName):
		return CodeInvalidName, true
	case errors.Is(err, agent.ErrInvalidArgument):
		return CodeInvalidArgument, true
	case errors.Is(err, agent.ErrNotHeld):
		return CodeNotHeld, true
	case errors.Is(err, agent.ErrAlreadyHeld):
		return CodeAlreadyHeld, true
	case errors.Is(err, agent.ErrPermissionDenied):
		return CodePermissionDenied, true
	case errors.Is(err, agent.ErrLimitExceeded):
		return CodeLimitExceeded, true
	case errors.Is(err, agent.ErrSessionExpired):
		return CodeSessionExpired, true
	case errors.Is(err, agent.ErrShuttingDown):
		return CodeShuttingDown, true
	case errors.Is(err, agent.ErrSessionEnded), errors.Is(err, context.Canceled):
		return CodeCanceled, true
	case errors.Is(err, backend.ErrUnavailable), errors.Is(err, backend.ErrClosed),
		errors.Is(err, context.DeadlineExceeded):
		return CodeBackendUnavailable, true
	case errors.Is(err, backend.ErrForeignKey):
		return CodeForeignKey, true
	case errors.Is(err, backend.ErrTokensExhausted):
		return CodeTokensExhausted, true
	}
	return CodeInternal, false
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
	Resume       *resumeArgs

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

type resumeArgs struct {
	Session string `json:"session"`
	Token   string `json:"token"`
}

// Results, one per op.

type helloResult struct {
	Session     string    `json:"session"`
	ResumeToken string    `json:"resume_token"`
	Resumed     bool      `json:"resumed"`
	Agent       agentInfo `json:"agent"`
}

type agentInfo struct {
	Version      string    `json:"version"`
	Backend      string    `json:"backend"`
	MaxLineBytes int       `json:"max_line_bytes"`
	TTLMs        ttlBounds `json:"ttl_ms"`
}

type ttlBounds struct {
	Default int64 `json:"default"`
	Min     int64 `json:"min"`
	Max     int64 `json:"max"`
}

// leaseJSON is a lease on the wire.
type leaseJSON struct {
	Lease string `json:"lease"`
	Name  string `json:"name"`
	Mode  string `json:"mode"`
	Scope string `json:"scope"`
	Token uint64 `json:"token"`
	TTLMs int64  `json:"ttl_ms"`
}

func toLeaseJSON(l agent.Lease) leaseJSON {
	return leaseJSON{l.ID, l.Name, l.Mode.String(), l.Scope.String(), l.Token, l.TTL.Milliseconds()}
}

type grantedResult struct {
	Acquired bool `json:"acquired"`
	leaseJSON
}

type deniedResult struct {
	Acquired bool         `json:"acquired"`
	Reason   string       `json:"reason"`
	Holders  []holderJSON `json:"holders"`
}

type holderJSON struct {
	Mode        string `json:"mode"`
	Token       uint64 `json:"token"`
	Meta        string `json:"meta"`
	Host        string `json:"host"`
	ExpiresInMs int64  `json:"expires_in_ms"`
}

func toHolders(hs []backend.Holder) []holderJSON {
	out := make([]holderJSON, len(hs))
	for i, h := range hs {
		out[i] = holderJSON{h.Mode.String(), h.Token, h.Meta, h.Host, h.ExpiresIn.Milliseconds()}
	}
	return out
}

type releaseResult struct {
	Released bool `json:"released"`
}

type checkResult struct {
	Held        bool   `json:"held"`
	Token       uint64 `json:"token"`
	ExpiresInMs int64  `json:"expires_in_ms"`
}

type inspectResult struct {
	Locked    bool         `json:"locked"`
	Mode      *string      `json:"mode"`
	Holders   []holderJSON `json:"holders"`
	LastToken uint64       `json:"last_token"`
	Queued    int          `json:"queued"`
}

// toSessionJSON is a session in a list answer.
func toSessionJSON(si agent.SessionInfo) sessionJSON {
	sj := sessionJSON{Session: si.ID, PID: si.Peer.PID, UID: si.Peer.UID, Client: si.Client, Attached: si.Attached,
		Leases: make([]listLeaseJSON, 0, len(si.Leases)), Waiting: make([]waitingJSON, 0, len(si.Waiting))}
	for _, l := range si.Leases {
		sj.Leases = append(sj.Leases, listLeaseJSON{toLeaseJSON(l.Lease), l.Meta, l.HeldFor.Milliseconds(), l.ExpiresIn.Milliseconds()})
	}
	for _, w := range si.Waiting {
		sj.Waiting = append(sj.Waiting, waitingJSON{w.Name, w.Mode.String(), w.WaitedFor.Milliseconds()})
	}
	sj.Campaigns = toCampaigns(si.Campaigns)
	return sj
}

type sessionJSON struct {
	Session   string          `json:"session"`
	PID       int32           `json:"pid"`
	UID       uint32          `json:"uid"`
	Client    string          `json:"client"`
	Attached  bool            `json:"attached"`
	Leases    []listLeaseJSON `json:"leases"`
	Waiting   []waitingJSON   `json:"waiting"`
	Campaigns []campaignJSON  `json:"campaigns"`
}

type listLeaseJSON struct {
	leaseJSON
	Meta        string `json:"meta"`
	HeldForMs   int64  `json:"held_for_ms"`
	ExpiresInMs int64  `json:"expires_in_ms"`
}

type waitingJSON struct {
	Name     string `json:"name"`
	Mode     string `json:"mode"`
	WaitedMs int64  `json:"waited_ms"`
}

type breakResult struct {
	Broken int `json:"broken"`
}

type cancelResult struct {
	Canceled bool `json:"canceled"`
}

type pongResult struct {
	Pong bool `json:"pong"`
}

type errorBody struct {
	Code    string     `json:"code"`
	Message string     `json:"message"`
	Lease   *leaseJSON `json:"lease,omitempty"`
}

type errorResponse struct {
	ID    json.RawMessage `json:"id"`
	OK    bool            `json:"ok"`
	Error errorBody       `json:"error"`
}

type eventJSON struct {
	Event    string  `json:"event"`
	Campaign string  `json:"campaign,omitempty"`
	Lease    string  `json:"lease,omitempty"`
	Name     string  `json:"name,omitempty"`
	Token    *uint64 `json:"token,omitempty"`
	Reason   string  `json:"reason,omitempty"`
	State    string  `json:"state,omitempty"`
	Message  string  `json:"message,omitempty"`
}

func encodeEvent(ev agent.Event) []byte {
	e := eventJSON{Event: ev.Kind, Campaign: ev.Campaign, Lease: ev.Lease, Name: ev.Name, Reason: ev.Reason, State: ev.State, Message: ev.Message}
	if ev.Kind == agent.EventLost || ev.Kind == agent.EventElected {
		e.Token = &ev.Token
	}
	return marshalLine(e)
}

var nullID = json.RawMessage("null")

// fieldsAppender is a result that writes its own JSON fields (each with a
// leading comma): the results of the hottest ops, which skip reflection.
type fieldsAppender interface {
	appendFields(b []byte) []byte
}

// encodeOK builds {"id":ID,"ok":true,...result}.
func encodeOK(id json.RawMessage, result any) []byte {
	size := 64 + len(id)
	if g, ok := result.(grantedResult); ok {
		// A grant's line, its strings unescaped: one allocation.
		size += 128 + len(g.Lease) + len(g.Name)
	}
	b := make([]byte, 0, size)
	b = append(b, `{"id":`...)
	b = append(b, id...)
	b = append(b, `,"ok":true`...)
	if fa, ok := result.(fieldsAppender); ok {
		return append(fa.appendFields(b), '}', '\n')
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

func (r grantedResult) appendFields(b []byte) []byte {
	b = append(b, `,"acquired":true,"lease":`...)
	b = appendString(b, r.Lease)
	b = append(b, `,"name":`...)
	b = appendString(b, r.Name)
	b = append(b, `,"mode":"`...)
	b = append(b, r.Mode...)
	b = append(b, `","scope":"`...)
	b = append(b, r.Scope...)
	b = append(b, `","token":`...)
	b = strconv.AppendUint(b, r.Token, 10)
	b = append(b, `,"ttl_ms":`...)
	return strconv.AppendInt(b, r.TTLMs, 10)
}

func (r releaseResult) appendFields(b []byte) []byte {
	return strconv.AppendBool(append(b, `,"released":`...), r.Released)
}

func (r pongResult) appendFields(b []byte) []byte {
	return strconv.AppendBool(append(b, `,"pong":`...), r.Pong)
}

// appendString appends s as a JSON string, as encoding/json would (HTML
// characters aside): invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < ' ':
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

func encodeError(id json.RawMessage, code, message string, lease *leaseJSON) []byte {
	if id == nil {
		id = nullID
	}
	return marshalLine(errorResponse{ID: id, Error: errorBody{Code: code, Message: message, Lease: lease}})
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
