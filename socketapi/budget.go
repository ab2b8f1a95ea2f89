package socketapi

import (
	"context"
	"fmt"
	"sync"
)

// outputBudget bounds the memory that output not yet written takes: for
// each uid, and in all. Every line a connection queues is charged to its
// peer's uid and to the total from when it is queued until it is written
// (a line being built, a list answer, is charged as it grows).
//
// When a charge takes a uid past its share, the connections of that uid
// holding the most unwritten output are cut off, largest first, until it
// fits; past the total, the connections holding the most of anybody's.
// So the readers that fall furthest behind go, and whoever keeps reading
// is served on. An answer is instead refused, and the client told why,
// when its own connection is the one that would be cut off (see
// output.answer).
type outputBudget struct {
	max, maxPerUID int

	mu    sync.Mutex
	total int
	uids  map[uint32]*uidOutput
	// spare is a uidOutput no uid holds, for the next uid that charges:
	// a uid whose answers are written as they come holds nothing between
	// them, and would otherwise cost a new one for each.
	spare *uidOutput
}

// uidOutput is what the connections of one uid hold.
type uidOutput struct {
	bytes   int
	holders map[*output]struct{} // the outputs of the uid with bytes charged
}

// cutOff is an output the budget had to cut off, and why.
type cutOff struct {
	o      *output
	cause  string // CutUIDOutput or CutAgentOutput
	reason string // for the log
	held   int    // the bytes it held
}

func newOutputBudget(max, maxPerUID int) *outputBudget {
	return &outputBudget{max: max, maxPerUID: maxPerUID, uids: make(map[uint32]*uidOutput)}
}

// charge charges n bytes to o. If that takes its uid or the total past
// their bound, outputs are cut off until it fits (their charges are
// dropped at once; the caller closes them, with no lock held). With
// refusable set, the charge fails instead when o itself would be cut off.
// It reports whether o was charged: false if it was refused or o is among
// those cut off. An output released already is charged nothing, and true
// is reported: it is closed, and what it queues is dropped.
func (b *outputBudget) charge(o *output, n int, refusable bool) (ok bool, cut []cutOff) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if o.released {
		return true, nil
	}
	u := b.uids[o.uid]
	if u == nil {
		u = b.spare
		b.spare = nil
		if u == nil {
			u = &uidOutput{holders: make(map[*output]struct{})}
		}
		b.uids[o.uid] = u
	}
	b.add(o, u, n)
	for u.bytes > b.maxPerUID {
		v := largest(u.holders)
		if v == o && refusable {
			b.add(o, u, -n)
			return false, cut
		}
		cut = append(cut, cutOff{v, CutUIDOutput, fmt.Sprintf("output not read: uid %d has %d bytes waiting, more than its share of %d", o.uid, u.bytes, b.maxPerUID), v.charged})
		b.drop(v)
		if v == o {
			return false, cut
		}
	}
	for b.total > b.max {
		var v *output
		for _, w := range b.uids {
			if c := largest(w.holders); v == nil || c.charged > v.charged {
				v = c
			}
		}
		if v == o && refusable {
			b.add(o, u, -n)
			return false, cut
		}
		cut = append(cut, cutOff{v, CutAgentOutput, fmt.Sprintf("output not read: the agent has %d bytes waiting for its clients, more than its bound of %d", b.total, b.max), v.charged})
		b.drop(v)
		if v == o {
			return false, cut
		}
	}
	return true, cut
}

// credit gives back n bytes of o's, written (or never queued).
func (b *outputBudget) credit(o *output, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if o.released {
		return
	}
	b.add(o, b.uids[o.uid], -min(n, o.charged))
}

// release gives back everything o holds, for good: o is closed.
func (b *outputBudget) release(o *output) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !o.released {
		b.drop(o)
	}
}

// add charges n bytes to o, of uid u; n may be negative. b.mu is held.
func (b *outputBudget) add(o *output, u *uidOutput, n int) {
	if n == 0 {
		return
	}
	o.charged += n
	u.bytes += n
	b.total += n
	if o.charged > 0 {
		u.holders[o] = struct{}{}
		return
	}
	delete(u.holders, o)
	if len(u.holders) == 0 {
		delete(b.uids, o.uid)
		b.spare = u
	}
}

// drop gives back everything o holds, and charges it nothing more. b.mu
// is held.
func (b *outputBudget) drop(o *output) {
	if u := b.uids[o.uid]; u != nil {
		b.add(o, u, -o.charged)
	}
	o.released = true
}

// largest is the output holding the most, of a non-empty set.
func largest(set map[*output]struct{}) *output {
	var m *output
	for o := range set {
		if m == nil || o.charged > m.charged {
			m = o
		}
	}
	return m
}

// turns lets the connections of one uid build one large answer at a time:
// building a list of many sessions takes the CPU for a while, and a uid
// that asks for many at once must not starve everybody else of it.
type turns struct {
	mu  sync.Mutex
	uid map[uint32]*turn
}

type turn struct {
	token chan struct{} // holds a value while nobody has the turn
	users int           // holders and waiters
}

// take waits for uid's turn, or for ctx to end; release gives it back.
func (t *turns) take(ctx context.Context, uid uint32) (release func(), err error) {
	t.mu.Lock()
	if t.uid == nil {
		t.uid = make(map[uint32]*turn)
	}
	u := t.uid[uid]
	if u == nil {
		u = &turn{token: make(chan struct{}, 1)}
		u.token <- struct{}{}
		t.uid[uid] = u
	}
	u.users++
	t.mu.Unlock()
	leave := func() {
		t.mu.Lock()
		if u.users--; u.users == 0 {
			delete(t.uid, uid)
		}
		t.mu.Unlock()
	}
	select {
	case <-u.token:
		return func() { u.token <- struct{}{}; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	}
}
