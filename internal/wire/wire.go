// Package wire is lockagent's wire protocol, version 1, as data: the error
// codes, and the results and events the agent sends, with their JSON
// field names (docs/protocol.md). It is the one definition that the agent's
// server (socketapi) and the Go client (client) share.
//
// It depends on the standard library alone, as the client does.
package wire

import (
	"strconv"
	"unicode/utf8"
)

// Version is the protocol's version, which hello names.
const Version = 1

// Error codes: stable, for programs.
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
	CodeUpgradeFailed      = "upgrade_failed"
	CodeInternal           = "internal"
)

// Modes and scopes of a lease.
const (
	ModeExclusive   = "exclusive"
	ModeShared      = "shared"
	ScopeConnection = "connection"
	ScopeSession    = "session"
)

// Event kinds.
const (
	EventLost     = "lost"
	EventBackend  = "backend"
	EventShutdown = "shutdown"
	EventElected  = "elected"
)

// Error is the error of an answer with ok false.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Lease   *Lease `json:"lease,omitempty"` // with already_held: the lease the session holds
}

// Event is an event the agent pushes to a session's connection. Token is
// set for lost and elected events only.
type Event struct {
	Event    string  `json:"event"`
	Campaign string  `json:"campaign,omitempty"`
	Lease    string  `json:"lease,omitempty"`
	Name     string  `json:"name,omitempty"`
	Token    *uint64 `json:"token,omitempty"`
	Reason   string  `json:"reason,omitempty"`
	State    string  `json:"state,omitempty"`
	Message  string  `json:"message,omitempty"`
}

// Resume is hello's resume argument.
type Resume struct {
	Session string `json:"session"`
	Token   string `json:"token"`
}

// HelloResult is the result of hello.
type HelloResult struct {
	Session     string    `json:"session"`
	ResumeToken string    `json:"resume_token"`
	Resumed     bool      `json:"resumed"`
	Agent       AgentInfo `json:"agent"`
}

// AgentInfo is what hello tells of the agent.
type AgentInfo struct {
	Version      string    `json:"version"`
	Backend      string    `json:"backend"`
	MaxLineBytes int       `json:"max_line_bytes"`
	TTLMs        TTLBounds `json:"ttl_ms"`
}

// TTLBounds are the agent's lease TTLs, in milliseconds.
type TTLBounds struct {
	Default int64 `json:"default"`
	Min     int64 `json:"min"`
	Max     int64 `json:"max"`
}

// Lease is a granted lease's fields.
type Lease struct {
	ID    string `json:"lease"`
	Name  string `json:"name"`
	Mode  string `json:"mode"`
	Scope string `json:"scope"`
	Token uint64 `json:"token"`
	TTLMs int64  `json:"ttl_ms"`
}

// Granted is the result of an acquire that was granted.
type Granted struct {
	Acquired bool `json:"acquired"` // true
	Lease
}

// Denied is the result of an acquire that was denied.
type Denied struct {
	Acquired bool     `json:"acquired"` // false
	Reason   string   `json:"reason"`   // held or timeout
	Holders  []Holder `json:"holders"`
}

// AcquireResult reads the result of an acquire, granted or denied.
type AcquireResult struct {
	Acquired bool `json:"acquired"`
	Lease
	Reason  string   `json:"reason"`
	Holders []Holder `json:"holders"`
}

// Holder is a live lease on a name, as others see it.
type Holder struct {
	Mode        string `json:"mode"`
	Token       uint64 `json:"token"`
	Meta        string `json:"meta"`
	Host        string `json:"host"`
	ExpiresInMs int64  `json:"expires_in_ms"`
}

// ReleaseResult is the result of release.
type ReleaseResult struct {
	Released bool `json:"released"`
}

// CheckResult is the result of check.
type CheckResult struct {
	Held        bool   `json:"held"`
	Token       uint64 `json:"token"`
	ExpiresInMs int64  `json:"expires_in_ms"`
}

// InspectResult is the result of inspect.
type InspectResult struct {
	Locked    bool     `json:"locked"`
	Mode      *string  `json:"mode"`
	Holders   []Holder `json:"holders"`
	LastToken uint64   `json:"last_token"`
	Queued    int      `json:"queued"`
}

// ListResult is the result of list: a page of sessions, and where the
// next page starts, if any.
type ListResult struct {
	Sessions []Session `json:"sessions"`
	Next     *string   `json:"next"`
}

// Session is a session in a list.
type Session struct {
	Session   string      `json:"session"`
	PID       int32       `json:"pid"`
	UID       uint32      `json:"uid"`
	Client    string      `json:"client"`
	Attached  bool        `json:"attached"`
	Leases    []ListLease `json:"leases"`
	Waiting   []Waiting   `json:"waiting"`
	Campaigns []Campaign  `json:"campaigns"`
}

// ListLease is a lease in a list.
type ListLease struct {
	Lease
	Meta        string `json:"meta"`
	HeldForMs   int64  `json:"held_for_ms"`
	ExpiresInMs int64  `json:"expires_in_ms"`
}

// Waiting is a waiting acquire in a list.
type Waiting struct {
	Name     string `json:"name"`
	Mode     string `json:"mode"`
	WaitedMs int64  `json:"waited_ms"`
}

// Campaign is a campaign in a list.
type Campaign struct {
	Campaign string `json:"campaign"`
	Name     string `json:"name"`
	Leader   bool   `json:"leader"`
	Lease    string `json:"lease,omitempty"`
}

// BreakResult is the result of break.
type BreakResult struct {
	Broken int `json:"broken"`
}

// CancelResult is the result of cancel.
type CancelResult struct {
	Canceled bool `json:"canceled"`
}

// PongResult is the result of ping.
type PongResult struct {
	Pong bool `json:"pong"`
}

// CampaignResult is the result of campaign.
type CampaignResult struct {
	Campaign string `json:"campaign"`
}

// ResignResult is the result of resign.
type ResignResult struct {
	Resigned bool `json:"resigned"`
}

// UpgradeResult is the result of upgrade, which the new process answers.
type UpgradeResult struct {
	Version string `json:"version"`
	PID     int    `json:"pid"`
}

// StatusResult is the result of status: the agent as a whole.
type StatusResult struct {
	Version  string `json:"version"`
	PID      int    `json:"pid"`
	UptimeMs int64  `json:"uptime_ms"` // since the agent first started, upgrades aside
	// The last upgrade that handed the agent over to this process, and
	// how long its clients waited for it.
	UpgradedAgoMs int64  `json:"upgraded_ago_ms,omitempty"`
	UpgradeMs     int64  `json:"upgrade_ms,omitempty"`
	Backend       string `json:"backend"`
	BackendState  string `json:"backend_state"` // ok or degraded
	// The last backend call that could not reach it, while none has since.
	BackendError      string `json:"backend_error,omitempty"`
	BackendErrorAgoMs int64  `json:"backend_error_ago_ms,omitempty"`
	Sessions          int    `json:"sessions"`
	Leases            int    `json:"leases"`
	Waiters           int    `json:"waiters"`
}

// FieldsAppender is a result that writes its own JSON fields, each with a
// leading comma: the results of the hottest ops, which the agent encodes
// without reflection.
type FieldsAppender interface {
	AppendFields(b []byte) []byte
}

// AppendFields appends the fields of a grant.
func (r Granted) AppendFields(b []byte) []byte {
	b = append(b, `,"acquired":true,"lease":`...)
	b = AppendString(b, r.ID)
	b = append(b, `,"name":`...)
	b = AppendString(b, r.Name)
	b = append(b, `,"mode":"`...)
	b = append(b, r.Mode...)
	b = append(b, `","scope":"`...)
	b = append(b, r.Scope...)
	b = append(b, `","token":`...)
	b = strconv.AppendUint(b, r.Token, 10)
	b = append(b, `,"ttl_ms":`...)
	return strconv.AppendInt(b, r.TTLMs, 10)
}

// AppendFields appends the fields of a release's result.
func (r ReleaseResult) AppendFields(b []byte) []byte {
	return strconv.AppendBool(append(b, `,"released":`...), r.Released)
}

// AppendFields appends the fields of a pong.
func (r PongResult) AppendFields(b []byte) []byte {
	return strconv.AppendBool(append(b, `,"pong":`...), r.Pong)
}

// AppendString appends s as a JSON string, as encoding/json would (HTML
// characters aside): invalid UTF-8 becomes U+FFFD.
func AppendString(b []byte, s string) []byte {
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
