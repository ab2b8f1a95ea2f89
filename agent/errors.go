package agent

import (
	"errors"
	"fmt"
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
