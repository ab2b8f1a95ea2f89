package agent

import (
	"context"
	"errors"
	"time"

	"github.com/lockagent/lockagent/backend"
)

// Observer is told what the agent does, for metrics. The agent calls it
// from many goroutines, some with its lock held: no method may block or
// call the agent.
type Observer interface {
	// Acquired is told how an acquire ended (one of the Result constants)
	// and how long it took, waiting included.
	Acquired(mode backend.Mode, result string, took time.Duration)
	// Renewed is told of a batch of renewals sent to the backend in one
	// round trip: its size, how long the round trip took, and how many of
	// them failed for want of an answer.
	Renewed(batch int, took time.Duration, failed int)
	// Lost is told of a lost lease, by reason (ReasonExpired…).
	Lost(reason string)
	// BackendError is told of a backend call that failed: op is acquire,
	// renew or release.
	BackendError(op string)
}

// Results of an acquire, as told to the Observer.
const (
	ResultGranted          = "granted"
	ResultHeld             = "held"
	ResultTimeout          = "timeout"
	ResultCanceled         = "canceled"
	ResultPermissionDenied = "permission_denied"
	ResultLimitExceeded    = "limit_exceeded"
	ResultError            = "error"
)

// observeAcquire tells the observer how an acquire ended.
func (a *Agent) observeAcquire(mode backend.Mode, start time.Time, res AcquireResult, err error) {
	o := a.cfg.Observer
	if o == nil {
		return
	}
	result := ResultGranted
	switch {
	case errors.Is(err, ErrPermissionDenied):
		result = ResultPermissionDenied
	case errors.Is(err, ErrLimitExceeded):
		result = ResultLimitExceeded
	case errors.Is(err, context.Canceled), errors.Is(err, ErrSessionEnded):
		// Both are answered canceled.
		result = ResultCanceled
	case errors.Is(err, backend.ErrUnavailable), errors.Is(err, backend.ErrClosed),
		errors.Is(err, backend.ErrForeignKey), errors.Is(err, context.DeadlineExceeded):
		// The backend failed the request (answered backend_unavailable
		// or foreign_key); each failed call was told (called).
		result = ResultError
	case err != nil:
		result = ResultError
	case !res.Acquired && res.Reason == ReasonTimeout:
		result = ResultTimeout
	case !res.Acquired:
		result = ResultHeld
	}
	o.Acquired(mode, result, time.Since(start))
}

// Refused tells the observer of an acquire refused before it reached the
// agent: a request that could not be read as one, or whose session could
// not be opened. The acquire metrics count every acquire request.
func (a *Agent) Refused(mode backend.Mode, err error) {
	a.observeAcquire(mode, time.Now(), AcquireResult{}, err)
}

// called records the outcome of a backend call for op (acquire, release):
// in the status's backend error (note), and, if it failed, in the
// metrics: every attempt of a waiting acquire or a campaign, every try of
// a release. A call answered (held, not held) or given up by its caller
// is no failure.
func (a *Agent) called(op string, err error) {
	a.note(err)
	o := a.cfg.Observer
	if o == nil || err == nil || errors.Is(err, backend.ErrHeld) || errors.Is(err, backend.ErrNotHeld) ||
		errors.Is(err, context.Canceled) {
		return
	}
	o.BackendError(op)
}

// observeRenew tells the observer of a batch of renewals.
func (a *Agent) observeRenew(errs []error, took time.Duration) {
	o := a.cfg.Observer
	if o == nil {
		return
	}
	failed := 0
	for _, err := range errs {
		if err != nil && !errors.Is(err, backend.ErrNotHeld) && !errors.Is(err, backend.ErrTakenOver) {
			failed++
		}
	}
	o.Renewed(len(errs), took, failed)
	if failed > 0 {
		o.BackendError("renew")
	}
}

// LeaseCount is a number of leases of one mode and scope.
type LeaseCount struct {
	Mode  backend.Mode
	Scope Scope
	N     int
}

// LeaseCounts counts the leases held by mode and scope, every combination
// listed.
func (a *Agent) LeaseCounts() []LeaseCount {
	a.mu.Lock()
	var counts [2][2]int
	for _, l := range a.leases {
		counts[l.mode][l.scope]++
	}
	a.mu.Unlock()
	var out []LeaseCount
	for _, m := range []backend.Mode{backend.Exclusive, backend.Shared} {
		for _, sc := range []Scope{ScopeConnection, ScopeSession} {
			out = append(out, LeaseCount{m, sc, counts[m][sc]})
		}
	}
	return out
}

// Started is when the agent first started: upgrades that handed its
// state over from process to process (see Restore) do not change it.
func (a *Agent) Started() time.Time { return a.since }
