package agent

import (
	"errors"
	"fmt"
	"time"
)

// Errors returned by the agent. socketapi maps each to its wire code; they
// are matched with errors.Is.
var (
	ErrInvalidName      = errors.New("agent: invalid name")
	ErrInvalidArgument  = errors.New("agent: invalid argument")
	ErrNotHeld          = errors.New("agent: not held")
	ErrAlreadyHeld      = errors.New("agent: already held")
	ErrPermissionDenied = errors.New("agent: permission denied")
	ErrLimitExceeded    = errors.New("agent: limit exceeded")
	ErrSessionExpired   = errors.New("agent: session expired")
	ErrShuttingDown     = errors.New("agent: shutting down")
	ErrSessionEnded     = errors.New("agent: session ended")
)

// AlreadyHeldError is returned by Acquire when the session already holds the
// name. It carries the existing lease and wraps ErrAlreadyHeld.
type AlreadyHeldError struct {
	Lease Lease
}

func (e *AlreadyHeldError) Error() string {
	return fmt.Sprintf("%v: %s is held by lease %s", ErrAlreadyHeld, e.Lease.Name, e.Lease.ID)
}

// Unwrap lets errors.Is match ErrAlreadyHeld.
func (e *AlreadyHeldError) Unwrap() error { return ErrAlreadyHeld }

func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// Arg names an argument of a request to the agent.
type Arg string

// The arguments whose bounds the agent checks.
const (
	ArgTTL        Arg = "TTL"
	ArgWait       Arg = "wait"
	ArgLimit      Arg = "limit"
	ArgMeta       Arg = "meta"
	ArgSessionTTL Arg = "session TTL"
	ArgClient     Arg = "client"
)

// ArgError is an argument outside the bounds the agent accepts: a
// duration outside Min…Max, or another argument breaking Rule. It wraps
// ErrInvalidArgument. The agent owns these rules; socketapi says them
// in the wire protocol's terms.
type ArgError struct {
	Arg      Arg
	Min, Max time.Duration // a duration's bounds, when Rule is empty
	Rule     string        // what the argument must be, when not a duration
}

func (e *ArgError) Error() string {
	if e.Rule != "" {
		return fmt.Sprintf("%v: %s %s", ErrInvalidArgument, e.Arg, e.Rule)
	}
	return fmt.Sprintf("%v: %s must be between %v and %v", ErrInvalidArgument, e.Arg, e.Min, e.Max)
}

// Unwrap lets errors.Is match ErrInvalidArgument.
func (e *ArgError) Unwrap() error { return ErrInvalidArgument }
