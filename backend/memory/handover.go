package memory

import (
	"fmt"
	"time"

	"github.com/lockagent/lockagent/backend"
)

// State is a backend's lock table and its place in the fencing sequence,
// as Snapshot takes it for another process to go on from (see Restore).
// Expiries are what remains of them when the snapshot was taken.
type State struct {
	Epoch uint64               `json:"epoch"`
	Seq   uint64               `json:"seq"`
	Names map[string]NameState `json:"names"`
}

// NameState is the state of one name.
type NameState struct {
	LastToken uint64                 `json:"last_token"`
	Holders   map[string]HolderState `json:"holders,omitempty"` // by lease id
	Queue     []TicketState          `json:"queue,omitempty"`   // in order of arrival
}

// HolderState is one lease on a name.
type HolderState struct {
	Mode      backend.Mode  `json:"mode"`
	Token     uint64        `json:"token"`
	Meta      string        `json:"meta,omitempty"`
	Host      string        `json:"host,omitempty"`
	ExpiresIn time.Duration `json:"expires_in"`
}

// TicketState is one waiter's place in a name's queue.
type TicketState struct {
	ID        string        `json:"id"`
	Mode      backend.Mode  `json:"mode"`
	ExpiresIn time.Duration `json:"expires_in"`
}

// Snapshot returns the backend's state at now. The caller sees that
// nothing calls the backend meanwhile, nor after, but Close: the state is
// another process's from then on.
func (b *Backend) Snapshot(now time.Time) (State, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return State{}, fmt.Errorf("memory: snapshot: %w", backend.ErrClosed)
	}
	st := State{Epoch: b.epoch, Seq: b.seq, Names: make(map[string]NameState, len(b.names))}
	for name, e := range b.names {
		ns := NameState{LastToken: e.lastToken}
		for id, h := range e.holders {
			if !now.Before(h.expires) {
				continue
			}
			if ns.Holders == nil {
				ns.Holders = make(map[string]HolderState, len(e.holders))
			}
			ns.Holders[id] = HolderState{Mode: h.mode, Token: h.token, Meta: h.meta, Host: h.host, ExpiresIn: h.expires.Sub(now)}
		}
		for _, t := range e.queue {
			if now.Before(t.expires) {
				ns.Queue = append(ns.Queue, TicketState{ID: t.id, Mode: t.mode, ExpiresIn: t.expires.Sub(now)})
			}
		}
		st.Names[name] = ns
	}
	return st, nil
}

// Restore returns a backend that goes on from st, taken elapsed ago by
// another process whose state directory was stateDir: the same epoch and
// sequence, so tokens go on increasing without a new epoch; holders and
// tickets expire when they would have, never later.
func Restore(stateDir string, st State, elapsed time.Duration) (*Backend, error) {
	if st.Epoch >= epochLimit || st.Seq > seqMax {
		return nil, fmt.Errorf("memory: restore: epoch %d, sequence %d: %w", st.Epoch, st.Seq, backend.ErrTokensExhausted)
	}
	now := time.Now().Add(-elapsed)
	b := &Backend{
		dir:      stateDir,
		epoch:    st.Epoch,
		seq:      st.Seq,
		names:    make(map[string]*entry, len(st.Names)),
		sweepAt:  max(minSweep, 2*len(st.Names)),
		minSweep: minSweep,
		watchers: make(map[string]map[chan struct{}]string),
	}
	for name, ns := range st.Names {
		e := &entry{holders: make(map[string]*holder, len(ns.Holders)), lastToken: ns.LastToken}
		for id, h := range ns.Holders {
			e.holders[id] = &holder{mode: h.Mode, token: h.Token, meta: h.Meta, host: h.Host, expires: now.Add(h.ExpiresIn)}
		}
		for _, t := range ns.Queue {
			e.queue = append(e.queue, &ticket{id: t.ID, mode: t.Mode, expires: now.Add(t.ExpiresIn)})
		}
		b.names[name] = e
	}
	return b, nil
}
