package agent

import (
	"context"
	"time"
)

// The handover's gate. An agent handing its state over to a new process
// (an upgrade) stops at a point the new one can go on from: Freeze waits
// for every step that calls the backend and applies its answer (an
// acquire's attempt, a batch of renewals, a release, a waiter leaving its
// queue) to end, and no new one starts until Thaw. A step that would start
// meanwhile waits at the gate; in an agent that hands over, it waits until
// the process exits, so that it neither touches the backend nor answers
// anybody: the new process does, from the state Snapshot took.

// enter starts a step, waiting while the agent is frozen.
func (a *Agent) enter() {
	a.mu.Lock()
	for a.frozen {
		a.stepped.Wait()
	}
	a.steps++
	a.mu.Unlock()
}

// exit ends a step.
func (a *Agent) exit() {
	a.mu.Lock()
	if a.steps--; a.steps == 0 {
		a.stepped.Broadcast()
	}
	a.mu.Unlock()
}

// Freeze stops the agent for a handover: it returns once no step is under
// way, and none starts until Thaw. If ctx ends first, the agent goes on and
// Freeze returns ctx's error.
func (a *Agent) Freeze(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.frozen = true
	stop := context.AfterFunc(ctx, func() {
		a.mu.Lock()
		a.stepped.Broadcast()
		a.mu.Unlock()
	})
	defer stop()
	// The releases owed go first: the state has no place for them. An
	// attempt that took some and failed owes them again, and they go too.
	for {
		a.sendOwed()
		for a.steps > 0 && ctx.Err() == nil {
			a.stepped.Wait()
		}
		if err := ctx.Err(); err != nil {
			a.thawLocked()
			return err
		}
		if !a.unsentOwed() {
			return nil
		}
	}
}

// Thaw lets a frozen agent go on, as if nothing had happened: the handover
// failed.
func (a *Agent) Thaw() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.thawLocked()
}

// thawLocked is Thaw. a.mu is held.
func (a *Agent) thawLocked() {
	a.frozen = false
	a.stepped.Broadcast()
	if a.unsentOwed() {
		a.armFlush()
	}
}

// Slack is how long the agent can stay frozen before a lease's local
// deadline passes: until the first deadline; false without a lease. A
// handover must end well within it, or the leases are lost.
func (a *Agent) Slack() (time.Duration, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sched.len() == 0 {
		return 0, false
	}
	first := a.sched.e[0].l.validUntil
	for _, e := range a.sched.e[1:] {
		first = earliest(first, e.l.validUntil)
	}
	return max(first.Sub(a.now().mono), 0), true
}
