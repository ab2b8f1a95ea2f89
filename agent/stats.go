package agent

import (
	"context"
	"errors"
	"time"

	"github.com/lockagent/lockagent/backend"
)

// Stats is a snapshot of what the agent holds, for the service manager's
// status line.
type Stats struct {
	Sessions int  // open sessions, attached or not
	Leases   int  // leases held across every session
	Waiters  int  // acquires waiting in a queue
	Degraded bool // renewals are failing: some lease's last renewal had an unknown outcome

	// The error of the last backend call, of any kind, that found the
	// backend unavailable, and when it failed; "" errorHold after it once
	// a call has reached the backend since.
	// Renewals tell Degraded, and only while leases are at risk; this
	// tells of a backend that acquires, releases and inspects cannot
	// reach, with no lease to renew.
	BackendError   string
	BackendErrorAt time.Time
}

// Stats takes a snapshot under the agent's lock. It is also how the daemon
// tells that the agent is alive: a wedged agent, its lock never released,
// never answers, while a backend outage (no backend call is made under the
// lock) does not delay it.
func (a *Agent) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := Stats{Sessions: len(a.sessions), Leases: len(a.leases), Waiters: a.waiters, Degraded: a.degraded}
	if f := a.unavailable.Load(); f != nil && !a.recovered(f) {
		st.BackendError, st.BackendErrorAt = f.err.Error(), f.at
	}
	return st
}

// unavailability is a backend call's failure to reach the backend.
type unavailability struct {
	err error
	at  time.Time
}

// note records what the outcome of a backend call says of the backend:
// unreachable (ErrUnavailable), or reached (any other outcome, a denial
// or a lease not held included, but a cancellation, which says nothing).
// A failure is forgotten only once a call reaches the backend errorHold
// after it: when only a part of the backend fails (a Cluster primary
// down), the calls to the other parts do not make it look well between
// two calls to the failed one.
func (a *Agent) note(err error) {
	switch {
	case errors.Is(err, backend.ErrUnavailable):
		a.unavailable.Store(&unavailability{err, time.Now()})
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
	default:
		if f := a.unavailable.Load(); f != nil {
			// A call within errorHold of the failure is kept, for Stats to
			// forget the failure once errorHold has passed with no other,
			// should no call come after.
			if now := time.Now(); now.Sub(f.at) < errorHold {
				a.reachedAt.Store(now.UnixNano())
			} else {
				a.unavailable.CompareAndSwap(f, nil)
			}
		}
	}
}

// recovered tells that a call reached the backend after the failure f,
// and no call failed for errorHold since f.
func (a *Agent) recovered(f *unavailability) bool {
	return a.reachedAt.Load() > f.at.UnixNano() && time.Since(f.at) >= errorHold
}

// errorHold is how long a failure to reach the backend is told after the
// last one, however many calls reach it meanwhile.
const errorHold = 5 * time.Second
