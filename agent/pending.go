package agent

import "iter"

// pendingAcquires are a session's acquires in progress, by name. A session
// mostly has one at a time, at most: that one takes no map, which an
// acquire would otherwise make and a session drop again when it is done
// (a map keeps its storage when emptied, and idle sessions are many).
type pendingAcquires struct {
	one  *waiter            // the only one, while more is nil
	more map[string]*waiter // all of them, once there were two at once
}

// get returns the acquire of name, or nil.
func (p *pendingAcquires) get(name string) *waiter {
	if p.more != nil {
		return p.more[name]
	}
	if p.one != nil && p.one.req.Name == name {
		return p.one
	}
	return nil
}

// put adds w, in place of the acquire of its name if there is one.
func (p *pendingAcquires) put(w *waiter) {
	switch {
	case p.more != nil:
		p.more[w.req.Name] = w
	case p.one == nil || p.one.req.Name == w.req.Name:
		p.one = w
	default:
		p.more = map[string]*waiter{p.one.req.Name: p.one, w.req.Name: w}
		p.one = nil
	}
}

// remove takes w out, if it is still the acquire of its name.
func (p *pendingAcquires) remove(w *waiter) {
	if p.more == nil {
		if p.one == w {
			p.one = nil
		}
		return
	}
	if p.more[w.req.Name] == w {
		delete(p.more, w.req.Name)
		if len(p.more) == 0 {
			p.more = nil
		}
	}
}

// len is how many acquires are in progress.
func (p *pendingAcquires) len() int {
	if p.more != nil {
		return len(p.more)
	}
	if p.one != nil {
		return 1
	}
	return 0
}

// all yields every acquire in progress, in no order. The loop may remove
// them.
func (p *pendingAcquires) all() iter.Seq[*waiter] {
	return func(yield func(*waiter) bool) {
		if p.more == nil {
			if p.one != nil {
				yield(p.one)
			}
			return
		}
		for _, w := range p.more {
			if !yield(w) {
				return
			}
		}
	}
}
