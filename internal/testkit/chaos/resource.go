package chaos

import (
	"fmt"
	"sync"

	"github.com/lockagent/lockagent/internal/testkit/lockcheck"
)

// fencedCounter is the resource the clients update through their fencing
// tokens: a counter behind a lockcheck.Register, which refuses a token below
// the highest it has accepted. Reads are fenced as well as writes (the
// storage checks the token on every access, as Kleppmann describes): a read
// with a token raises the register's high-water mark, so that an older
// holder's write after a newer holder's read is refused, and a
// read-modify-write under the lock never loses an update.
type fencedCounter struct {
	mu       sync.Mutex
	reg      lockcheck.Register
	value    int
	accepted []access // every accepted write, in order
}

// access is an accepted write of a fenced counter.
type access struct {
	lease int // the writer's lease number
	token uint64
	at    int64
}

// read returns the value if token is not stale.
func (f *fencedCounter) read(token uint64) (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.reg.Write(token) {
		return 0, false
	}
	return f.value, true
}

// write stores v if token is not stale, recording the write as lease's.
func (f *fencedCounter) write(token uint64, v int, lease int, at int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.reg.Write(token) {
		return false
	}
	f.value = v
	f.accepted = append(f.accepted, access{lease: lease, token: token, at: at})
	return true
}

// plainCounter is the same resource without fencing: a holder reads it,
// works a little, and writes the value plus one. Two holders at once lose
// an update. The mutex only keeps the race detector content; it does not
// make the read-modify-write atomic.
type plainCounter struct {
	mu         sync.Mutex
	value      int
	increments int
}

func (p *plainCounter) read() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.value
}

func (p *plainCounter) write(v int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.value = v
	p.increments++
}

// checkFenced checks a fenced counter after a run: it lost no update (its
// value is its number of accepted writes), and it accepted no write from a
// holder after a holder granted later (whose acquire was invoked after the
// first one's returned) had written. grants maps lease numbers to their
// acquires' [call, return].
func checkFenced(name string, f *fencedCounter, grants map[int][2]int64) []lockcheck.Violation {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []lockcheck.Violation
	if f.value != len(f.accepted) {
		out = append(out, lockcheck.Violation{Name: name, Check: "fenced", Detail: fmt.Sprintf(
			"the fenced counter is %d after %d accepted increments: %d lost", f.value, len(f.accepted), len(f.accepted)-f.value)})
	}
	var latest int64 = -1 // the latest acquire call among the writers so far
	latestLease := 0
	for _, w := range f.accepted {
		g := grants[w.lease]
		if latest > g[1] {
			out = append(out, lockcheck.Violation{Name: name, Check: "fenced", At: w.at, Detail: fmt.Sprintf(
				"a write of lease #%d (token %d) was accepted after lease #%d, asked for after #%d was granted, had written",
				w.lease, w.token, latestLease, w.lease)})
		}
		if g[0] > latest {
			latest, latestLease = g[0], w.lease
		}
	}
	return out
}
