package agent

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestScheduleOrder: after random pushes, changes of due time (of the
// first lease too, as the scheduler does), removals and looks at the
// first lease, the schedule gives leases back earliest first, and every
// lease knows its place. Due times fall in the same bucket and in many,
// at the same instant, before the origin and hours after it.
func TestScheduleOrder(t *testing.T) {
	origin := time.Now()
	s := schedule{origin: origin}
	r := rand.New(rand.NewPCG(1, 2))
	in := map[*lease]bool{}
	at := func() time.Time {
		switch r.IntN(8) {
		case 0:
			return origin // many at one instant
		case 1:
			return origin.Add(-time.Duration(r.IntN(100)) * time.Millisecond)
		case 2:
			return origin.Add(time.Duration(r.IntN(10)) * time.Hour)
		default:
			return origin.Add(time.Duration(r.Int64N(int64(time.Second))))
		}
	}
	earliest := func() time.Time {
		var first time.Time
		for l := range in {
			if first.IsZero() || l.nextRenew.Before(first) {
				first = l.nextRenew
			}
		}
		return first
	}
	for range 20000 {
		switch op := r.IntN(6); {
		case op <= 1 || len(in) == 0:
			l := &lease{nextRenew: at(), index: -1}
			s.push(l)
			in[l] = true
		case op == 2:
			for l := range in {
				l.nextRenew = at()
				s.fix(l)
				break
			}
		case op == 3:
			require.Equal(t, earliest(), s.next())
			l := s.top()
			require.Equal(t, s.next(), l.nextRenew)
			l.nextRenew = at()
			s.fix(l)
		case op == 4:
			require.Equal(t, earliest(), s.next())
			require.Equal(t, s.next(), s.top().nextRenew)
		default:
			for l := range in {
				s.remove(l)
				require.Equal(t, -1, l.index)
				require.Nil(t, l.bucket)
				delete(in, l)
				break
			}
		}
		requirePlaces(t, &s, len(in))
	}
	var want []time.Time
	for l := range in {
		want = append(want, l.nextRenew)
	}
	slices.SortFunc(want, func(a, b time.Time) int { return a.Compare(b) })
	for _, w := range want {
		require.Equal(t, w, s.next())
		s.remove(s.top())
	}
	require.Zero(t, s.len())
}

// requirePlaces checks that the schedule holds n leases, each in the
// bucket of its due time at the place it knows, and that its buckets are
// found by tick and in heap order.
func requirePlaces(t *testing.T, s *schedule, n int) {
	t.Helper()
	require.Equal(t, n, s.len())
	require.Len(t, s.byTick, len(s.buckets))
	held := 0
	for i, b := range s.buckets {
		if s.byTick[b.tick] != b {
			t.Fatalf("bucket of tick %d not found by its tick", b.tick)
		}
		if i > 0 && s.buckets[(i-1)/2].tick > b.tick {
			t.Fatalf("bucket %d (tick %d) before its parent (tick %d)", i, b.tick, s.buckets[(i-1)/2].tick)
		}
		for j, e := range b.e {
			switch {
			case e.l.bucket != b || e.l.index != j:
				t.Fatalf("lease at %d of bucket %d thinks it is at %d of %p", j, b.tick, e.l.index, e.l.bucket)
			case e.due != int64(e.l.due().Sub(s.origin)):
				t.Fatalf("lease at %d of bucket %d: due %d, wants %v", j, b.tick, e.due, e.l.due().Sub(s.origin))
			case e.due>>tickShift != b.tick:
				t.Fatalf("lease due %d in bucket %d", e.due, b.tick)
			case b.sorted && j > 0 && e.due > b.e[j-1].due:
				t.Fatalf("sorted bucket %d out of order at %d", b.tick, j)
			}
		}
		held += len(b.e)
	}
	require.Equal(t, n, held)
}

// TestScheduleBucketsReused: buckets emptied as time passes leave the
// schedule and are used again, so that a schedule that renews the same
// leases for long keeps as many buckets as it has ticks of due times in
// use.
func TestScheduleBucketsReused(t *testing.T) {
	origin := time.Now()
	s := schedule{origin: origin}
	var ls []*lease
	for i := range 1000 {
		l := &lease{nextRenew: origin.Add(time.Duration(i) * time.Millisecond), index: -1}
		s.push(l)
		ls = append(ls, l)
	}
	most := len(s.buckets)
	for range 100 * len(ls) {
		l := s.top()
		l.nextRenew = l.nextRenew.Add(time.Second)
		s.fix(l)
		require.LessOrEqual(t, len(s.buckets), most+1)
		require.LessOrEqual(t, len(s.buckets)+len(s.free), most+1)
	}
	requirePlaces(t, &s, len(ls))
}

// TestScheduleKeepsFewEmptiedBuckets: a schedule emptied of leases due in
// many buckets keeps maxFree of them for use again, not all.
func TestScheduleKeepsFewEmptiedBuckets(t *testing.T) {
	origin := time.Now()
	s := schedule{origin: origin}
	for i := range 3 * maxFree {
		s.push(&lease{nextRenew: origin.Add(time.Duration(i) << tickShift), index: -1})
	}
	require.Len(t, s.buckets, 3*maxFree)
	for s.len() > 1 {
		s.remove(s.top())
	}
	s.top()
	require.Len(t, s.buckets, 1)
	require.Len(t, s.free, maxFree)
}
