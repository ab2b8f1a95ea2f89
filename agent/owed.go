package agent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/lockagent/lockagent/backend"
)

// A release is answered at once, and owed to the backend: the agent has
// dropped the lease (it renews it no more, and holds it no more for
// anybody who asks), and the backend learns of it with the next attempt
// of its name through this agent, which sends it first in its own round
// trip (backend.AcquireRequest.Releases), or within releaseDelay, gathered
// with the other releases owed by then. An application that releases a
// name and takes it again, or hands it to a waiter of this agent, costs
// the backend one round trip, not two; a later attempt of the name always
// reaches the backend after the release.

// releaseDelay is how long an owed release waits for an attempt of its
// name before it goes on its own: the most it delays a waiter of another
// agent.
const releaseDelay = time.Millisecond

// maxOwedSends bounds the owed releases sent at once; the backend gathers
// them (Redis's group commit).
const maxOwedSends = 64

// owedRelease is a release answered and not yet done in the backend.
type owedRelease struct {
	l *lease
	// sent: an attempt or a flush has it on its way. An attempt of the
	// name sends it again all the same, ahead of itself, so that the
	// attempt never reaches the backend before it.
	sent bool
}

// owe notes the release of l, which dropLease dropped, as owed. a.mu is
// held.
func (a *Agent) owe(l *lease) {
	a.owed[l.name] = append(a.owed[l.name], &owedRelease{l: l})
	a.armFlush()
}

// armFlush has the owed releases not sent go within releaseDelay. a.mu
// is held.
func (a *Agent) armFlush() {
	if !a.flushArmed && !a.closing {
		a.flushArmed = true
		a.flushTimer.Reset(releaseDelay)
	}
}

// flushOwed sends the owed releases that no attempt took: releaseDelay
// after the first of them.
func (a *Agent) flushOwed() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.flushArmed = false
	// Freeze sends them, and Thaw arms the flush again; shutdown sends
	// them, and Run may be waiting for the last goroutine already.
	if !a.frozen && !a.closing {
		a.sendOwed()
	}
}

// unsentOwed tells whether an owed release is not on its way. a.mu is
// held.
func (a *Agent) unsentOwed() bool {
	for _, os := range a.owed {
		for _, o := range os {
			if !o.sent {
				return true
			}
		}
	}
	return false
}

// sendOwed sends every owed release not on its way yet, as one step of the
// handover's gate (see Freeze): a frozen agent has sent them, and owes
// nothing its state does not say. a.mu is held.
func (a *Agent) sendOwed() {
	var send []*owedRelease
	for _, os := range a.owed {
		for _, o := range os {
			if !o.sent {
				o.sent = true
				send = append(send, o)
			}
		}
	}
	if len(send) == 0 {
		return
	}
	a.steps++
	a.wg.Add(1) // under a.mu, before Run waits (see shutdown)
	go func() {
		defer a.wg.Done()
		defer a.exit()
		var wg sync.WaitGroup
		sem := make(chan struct{}, maxOwedSends)
		for _, o := range send {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				a.releaseStep(context.Background(), o.l)
				a.mu.Lock()
				a.settle(o)
				a.mu.Unlock()
			})
		}
		wg.Wait()
	}()
}

// takeOwed returns the releases owed for name, for an attempt to send
// first, and those of them it takes from the flush: the attempt settles
// those. a.mu is held.
func (a *Agent) takeOwed(name string) (keys []backend.LeaseKey, took []*owedRelease) {
	os := a.owed[name]
	if len(os) == 0 {
		return nil, nil
	}
	for _, o := range os {
		keys = append(keys, o.l.key())
		if !o.sent {
			o.sent = true
			took = append(took, o)
		}
	}
	return keys, took
}

// settleTaken ends the releases an attempt took, by the attempt's error:
// done, or owed again when their outcome is unknown (see
// backend.AcquireRequest.Releases). a.mu is held.
func (a *Agent) settleTaken(took []*owedRelease, err error) {
	var held *backend.HeldError
	done := err == nil || errors.As(err, &held) || errors.Is(err, backend.ErrOtherMode) ||
		errors.Is(err, backend.ErrForeignKey) || errors.Is(err, backend.ErrTokensExhausted)
	for _, o := range took {
		if done {
			a.settle(o)
		} else {
			o.sent = false
		}
	}
	switch {
	case done:
	case a.closing:
		// Now, while the attempt keeps Run waiting: shutdown has sent
		// the others.
		a.sendOwed()
	default:
		a.armFlush()
	}
}

// settle forgets an owed release that is done. a.mu is held.
func (a *Agent) settle(o *owedRelease) {
	os := a.owed[o.l.name]
	for i, x := range os {
		if x == o {
			os = append(os[:i], os[i+1:]...)
			break
		}
	}
	if len(os) == 0 {
		delete(a.owed, o.l.name)
	} else {
		a.owed[o.l.name] = os
	}
	if len(a.owed) == 0 && a.flushArmed {
		// Nothing left for it to send: a timer that fires wakes a
		// thread for nothing.
		a.flushTimer.Stop()
		a.flushArmed = false
	}
}

// isOwed tells a lease id whose release is owed: the agent no longer holds
// it, whatever the backend says until it learns. a.mu is held.
func (a *Agent) isOwed(name, leaseID string) bool {
	for _, o := range a.owed[name] {
		if o.l.id == leaseID {
			return true
		}
	}
	return false
}
