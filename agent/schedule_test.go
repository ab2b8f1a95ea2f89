package agent

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestScheduleOrder: after random pushes, changes of due time and
// removals, the schedule gives leases back earliest first, and every
// lease knows its place.
func TestScheduleOrder(t *testing.T) {
	origin := time.Now()
	s := schedule{origin: origin}
	r := rand.New(rand.NewPCG(1, 2))
	in := map[*lease]bool{}
	at := func() time.Time { return origin.Add(time.Duration(r.IntN(1000)) * time.Millisecond) }
	for range 5000 {
		switch op := r.IntN(4); {
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
		default:
			for l := range in {
				s.remove(l)
				require.Equal(t, -1, l.index)
				delete(in, l)
				break
			}
		}
		require.Equal(t, len(in), s.len())
		for i, e := range s.e {
			require.Equal(t, i, e.l.index)
		}
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
