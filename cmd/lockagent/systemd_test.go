package main

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/agent"
)

// sent is one sd_notify message and when it was sent.
type sent struct {
	at  time.Duration // since the start of the test's bubble
	msg string
}

// recorder is a notifier whose messages are kept for the test.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	msgs  []sent
}

func newRecorder(watchdog time.Duration) (*notifier, *recorder) {
	r := &recorder{start: time.Now()}
	n := &notifier{listened: true, watchdog: watchdog, backend: "memory", log: hclog.NewNullLogger()}
	n.send = func(state string) (bool, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.msgs = append(r.msgs, sent{time.Since(r.start), state})
		return true, nil
	}
	return n, r
}

// with returns the times of the messages that have the line.
func (r *recorder) with(line string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var at []time.Duration
	for _, m := range r.msgs {
		if hasLine(m.msg, line) {
			at = append(at, m.at)
		}
	}
	return at
}

func hasLine(msg, line string) bool {
	for l := range strings.SplitSeq(msg, "\n") {
		if l == line {
			return true
		}
	}
	return false
}

// wedgeable is the agent's stats, which the test can make hang as a wedged
// agent's would.
type wedgeable struct {
	mu     sync.Mutex
	st     agent.Stats
	wedged chan struct{} // while non-nil, stats blocks until it is closed
}

func (w *wedgeable) stats() agent.Stats {
	w.mu.Lock()
	ch := w.wedged
	w.mu.Unlock()
	if ch != nil {
		<-ch
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.st
}

func (w *wedgeable) set(st agent.Stats) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.st = st
}

// TestWatchdogFedAtHalfItsInterval: with WatchdogSec=1s the agent feeds
// the watchdog every 500ms, no sooner and no later, and stops when it
// stops.
func TestWatchdogFedAtHalfItsInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, r := newRecorder(time.Second)
		w := &wedgeable{}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); supervise(ctx, n, nil, nil, &upgrader{}, w.stats, nil) }()

		time.Sleep(2*time.Second + 250*time.Millisecond)
		cancel()
		<-done
		time.Sleep(2 * time.Second)
		ms := time.Millisecond
		assert.Equal(t, []time.Duration{500 * ms, 1000 * ms, 1500 * ms, 2000 * ms}, r.with("WATCHDOG=1"))
	})
}

// TestWatchdogStopsWhileWedged: while the agent's stats do not come back
// (its lock is held forever), the watchdog is not fed; it is again once
// they do.
func TestWatchdogStopsWhileWedged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, r := newRecorder(time.Second)
		w := &wedgeable{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go supervise(ctx, n, nil, nil, &upgrader{}, w.stats, nil)

		time.Sleep(time.Second + 250*time.Millisecond) // fed at 500ms and 1s
		unwedge := make(chan struct{})
		w.mu.Lock()
		w.wedged = unwedge
		w.mu.Unlock()
		time.Sleep(5 * time.Second)
		ms := time.Millisecond
		require.Equal(t, []time.Duration{500 * ms, 1000 * ms}, r.with("WATCHDOG=1"), "fed while wedged")

		w.mu.Lock()
		w.wedged = nil
		w.mu.Unlock()
		close(unwedge) // the check stuck since 1.5s returns now, at 6.25s
		time.Sleep(time.Second)
		// Then the one tick kept meanwhile, at once, and the ticks resume
		// on their own schedule.
		assert.Equal(t, []time.Duration{500 * ms, 1000 * ms, 6250 * ms, 6250 * ms, 6500 * ms, 7000 * ms}, r.with("WATCHDOG=1"))
	})
}

// TestStatusLineFollowsTheAgent: the status line goes out at readiness,
// then only when it changes, with the watchdog's next feed.
func TestStatusLineFollowsTheAgent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, r := newRecorder(time.Second)
		w := &wedgeable{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		n.ready(w.stats())
		go supervise(ctx, n, nil, nil, &upgrader{}, w.stats, nil)

		time.Sleep(time.Second + 250*time.Millisecond)
		w.set(agent.Stats{Sessions: 3, Leases: 2, Waiters: 1, Degraded: true})
		time.Sleep(time.Second)
		w.set(agent.Stats{Sessions: 3, Leases: 2, Waiters: 1})
		time.Sleep(time.Second)
		w.set(agent.Stats{Sessions: 3, Leases: 2, Waiters: 1, BackendError: "backend: unavailable", BackendErrorAt: time.Date(2026, 12, 1, 6, 30, 5, 0, time.Local)})
		time.Sleep(time.Second)

		r.mu.Lock()
		defer r.mu.Unlock()
		var status []string
		for _, m := range r.msgs {
			for l := range strings.SplitSeq(m.msg, "\n") {
				if strings.HasPrefix(l, "STATUS=") {
					status = append(status, l)
				}
			}
		}
		assert.Equal(t, []string{
			"STATUS=0 sessions, 0 leases, 0 waiting; backend memory: ok",
			"STATUS=3 sessions, 2 leases, 1 waiting; backend memory: degraded (renewals failing)",
			"STATUS=3 sessions, 2 leases, 1 waiting; backend memory: ok",
			"STATUS=3 sessions, 2 leases, 1 waiting; backend memory: unavailable (a call failed at 06:30:05)",
		}, status)
		assert.Equal(t, "READY=1\nSTATUS=0 sessions, 0 leases, 0 waiting; backend memory: ok", r.msgs[0].msg)
		assert.Equal(t, "WATCHDOG=1\n"+status[1], r.msgs[3].msg, "fed at 500ms, 1s, then at 1.5s with the new status")
	})
}

// TestStatusWithoutWatchdog: without a watchdog, the status line is still
// refreshed, every statusEvery, and nothing feeds a watchdog.
func TestStatusWithoutWatchdog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, r := newRecorder(0)
		w := &wedgeable{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		n.ready(w.stats())
		go supervise(ctx, n, nil, nil, &upgrader{}, w.stats, nil)

		w.set(agent.Stats{Sessions: 1})
		time.Sleep(statusEvery + time.Second)
		assert.Empty(t, r.with("WATCHDOG=1"))
		assert.Equal(t, []time.Duration{0}, r.with("READY=1"))
		assert.Equal(t, []time.Duration{statusEvery}, r.with("STATUS=1 sessions, 0 leases, 0 waiting; backend memory: ok"))
	})
}

// TestReloadIsBracketed: SIGHUP reloads between RELOADING=1 (with the
// monotonic time newer systemd versions want) and READY=1.
func TestReloadIsBracketed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, r := newRecorder(0)
		w := &wedgeable{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		hup := make(chan os.Signal, 1)
		reloaded := 0
		reload := func() {
			reloaded++
			r.mu.Lock()
			defer r.mu.Unlock()
			require.Len(t, r.msgs, 1, "RELOADING=1 comes before the reload")
		}
		go supervise(ctx, n, hup, nil, &upgrader{}, w.stats, reload)

		hup <- syscall.SIGHUP
		synctest.Wait()
		require.Equal(t, 1, reloaded)
		r.mu.Lock()
		defer r.mu.Unlock()
		require.Len(t, r.msgs, 2)
		assert.Regexp(t, `^RELOADING=1\nMONOTONIC_USEC=[0-9]+$`, r.msgs[0].msg)
		assert.True(t, hasLine(r.msgs[1].msg, "READY=1"), r.msgs[1].msg)
	})
}

// TestOutsideSystemdNothingIsSent: without NOTIFY_SOCKET, no message and
// no ticker.
func TestOutsideSystemdNothingIsSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, r := newRecorder(0)
		n.listened = false
		require.Zero(t, n.period())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		calls := 0
		go supervise(ctx, n, nil, nil, &upgrader{}, func() agent.Stats { calls++; return agent.Stats{} }, nil)
		n.ready(agent.Stats{})
		time.Sleep(time.Hour)
		n.stopping()
		assert.Empty(t, r.msgs)
		assert.Zero(t, calls)
	})
}

// TestJournalPriorities: on the journal, every line of an entry carries
// its level's syslog priority.
func TestJournalPriorities(t *testing.T) {
	var buf bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Name: "lockagent", Level: hclog.Trace, Output: journalWriter{&buf}, DisableTime: true})
	log.Trace("t")
	log.Debug("d")
	log.Info("i")
	log.Warn("w")
	log.Error("e", "detail", "two\nlines")
	assert.Equal(t, `<7>[TRACE] lockagent: t
<7>[DEBUG] lockagent: d
<6>[INFO]  lockagent: i
<4>[WARN]  lockagent: w
<3>[ERROR] lockagent: e:
<3>  detail=
<3>  | two
<3>  | lines
<3>  
`, buf.String())

	buf.Reset()
	log = hclog.New(&hclog.LoggerOptions{Name: "lockagent", Output: journalWriter{&buf}, JSONFormat: true, DisableTime: true})
	log.Warn("w", "k", 1)
	assert.Equal(t, `<4>{"@level":"warn","@message":"w","@module":"lockagent","k":1}`+"\n", buf.String())
}

// TestOnJournal: stderr is the journal's only when JOURNAL_STREAM names
// its device and inode.
func TestOnJournal(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "stream")
	require.NoError(t, err)
	defer f.Close()
	fi, err := f.Stat()
	require.NoError(t, err)
	st := fi.Sys().(*syscall.Stat_t)
	other, err := os.CreateTemp(t.TempDir(), "other")
	require.NoError(t, err)
	defer other.Close()

	stream := strconv.FormatUint(uint64(st.Dev), 10) + ":" + strconv.FormatUint(st.Ino, 10)
	assert.True(t, onJournal(f, stream))
	assert.False(t, onJournal(other, stream), "a redirected stderr")
	assert.False(t, onJournal(f, ""))
	assert.False(t, onJournal(f, "1:x"))
	assert.False(t, onJournal(f, "12345"))
}
