package agent

import "time"

// schedule orders leases by due time (see lease.due), earliest first: a
// 4-ary heap of due times as nanoseconds since origin on the monotonic
// clock. Each entry keeps its lease's due time, so that ordering 100,000
// leases reads one array and not 100,000 leases scattered in memory, and a
// heap four wide is half as deep as a binary one. Whoever changes what
// due returns calls fix.
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
		s.swap(i, last)
	}
	s.e[last] = schedEntry{}
	s.e = s.e[:last]
	l.index = -1
	if i != last && !s.down(i) {
		s.up(i)
	}
}

func (s *schedule) swap(i, j int) {
	s.e[i], s.e[j] = s.e[j], s.e[i]
	s.e[i].l.index = i
	s.e[j].l.index = j
}

func (s *schedule) up(i int) {
	for i > 0 {
		p := (i - 1) / 4
		if s.e[p].due <= s.e[i].due {
			return
		}
		s.swap(i, p)
		i = p
	}
}

// down moves entry i down to its place and reports whether it moved.
func (s *schedule) down(i int) bool {
	start := i
	for {
		c := 4*i + 1
		if c >= len(s.e) {
			break
		}
		m := c
		for k := c + 1; k < min(c+4, len(s.e)); k++ {
			if s.e[k].due < s.e[m].due {
				m = k
			}
		}
		if s.e[i].due <= s.e[m].due {
			break
		}
		s.swap(i, m)
		i = m
	}
	return i > start
}
