// Package agent is the heart of lockagent: sessions, leases and their scopes,
// waiting acquires (queued first come, first served in the backend), leader
// campaigns, the renewal scheduler and lost-lease detection, and the events
// each session is told.
//
// It talks to a backend.Backend and to the connections attached to its
// sessions through the small Conn interface. It knows nothing of JSON,
// sockets or Redis.
package agent

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/internal/peerlog"
)

// Config is what an Agent needs. Zero values take the defaults noted.
type Config struct {
	Backend backend.Backend // required
	Logger  hclog.Logger    // default: a null logger
	Host    string          // the host name shown to inspect
	Version string          // reported by hello

	DefaultTTL time.Duration // default 15s
	MinTTL     time.Duration // default 1s
	MaxTTL     time.Duration // default 24h

	MaxSessions         int // default 10000
	MaxLeasesPerSession int // held and pending, default 1000
	MaxWaiters          int // waiting acquires across the agent, default 10000

	// Access is who may lock what and who is an admin; SetAccess changes
	// it later. Default: no rules, uid 0 the only admin.
	Access Access

	// MaxSessionsPerUID caps the sessions of one uid, those waiting to
	// be resumed included; MaxLeasesPerUID caps the leases (held and
	// pending) of all the sessions of one uid. 0: no cap beyond the
	// global ones.
	MaxSessionsPerUID, MaxLeasesPerUID int

	// Observer, if set, is told of acquisitions, renewals, lost leases and
	// backend errors, for metrics.
	Observer Observer

	// PeerLog rate-limits the log lines a peer causes (its campaigns'
	// failed attempts and elections); the socket server shares it.
	// Default: one of its own (peerlog.Default).
	PeerLog *peerlog.Limiter

	// NotifyBudget is the time the agent allows itself to deliver a lost
	// event; it is part of the safety margin. Default 50ms.
	NotifyBudget time.Duration

	// BootClock reads a clock that keeps counting while the host is
	// suspended. Default CLOCK_BOOTTIME; tests set their own.
	BootClock func() time.Duration
}

func (c *Config) setDefaults() {
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.PeerLog == nil {
		c.PeerLog = peerlog.Default()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.DefaultTTL, 15*time.Second)
	def(&c.MinTTL, time.Second)
	def(&c.MaxTTL, 24*time.Hour)
	def(&c.NotifyBudget, 50*time.Millisecond)
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	defInt(&c.MaxSessions, 10000)
	defInt(&c.MaxLeasesPerSession, 1000)
	defInt(&c.MaxWaiters, 10000)
	if c.BootClock == nil {
		c.BootClock = bootTime
	}
}

// Limits of the wire-visible arguments, from protocol.md.
const (
	MaxNameBytes    = 256
	MaxMetaBytes    = 256
	MaxSessionTTL   = time.Hour
	MinHeartbeat    = 100 * time.Millisecond
	MaxHeartbeat    = time.Hour
	MaxLimit        = 1 << 31 // a shared acquire's limit
	maxClientLength = 256
)

// Agent owns sessions, leases and their renewals. Create it with New, start
// it with Run.
type Agent struct {
	cfg Config
	b   backend.Backend
	log hclog.Logger
	// local: the backend's calls are function calls (see backend.Local),
	// and releases are not owed.
	local bool

	// mu guards everything below, and every session's and lease's mutable
	// fields. It is never held across a backend call or a blocking send.
	// A function that must be called with it held says so in the last
	// sentence of its doc comment, "a.mu is held.", as every package of
	// the project does for its own mutexes.
	mu       sync.Mutex
	sessions map[string]*Session
	leases   map[string]*lease         // by lease id
	queues   map[string]*queue         // by name; present while it has waiters
	gone     map[string]*goneRelease   // by name; see willRelease
	owed     map[string][]*owedRelease // by name; see owe
	// flushTimer sends the owed releases no attempt took (flushOwed);
	// flushArmed while it runs.
	flushTimer *time.Timer
	flushArmed bool
	telling    map[string]*telling // by name; see told
	waiters    int                 // waiting acquires across every queue
	sched      schedule
	closing    bool      // Run is shutting down: no new sessions or grants
	atRisk     int       // leases whose last renewal had an unknown outcome
	degraded   bool      // atRisk > 0, as last told to the sessions
	nextWake   time.Time // when the scheduler wakes next unless kicked
	// wakeBy is nextWake as time since started, for LoseOverdue's look
	// without the lock.
	wakeBy  atomic.Int64
	started time.Time // this process's start
	// since is when the agent first started, before the upgrades that
	// handed its state over from process to process (see Restore).
	since    time.Time
	lastSeen stamp          // the scheduler's last look at the clocks
	perUID   map[uint32]int // leases held and pending, by the uid of their session
	sessUID  map[uint32]int // sessions, by uid

	access atomic.Pointer[Access] // read without mu
	audit  hclog.Logger

	kick chan struct{} // wakes the scheduler when the schedule's head changes
	wg   sync.WaitGroup
	// stopping ends when Run starts shutting down (stop ends it); the
	// releases retried in the background end with it.
	stopping context.Context
	stop     context.CancelFunc
	done     chan struct{} // closed when Run has returned

	unavailable atomic.Pointer[unavailability] // see note; nil while the backend answers
	reachedAt   atomic.Int64                   // see note: a call reached the backend, in Unix ns

	// The handover's gate (see Freeze), guarded by mu: while frozen, no
	// step that calls the backend starts; steps counts those under way,
	// and stepped is broadcast when it falls to 0 and when frozen ends.
	frozen  bool
	steps   int
	stepped *sync.Cond
}

// New returns an agent for cfg. It starts nothing: call Run.
func New(cfg Config) *Agent {
	cfg.setDefaults()
	a := &Agent{
		cfg:      cfg,
		b:        cfg.Backend,
		log:      cfg.Logger,
		audit:    cfg.Logger.Named("audit"),
		sessions: make(map[string]*Session),
		leases:   make(map[string]*lease),
		queues:   make(map[string]*queue),
		gone:     make(map[string]*goneRelease),
		owed:     make(map[string][]*owedRelease),
		telling:  make(map[string]*telling),
		perUID:   make(map[uint32]int),
		sessUID:  make(map[uint32]int),
		kick:     make(chan struct{}, 1),
		done:     make(chan struct{}),
		started:  time.Now(),
	}
	a.since = a.started
	if l, ok := a.b.(backend.Local); ok {
		a.local = l.Local()
	}
	a.sched.origin = a.started
	a.stepped = sync.NewCond(&a.mu)
	a.flushTimer = time.AfterFunc(time.Hour, a.flushOwed)
	a.flushTimer.Stop()
	a.stopping, a.stop = context.WithCancel(context.Background())
	a.SetAccess(cfg.Access)
	return a
}

// Info is what hello reports about the agent.
type Info struct {
	Version                    string
	Backend                    string
	DefaultTTL, MinTTL, MaxTTL time.Duration
}

// Info describes the agent.
func (a *Agent) Info() Info {
	return Info{a.cfg.Version, a.b.Name(), a.cfg.DefaultTTL, a.cfg.MinTTL, a.cfg.MaxTTL}
}

// Run renews leases and detects lost ones until ctx is done. Then it shuts
// down: every session is told `shutdown`, every lease is released, every
// session ends, and Run returns nil once every goroutine it started has
// finished. Cancelling ctx is how callers stop it.
func (a *Agent) Run(ctx context.Context) error {
	defer close(a.done)
	a.scheduleLoop(ctx)
	a.shutdown()
	a.wg.Wait()
	return nil
}

// Done is closed when Run has returned.
func (a *Agent) Done() <-chan struct{} { return a.done }

// shutdown tells every session, then ends them, releasing every lease.
func (a *Agent) shutdown() {
	a.mu.Lock()
	a.closing = true
	a.stop()
	a.flushTimer.Stop()
	a.flushArmed = false
	a.sendOwed()
	var ended []*lease
	for _, s := range a.sessions {
		s.send(Event{Kind: EventShutdown, Message: "the agent is stopping; every lease is being released"})
		ended = append(ended, s.end(false)...)
	}
	a.mu.Unlock()
	// Release synchronously, with a bound, so that the backend is clean
	// before the agent exits.
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	for _, l := range ended {
		a.releaseBackend(ctx, l)
	}
}

// releaseTimeout bounds the backend releases done for one session or at
// shutdown, or for a request.
const releaseTimeout = 5 * time.Second

// detached returns the context of backend releases asked for by a request
// (resign, break, bye; release detaches without a bound, see
// Session.Release) of leases the agent has already dropped:
// they must outlive the request, whose connection may close or lose its
// session to a resume meanwhile, or the names would stay held in the
// backend until their TTLs end. releaseTimeout bounds them instead.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
}

// margin is how much earlier than the backend the agent gives a lease up:
// clock-rate drift (1%), the backend's expiry precision, and the time to
// deliver the lost event.
func (a *Agent) margin(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond + a.cfg.NotifyBudget
}

// releaseBackend releases l, which the agent has dropped, in the backend.
// A release the backend was unavailable for is tried again in the
// background (see retryRelease); other failures are logged, since the
// lease will expire there on its own.
func (a *Agent) releaseBackend(ctx context.Context, l *lease) {
	a.enter()
	defer a.exit()
	a.releaseStep(ctx, l)
}

// releaseStep is releaseBackend inside a step of the handover's gate.
func (a *Agent) releaseStep(ctx context.Context, l *lease) {
	err := a.b.Release(ctx, l.key())
	a.called("release", err)
	if err == nil || errors.Is(err, backend.ErrNotHeld) {
		return
	}
	if errors.Is(err, backend.ErrUnavailable) && a.retryRelease(l) {
		a.log.Warn("release failed; trying again until the lease would expire in the backend", "name", l.name, "lease", l.id, "error", err)
		return
	}
	a.log.Warn("release failed; the lease will expire in the backend", "name", l.name, "lease", l.id, "error", err)
}

// Retries of a failed release start after releaseRetry, and double up to
// maxReleaseRetry.
const (
	releaseRetry    = 100 * time.Millisecond
	maxReleaseRetry = 2 * time.Second
)

// retryRelease tries again, in the background, to release l: a backend
// unavailable for a moment (a failover, a slot of a Cluster on the move,
// a dropped connection) would otherwise leave l's name held there until
// the lease expires, though its holder let it go. It tries until l's local
// deadline, after which the backend lets the lease go anyway, or until the
// agent stops. It reports false when it does not try: the deadline passed,
// or the agent is stopping.
func (a *Agent) retryRelease(l *lease) bool {
	until := l.validUntil
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closing || !time.Now().Before(until) {
		return false
	}
	a.wg.Add(1) // under a.mu, not closing: before Run waits
	go func() {
		defer a.wg.Done()
		for wait := releaseRetry; ; wait = min(2*wait, maxReleaseRetry) {
			t := time.NewTimer(wait)
			select {
			case <-a.stopping.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if !time.Now().Before(until) {
				return
			}
			// A try ends with the agent's stop too, so as not to hold up
			// its shutdown.
			ctx, cancel := context.WithDeadline(a.stopping, earliest(until, time.Now().Add(releaseTimeout)))
			a.enter()
			err := a.b.Release(ctx, l.key())
			a.exit()
			cancel()
			a.called("release", err)
			switch {
			case err == nil, errors.Is(err, backend.ErrNotHeld):
				a.log.Info("release done on a later try", "name", l.name, "lease", l.id)
				return
			case !errors.Is(err, backend.ErrUnavailable):
				a.log.Warn("release failed; the lease will expire in the backend", "name", l.name, "lease", l.id, "error", err)
				return
			}
		}
	}()
	return true
}

// goneRelease is the releases of a name's leases on their way to the
// backend after their connection or session went (see willRelease).
type goneRelease struct {
	n    int
	done chan struct{} // closed when n falls to 0
}

// willRelease notes that ls, dropped because their connection or session
// went, are on their way to the backend, until releaseAll has released
// them: a try of one of their names waits for that (see begin), so that an
// application that reconnects at once is not refused the name its old
// connection held. a.mu is held.
func (a *Agent) willRelease(ls []*lease) {
	for _, l := range ls {
		g := a.gone[l.name]
		if g == nil {
			g = &goneRelease{done: make(chan struct{})}
			a.gone[l.name] = g
		}
		g.n++
	}
}

// releaseAll releases leases noted by willRelease in the backend, waiting
// releaseTimeout at most; a release the backend was unavailable for is
// tried again in the background (see releaseBackend).
func (a *Agent) releaseAll(ls []*lease) {
	if len(ls) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	for _, l := range ls {
		a.releaseBackend(ctx, l)
		a.mu.Lock()
		if g := a.gone[l.name]; g != nil {
			if g.n--; g.n == 0 {
				close(g.done)
				delete(a.gone, l.name)
			}
		}
		a.mu.Unlock()
	}
}

// releaseLater releases leases in the background, on a goroutine Run waits
// for. a.mu is held.
func (a *Agent) releaseLater(ls []*lease) {
	if len(ls) == 0 {
		return
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		for _, l := range ls {
			a.releaseBackend(ctx, l)
		}
	}()
}

// leaveLater takes a waiter's ticket out of the backend's queue in the
// background, on a goroutine Run waits for. If it fails, the ticket
// expires on its own. a.mu is held.
func (a *Agent) leaveLater(name, ticket string) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		a.enter()
		defer a.exit()
		if err := a.b.Leave(ctx, name, ticket); err != nil {
			a.log.Debug("leaving the queue failed; the ticket will expire", "name", name, "error", err)
		}
	}()
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newID returns prefix followed by 128 random bits.
func newID(prefix string) string {
	var b [16]byte
	rand.Read(b[:])
	return prefix + idEncoding.EncodeToString(b[:])
}
