package agent

import "time"

// schedule orders leases by due time (see lease.due), earliest first: a
// heap arity wide of due times, as nanoseconds since origin on the
// monotonic clock. Each entry keeps its lease's due time, so that ordering
// 100,000 leases reads one array and not 100,000 leases scattered in
// memory. Whoever changes what due returns calls fix.
type schedule struct {
	origin time.Time
	e      []schedEntry
}

type schedEntry struct {
	due int64
	l   *lease
}

func (s *schedule) len() int { return len(s.e) }

// top is the lease due first. The schedule must not be empty.
func (s *schedule) top() *lease { return s.e[0].l }

// next is when the lease due first is due. The schedule must not be empty.
func (s *schedule) next() time.Time { return s.origin.Add(time.Duration(s.e[0].due)) }

// dueBy appends to out the leases due at or before t, in no order.
func (s *schedule) dueBy(t time.Time, out []*lease) []*lease {
	by := int64(t.Sub(s.origin))
	if len(s.e) == 0 || s.e[0].due > by {
		return out
	}
	// A subtree whose root is due later is due later throughout.
	stack := []int{0}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		out = append(out, s.e[i].l)
		for c := arity*i + 1; c < min(arity*i+1+arity, len(s.e)); c++ {
			if s.e[c].due <= by {
				stack = append(stack, c)
			}
		}
	}
	return out
}

func (s *schedule) push(l *lease) {
	l.index = len(s.e)
	s.e = append(s.e, schedEntry{due: int64(l.due().Sub(s.origin)), l: l})
	s.up(l.index)
}

// fix puts l in its place after its due time changed.
func (s *schedule) fix(l *lease) {
	i := l.index
	s.e[i].due = int64(l.due().Sub(s.origin))
	if !s.down(i) {
		s.up(i)
	}
}

func (s *schedule) remove(l *lease) {
	i, last := l.index, len(s.e)-1
	if i != last {
		s.set(i, s.e[last])
	}
	s.e[last] = schedEntry{}
	s.e = s.e[:last]
	l.index = -1
	if i != last && !s.down(i) {
		s.up(i)
	}
}

// arity is the heap's width: a wide heap is shallow, and its children sit
// side by side in memory. BenchmarkSchedule (100,000 leases) finds four
// faster than eight or sixteen.
const arity = 4

// set puts e at i. Sifting moves each entry once into the hole left by the
// one sifted, instead of swapping at every level: half the writes into
// the leases, which are scattered in memory.
func (s *schedule) set(i int, e schedEntry) {
	s.e[i] = e
	e.l.index = i
}

func (s *schedule) up(i int) {
	e := s.e[i]
	for i > 0 {
		p := (i - 1) / arity
		if s.e[p].due <= e.due {
			break
		}
		s.set(i, s.e[p])
		i = p
	}
	s.set(i, e)
}

// down moves entry i down to its place and reports whether it moved.
func (s *schedule) down(i int) bool {
	start, e := i, s.e[i]
	for {
		c := arity*i + 1
		if c >= len(s.e) {
			break
		}
		m := c
		for k := c + 1; k < min(c+arity, len(s.e)); k++ {
			if s.e[k].due < s.e[m].due {
				m = k
			}
		}
		if e.due <= s.e[m].due {
			break
		}
		s.set(i, s.e[m])
		i = m
	}
	s.set(i, e)
	return i > start
}
