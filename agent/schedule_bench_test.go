package agent

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
)

// BenchmarkSchedule: the schedule's work per renewal with 100,000 leases
// (one fix to mark the head renewing, one to set its next renewal).
func BenchmarkSchedule(b *testing.B) {
	origin := time.Now()
	s := schedule{origin: origin}
	r := rand.New(rand.NewPCG(1, 2))
	// In an agent, leases lie scattered among sessions, names and ids:
	// here, among 256 bytes of other memory each.
	var other [][]byte
	for range 100000 {
		other = append(other, make([]byte, 256))
		s.push(&lease{nextRenew: origin.Add(time.Duration(r.Int64N(int64(5 * time.Second)))), index: -1})
	}
	now := origin
	for b.Loop() {
		l := s.top()
		now = s.next()
		l.renewing, l.validUntil = true, now.Add(10*time.Second)
		s.fix(l)
		l.renewing, l.nextRenew = false, now.Add(4500*time.Millisecond+time.Duration(r.Int64N(int64(time.Second))))
		s.fix(l)
	}
	runtime.KeepAlive(other)
}
