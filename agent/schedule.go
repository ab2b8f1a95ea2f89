package agent

import (
	"cmp"
	"slices"
	"time"
)

// schedule orders leases by due time (see lease.due), earliest first. Due
// times are kept as nanoseconds since origin on the monotonic clock, and
// leases go in buckets by due time, tickShift bits of nanoseconds (about
// 4 ms) each: a bucket is a slice of due times and leases in no order, so
// that adding or removing a lease moves one entry and not a path through
// the whole schedule. Only the earliest bucket is sorted, once when it
// becomes the earliest (and again if an entry due after its earliest is
// added, or one other than its earliest leaves), latest first, so that
// taking the earliest lease is taking its last entry. A min-heap of the buckets by
// tick finds the earliest; it holds one bucket per tick of due times in
// use, not one per lease. Whoever changes what due returns calls fix.
type schedule struct {
	origin  time.Time
	n       int               // leases
	byTick  map[int64]*bucket // the buckets, by tick
	buckets []*bucket         // the same, a min-heap by tick
	free    []*bucket         // emptied buckets, to be used again
}

// tickShift is a bucket's width as a power of two of nanoseconds: 2^22 ns
// (4.2 ms) makes 20,000 renewals a second fill buckets of about 80, few
// enough to sort in a few microseconds.
const tickShift = 22

// maxFree bounds the emptied buckets kept for use again: 100,000 leases of
// 15 s empty a few hundred a second.
const maxFree = 1024

// bucket holds the leases due in one tick.
type bucket struct {
	tick   int64
	e      []schedEntry
	sorted bool // e is in order of due time, latest first
}

type schedEntry struct {
	due int64
	l   *lease
}

func (s *schedule) len() int { return s.n }

// top is the lease due first. The schedule must not be empty.
func (s *schedule) top() *lease {
	b := s.head()
	return b.e[len(b.e)-1].l
}

// next is when the lease due first is due. The schedule must not be empty.
func (s *schedule) next() time.Time {
	b := s.head()
	return s.origin.Add(time.Duration(b.e[len(b.e)-1].due))
}

func (s *schedule) push(l *lease) {
	due := int64(l.due().Sub(s.origin))
	tick := due >> tickShift
	b := s.byTick[tick]
	if b == nil {
		b = s.newBucket(tick)
	}
	if n := len(b.e); n > 0 && b.e[n-1].due < due {
		b.sorted = false
	}
	l.bucket, l.index = b, len(b.e)
	b.e = append(b.e, schedEntry{due: due, l: l})
	s.n++
}

// fix puts l in its place after its due time changed.
func (s *schedule) fix(l *lease) {
	s.remove(l)
	s.push(l)
}

func (s *schedule) remove(l *lease) {
	b, i := l.bucket, l.index
	last := len(b.e) - 1
	if i != last {
		b.e[i] = b.e[last]
		b.e[i].l.index = i
		b.sorted = false
	}
	b.e[last] = schedEntry{}
	b.e = b.e[:last]
	l.bucket, l.index = nil, -1
	s.n--
}

// head is the earliest bucket with leases, sorted. Emptied buckets leave
// the heap here, when they come first, and up to maxFree are kept for use
// again. The schedule must not be empty.
func (s *schedule) head() *bucket {
	for len(s.buckets[0].e) == 0 {
		b := s.buckets[0]
		delete(s.byTick, b.tick)
		last := len(s.buckets) - 1
		s.buckets[0] = s.buckets[last]
		s.buckets[last] = nil
		s.buckets = s.buckets[:last]
		s.down(0)
		if len(s.free) < maxFree {
			s.free = append(s.free, b)
		}
	}
	b := s.buckets[0]
	if !b.sorted {
		slices.SortFunc(b.e, func(x, y schedEntry) int { return cmp.Compare(y.due, x.due) })
		for i, e := range b.e {
			e.l.index = i
		}
		b.sorted = true
	}
	return b
}

func (s *schedule) newBucket(tick int64) *bucket {
	var b *bucket
	if n := len(s.free); n > 0 {
		b = s.free[n-1]
		s.free[n-1] = nil
		s.free = s.free[:n-1]
	} else {
		b = new(bucket)
	}
	b.tick, b.sorted = tick, true
	if s.byTick == nil {
		s.byTick = make(map[int64]*bucket)
	}
	s.byTick[tick] = b
	s.buckets = append(s.buckets, b)
	s.up(len(s.buckets) - 1)
	return b
}

func (s *schedule) up(i int) {
	b := s.buckets[i]
	for i > 0 {
		p := (i - 1) / 2
		if s.buckets[p].tick <= b.tick {
			break
		}
		s.buckets[i] = s.buckets[p]
		i = p
	}
	s.buckets[i] = b
}

func (s *schedule) down(i int) {
	if i >= len(s.buckets) {
		return
	}
	b := s.buckets[i]
	for {
		c := 2*i + 1
		if c >= len(s.buckets) {
			break
		}
		if c+1 < len(s.buckets) && s.buckets[c+1].tick < s.buckets[c].tick {
			c++
		}
		if b.tick <= s.buckets[c].tick {
			break
		}
		s.buckets[i] = s.buckets[c]
		i = c
	}
	s.buckets[i] = b
}
