// Package peerlog rate-limits the log lines that one uid's requests and
// connections cause, so that a misbehaving peer cannot flood the log:
// each uid may log a burst, then one line per interval; the next line it
// logs says how many were left out. The agent and the socket server share
// one Limiter, so that a uid's budget is one.
package peerlog

import (
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Limiter keeps the budget of each uid. Its methods are safe for
// concurrent use.
type Limiter struct {
	burst    int
	interval time.Duration

	mu   sync.Mutex
	uids map[uint32]*bucket
}

type bucket struct {
	tokens     float64
	last       time.Time
	suppressed int
}

// maxBuckets bounds the uids tracked; when full, tracking starts over.
const maxBuckets = 4096

// New returns a Limiter that lets each uid log burst lines at once, then
// one per interval.
func New(burst int, interval time.Duration) *Limiter {
	return &Limiter{burst: burst, interval: interval}
}

// Default is the agent's limit: 10 lines at once, then one every 10
// seconds, per uid.
func Default() *Limiter { return New(10, 10*time.Second) }

// allow tells whether uid may log a line now, and how many of its lines
// were suppressed since the last one that was logged.
func (l *Limiter) allow(uid uint32, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.uids[uid]
	if b == nil {
		if l.uids == nil || len(l.uids) >= maxBuckets {
			l.uids = make(map[uint32]*bucket)
		}
		b = &bucket{tokens: float64(l.burst), last: now}
		l.uids[uid] = b
	}
	b.tokens = min(float64(l.burst), b.tokens+float64(now.Sub(b.last))/float64(l.interval))
	b.last = now
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	n := b.suppressed
	b.suppressed = 0
	return true, n
}

// Log logs msg at level on log, unless uid has logged too much lately.
func (l *Limiter) Log(log hclog.Logger, level hclog.Level, uid uint32, msg string, args ...any) {
	ok, suppressed := l.allow(uid, time.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed_before", suppressed)
	}
	log.Log(level, msg, args...)
}
