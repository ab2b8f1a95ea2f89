package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit/faultproxy"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// fleet is several agent processes sharing one real redis-server, each
// through its own fault proxy, as the hosts of a fleet would.
type fleet struct {
	redis  *redistest.Server
	agents []*fleetAgent
}

// fleetAgent is one agent of a fleet.
type fleetAgent struct {
	env   *agentEnv
	proxy *faultproxy.Proxy
	proc  *proc
}

// startFleet starts redis-server with opts and n agents on it. extraHCL is
// added to every agent's config.
func startFleet(t *testing.T, n int, opts redistest.Options, extraHCL string) *fleet {
	t.Helper()
	f := &fleet{redis: redistest.Start(t, opts)}
	for i := 0; i < n; i++ {
		f.agents = append(f.agents, f.addAgent(t, extraHCL))
	}
	return f
}

// addAgent starts one more agent on the fleet's Redis.
func (f *fleet) addAgent(t *testing.T, extraHCL string) *fleetAgent {
	t.Helper()
	a := &fleetAgent{env: newAgentEnv(t), proxy: faultproxy.New(t, f.redis.Addr())}
	a.env.writeConfig(t, fmt.Sprintf("backend \"redis\" {\n  addresses  = [%q]\n  key_prefix = \"e2e\"\n}\n%s", a.proxy.Addr(), extraHCL))
	a.start(t)
	return a
}

// client connects an application to the agent.
func (a *fleetAgent) client(t *testing.T, name string) *client.Client {
	t.Helper()
	return dialAgent(t, a.env.socket, name)
}

// start starts the agent (again, after it stopped or was killed); it is
// stopped with SIGTERM at the end of the test if it still runs.
func (a *fleetAgent) start(t *testing.T) {
	t.Helper()
	p := a.env.start(t)
	a.proc = p
	t.Cleanup(func() {
		if !p.exited() {
			stopAgent(t, p)
		}
	})
}

// waitQueued waits until the agent has n acquires waiting, across its
// sessions.
func (a *fleetAgent) waitQueued(t *testing.T, n int) {
	t.Helper()
	c := a.client(t, "observer")
	eventually(t, 5*time.Second, fmt.Sprintf("%d waiting acquires", n), func() bool {
		var res struct {
			Sessions []struct {
				Waiting []struct{} `json:"waiting"`
			} `json:"sessions"`
		}
		call(t, c, "list", map[string]any{"all": true}, &res)
		got := 0
		for _, s := range res.Sessions {
			got += len(s.Waiting)
		}
		return got == n
	})
}

// receive returns the next value of ch, failing the test with what did
// not happen if none comes within callTimeout.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(callTimeout):
		t.Fatal(what)
		var zero T
		return zero
	}
}

// leaseMargin is the agent's safety margin for a TTL (docs/protocol.md, "When
// a lease is lost"): TTL/100 + 2 ms + the 50 ms notify budget.
func leaseMargin(ttl time.Duration) time.Duration { return ttl/100 + 52*time.Millisecond }

// renewMax is the longest renew interval: TTL/3 plus 10% jitter.
func renewMax(ttl time.Duration) time.Duration { return ttl/3 + ttl/30 }

// lockKey is the Redis key of an exclusive lock (key_prefix "e2e").
func lockKey(name string) string { return "e2e:lk:{" + name + "}" }

// ttlArg is the extra acquire argument for a TTL.
func ttlArg(ttl time.Duration) map[string]any { return map[string]any{"ttl_ms": ttl.Milliseconds()} }

// afterRelease is ttlArg for an acquire of a name just released through
// another agent: Redis hears of a release within a millisecond of its
// answer (docs/protocol.md, release), and the acquire waits that long.
func afterRelease(ttl time.Duration) map[string]any {
	return map[string]any{"ttl_ms": ttl.Milliseconds(), "wait_ms": 1000}
}

// msString formats a duration in whole milliseconds, for the summary lines.
func msString(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }

// checkResult is check's result.
type checkResult struct {
	Held        bool   `json:"held"`
	Token       uint64 `json:"token"`
	ExpiresInMs int64  `json:"expires_in_ms"`
}

// grab is an acquire's outcome, and when it came.
type grab struct {
	l   lease
	at  time.Time
	err error
}

// recordedEvent is an event with the time it reached the test.
type recordedEvent struct {
	at time.Time
	client.Event
}

// eventLog records every event of a connection as it arrives.
type eventLog struct {
	mu  sync.Mutex
	evs []recordedEvent
}

// recordEvents drains c's events into a log, until the connection ends.
// Do not use waitEvent on c as well.
func recordEvents(c *client.Client) *eventLog {
	l := &eventLog{}
	go func() {
		for ev := range c.Events() {
			at := time.Now()
			l.mu.Lock()
			l.evs = append(l.evs, recordedEvent{at, ev})
			l.mu.Unlock()
		}
	}()
	return l
}

func (l *eventLog) all() []recordedEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]recordedEvent(nil), l.evs...)
}

// lost returns the lost event of a lease, if it came.
func (l *eventLog) lost(leaseID string) (recordedEvent, bool) {
	for _, ev := range l.all() {
		if ev.Event.Event == "lost" && ev.Lease == leaseID {
			return ev, true
		}
	}
	return recordedEvent{}, false
}

// lostSoon is lost, giving the event up to d to be recorded: it reaches
// the client before a response that follows it, but the recording
// goroutine may not have caught up yet.
func (l *eventLog) lostSoon(leaseID string, d time.Duration) (recordedEvent, bool) {
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		if ev, ok := l.lost(leaseID); ok || time.Since(start) > d {
			return ev, ok
		}
	}
}

func (l *eventLog) waitLost(t *testing.T, leaseID string, timeout time.Duration) recordedEvent {
	t.Helper()
	var ev recordedEvent
	eventually(t, timeout, "a lost event for "+leaseID, func() bool {
		var ok bool
		ev, ok = l.lost(leaseID)
		return ok
	})
	return ev
}

// count counts the events of a kind (and, for backend events, a state).
func (l *eventLog) count(kind, state string) int {
	n := 0
	for _, ev := range l.all() {
		if ev.Event.Event == kind && (state == "" || ev.State == state) {
			n++
		}
	}
	return n
}

// summary lists the events as kind[:state|reason], for logs.
func (l *eventLog) summary() string {
	return "[" + strings.Join(l.kinds(), " ") + "]"
}

// kinds lists the events as "event[:state|:reason]", for messages.
func (l *eventLog) kinds() []string {
	var out []string
	for _, ev := range l.all() {
		s := ev.Event.Event
		if ev.State != "" {
			s += ":" + ev.State
		}
		if ev.Reason != "" {
			s += ":" + ev.Reason
		}
		out = append(out, s)
	}
	return out
}

// renewCallLeases tells whether the arguments of a MONITOR'ed EVALSHA or
// EVAL ([cmd, script, numkeys, keys..., args...]) are a renewal script
// call, and if so returns the X key and lease id of each lease it renews
// (backend/redis/renew.go). The script for exclusive leases takes their X
// keys, and each one's lease id and TTL: no other script's keys are all X
// keys (ending in the hash tag's "}") with two arguments each, every
// second a number. The general script takes X, R, T per lease as keys and
// lease id, mode, ttl per lease as arguments: no other script has as many
// arguments as keys, in threes.
func renewCallLeases(args []string) (xs, leases []string, ok bool) {
	if len(args) < 3 {
		return nil, nil, false
	}
	nkeys, err := strconv.Atoi(args[2])
	if err != nil || nkeys == 0 {
		return nil, nil, false
	}
	keys := args[3:min(3+nkeys, len(args))]
	if len(args) == 3+3*nkeys && !slices.ContainsFunc(keys, func(k string) bool { return !strings.HasSuffix(k, "}") }) {
		held := true
		for j := 0; j < nkeys; j++ {
			leases = append(leases, args[3+nkeys+2*j])
			if _, err := strconv.Atoi(args[4+nkeys+2*j]); err != nil {
				held = false
			}
		}
		if held {
			return keys, leases, true
		}
		leases = nil
	}
	if nkeys%3 != 0 || len(args) != 3+2*nkeys {
		return nil, nil, false
	}
	for j := 0; j < nkeys; j += 3 {
		xs = append(xs, args[3+j])
		leases = append(leases, args[3+nkeys+j])
	}
	return xs, leases, true
}
