package socketapi

import (
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// peerLogger rate-limits the log lines that one uid's requests and
// connections cause, so that a misbehaving peer cannot flood the log: each
// uid may log a burst, then one line per interval; the next line it logs
// says how many were left out.
type peerLogger struct {
	log      hclog.Logger
	burst    int
	interval time.Duration

	mu   sync.Mutex
	uids map[uint32]*logBucket
}

type logBucket struct {
	tokens     float64
	last       time.Time
	suppressed int
}

// maxLogBuckets bounds the uids tracked; when full, tracking starts over.
const maxLogBuckets = 4096

// allow tells whether uid may log a line now, and how many of its lines
// were suppressed since the last one that was logged.
func (pl *peerLogger) allow(uid uint32, now time.Time) (bool, int) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	b := pl.uids[uid]
	if b == nil {
		if pl.uids == nil || len(pl.uids) >= maxLogBuckets {
			pl.uids = make(map[uint32]*logBucket)
		}
		b = &logBucket{tokens: float64(pl.burst), last: now}
		pl.uids[uid] = b
	}
	b.tokens = min(float64(pl.burst), b.tokens+float64(now.Sub(b.last))/float64(pl.interval))
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

// Log logs msg at level, unless uid has logged too much lately.
func (pl *peerLogger) Log(level hclog.Level, uid uint32, msg string, args ...any) {
	ok, suppressed := pl.allow(uid, time.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed_before", suppressed)
	}
	pl.log.Log(level, msg, args...)
}
