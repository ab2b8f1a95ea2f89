package etcd

import (
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockagent/lockagent/backend"
)

// State is what a Backend knows that etcd does not tell in one read:
// which etcd lease each of the agent's holders and tickets is on, and
// since when each etcd lease is known to last. An agent's upgrade hands
// it to the new process (see docs/upgrades.md), whose first renewals then
// go by one keep-alive per TTL, as the old process's did, instead of a
// read and a move of every holder.
type State struct {
	Leases  []LeaseState  `json:"leases"`
	Held    []HeldState   `json:"held,omitempty"`
	Tickets []TicketState `json:"tickets,omitempty"`
	// Pending are the releases that failed, still to send again.
	Pending []backend.LeaseKey `json:"pending,omitempty"`
	LastRev int64              `json:"last_rev"`
}

// LeaseState is one etcd lease of the agent.
type LeaseState struct {
	ID   int64 `json:"id"`
	Secs int64 `json:"secs"`
	// SentAgo is how long before the snapshot the last keep-alive that
	// succeeded was sent: etcd keeps the lease until Secs after that.
	SentAgo time.Duration `json:"sent_ago"`
	// Class: the current lease of its TTL, which new grants go on.
	Class bool `json:"class,omitempty"`
}

// HeldState is one holder this agent granted.
type HeldState struct {
	Name    string       `json:"name"`
	LeaseID string       `json:"lease_id"`
	Key     string       `json:"key"`
	Mode    backend.Mode `json:"mode"`
	Create  int64        `json:"create"`
	Lease   int64        `json:"lease"` // its etcd lease's ID
}

// TicketState is one ticket of this agent's waiters.
type TicketState struct {
	Name    string        `json:"name"`
	Ticket  string        `json:"ticket"`
	Mode    backend.Mode  `json:"mode"`
	Lease   int64         `json:"lease"`
	UsedAgo time.Duration `json:"used_ago"`
	Create  int64         `json:"create,omitempty"`
	Before  int           `json:"before"`
}

// Snapshot returns the backend's state at now. No call may be under way:
// the agent is frozen.
func (b *Backend) Snapshot(now time.Time) State {
	var st State
	seen := map[*etcdLease]bool{}
	add := func(l *etcdLease, class bool) {
		if seen[l] {
			return
		}
		seen[l] = true
		l.mu.Lock()
		defer l.mu.Unlock()
		if !l.gone {
			st.Leases = append(st.Leases, LeaseState{ID: int64(l.id), Secs: l.secs, SentAgo: now.Sub(l.sent), Class: class})
		}
	}
	for _, l := range b.classes.all() {
		add(l, true)
	}
	b.mu.Lock()
	for hk, h := range b.held {
		add(h.lease, false)
		st.Held = append(st.Held, HeldState{Name: hk.name, LeaseID: hk.id, Key: h.key, Mode: h.mode, Create: h.create, Lease: int64(h.lease.id)})
	}
	for _, l := range b.pending {
		st.Pending = append(st.Pending, l)
	}
	st.LastRev = b.lastRev
	b.mu.Unlock()
	b.tickets.mu.Lock()
	for tk, t := range b.tickets.leases {
		add(t.etcdLease, false)
		st.Tickets = append(st.Tickets, TicketState{Name: tk.name, Ticket: tk.ticket, Mode: t.mode, Lease: int64(t.id),
			UsedAgo: now.Sub(t.used), Create: t.create, Before: t.before})
	}
	b.tickets.mu.Unlock()
	return st
}

// Restore takes over the state of another process's backend, snapshotted
// elapsed ago, before any call: the same etcd cluster and key prefix. Its
// etcd leases are the same: times carried as ages are aged by elapsed,
// never extended. A holder or ticket whose etcd lease etcd no longer keeps
// is found so by its next renewal or attempt, as in the old process.
func (b *Backend) Restore(st State, elapsed time.Duration) error {
	now := time.Now().Add(-elapsed)
	leases := make(map[int64]*etcdLease, len(st.Leases))
	b.classes.mu.Lock()
	for _, ls := range st.Leases {
		l := &etcdLease{id: clientv3.LeaseID(ls.ID), secs: ls.Secs, sent: now.Add(-ls.SentAgo)}
		leases[ls.ID] = l
		if ls.Class {
			b.classes.current[ls.Secs] = l
		}
	}
	b.classes.mu.Unlock()
	// A holder or ticket on a lease the state does not have (it was gone)
	// goes on one that says so.
	leaseOf := func(id int64) *etcdLease {
		if l := leases[id]; l != nil {
			return l
		}
		return &etcdLease{id: clientv3.LeaseID(id), gone: true}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("etcd: restore: %w", backend.ErrClosed)
	}
	for _, h := range st.Held {
		b.held[heldKey{h.Name, h.LeaseID}] = &heldLease{key: h.Key, mode: h.Mode, create: h.Create, lease: leaseOf(h.Lease)}
	}
	for _, l := range st.Pending {
		b.pending[heldKey{l.Name, l.LeaseID}] = l
	}
	b.lastRev = max(b.lastRev, st.LastRev)
	b.tickets.mu.Lock()
	for _, t := range st.Tickets {
		b.tickets.leases[ticketKey{t.Name, t.Ticket}] = &ticketLease{etcdLease: leaseOf(t.Lease), mode: t.Mode,
			used: now.Add(-t.UsedAgo), create: t.Create, before: t.Before}
	}
	b.tickets.sweepAt = max(minTicketSweep, 2*len(b.tickets.leases))
	b.tickets.mu.Unlock()
	return nil
}
