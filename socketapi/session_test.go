package socketapi_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/backend"
)

// TestA1_ConnectionDropReleases: a dropped connection frees its locks at once.
func TestA1_ConnectionDropReleases(t *testing.T) {
	ta := startAgent(t)
	app, other := ta.raw(t), ta.raw(t)
	tokens := map[string]float64{}
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("a1/%d", i)
		tokens[name] = app.ok(fmt.Sprintf(`{"op":"acquire","name":%q}`, name))["token"].(float64)
	}
	app.nc.Close()
	for name, tok := range tokens {
		var m map[string]any
		require.Eventually(t, func() bool {
			m = other.ok(fmt.Sprintf(`{"op":"acquire","name":%q}`, name))
			return m["acquired"] == true
		}, time.Second, time.Millisecond)
		assert.Greater(t, m["token"], tok)
	}
}

func TestSessionScopeAndResume(t *testing.T) {
	ta := startAgent(t)
	a := ta.raw(t)
	h := a.ok(`{"id":1,"op":"hello","session_ttl_ms":60000,"client":"resumer"}`)
	s := a.ok(`{"id":2,"op":"acquire","name":"sess","scope":"session"}`)
	assert.Equal(t, "session", s["scope"])
	a.ok(`{"id":3,"op":"acquire","name":"conn"}`)
	a.nc.Close()

	other := ta.raw(t)
	require.Eventually(t, func() bool {
		return other.ok(`{"op":"acquire","name":"conn"}`)["acquired"] == true
	}, time.Second, time.Millisecond, "the connection-scoped lease ends with its connection")
	assert.Equal(t, false, other.ok(`{"op":"acquire","name":"sess"}`)["acquired"], "the session-scoped one lives on")

	// While detached, the session-scoped lease is broken: the event waits.
	other.ok(`{"op":"break","name":"sess"}`)

	b := ta.raw(t)
	r := b.ok(fmt.Sprintf(`{"id":1,"op":"hello","resume":{"session":%q,"token":%q},"session_ttl_ms":1000}`, h["session"], h["resume_token"]))
	assert.Equal(t, true, r["resumed"])
	assert.Equal(t, h["session"], r["session"])
	assert.Equal(t, h["resume_token"], r["resume_token"], "the resume token stays the same")
	ev := b.recv()
	assert.Equal(t, "lost", ev["event"])
	assert.Equal(t, s["lease"], ev["lease"])
	assert.Equal(t, "broken", ev["reason"])
}

func TestResumeKeepsLeases(t *testing.T) {
	ta := startAgent(t)
	a := ta.raw(t)
	h := a.ok(`{"id":1,"op":"hello","session_ttl_ms":60000,"client":"keeper"}`)
	s := a.ok(`{"id":2,"op":"acquire","name":"keep","scope":"session"}`)

	// Resuming while the first connection is still attached closes it.
	b := ta.raw(t)
	b.ok(fmt.Sprintf(`{"id":1,"op":"hello","resume":{"session":%q,"token":%q}}`, h["session"], h["resume_token"]))
	a.requireClosed()
	c := b.ok(fmt.Sprintf(`{"id":2,"op":"check","lease":%q}`, s["lease"]))
	assert.Equal(t, true, c["held"])

	// session_ttl_ms and client were not given again: they are kept, so the
	// session outlives b as well.
	b.nc.Close()
	d := ta.raw(t)
	d.ok(fmt.Sprintf(`{"id":1,"op":"hello","resume":{"session":%q,"token":%q}}`, h["session"], h["resume_token"]))
	assert.Equal(t, "keeper", d.ok(`{"op":"list"}`)["sessions"].([]any)[0].(map[string]any)["client"])
	d.ok(fmt.Sprintf(`{"id":3,"op":"release","lease":%q}`, s["lease"]))
}

func TestResumeRefused(t *testing.T) {
	ta := startAgent(t)
	a := ta.raw(t)
	h := a.ok(`{"id":1,"op":"hello","session_ttl_ms":100}`)
	a.ok(`{"id":2,"op":"acquire","name":"gone","scope":"session"}`)

	for _, resume := range []string{
		fmt.Sprintf(`{"session":%q,"token":"wrong"}`, h["session"]),
		fmt.Sprintf(`{"session":"s_unknown","token":%q}`, h["resume_token"]),
		`{}`,
	} {
		ta.raw(t).fail(`{"id":1,"op":"hello","resume":`+resume+`}`, "session_expired")
	}
	a.nc.Close()
	other := ta.raw(t)
	require.Eventually(t, func() bool {
		return other.ok(`{"op":"acquire","name":"gone"}`)["acquired"] == true
	}, 2*time.Second, 5*time.Millisecond, "the session ends after its ttl, with its leases")
	ta.raw(t).fail(fmt.Sprintf(`{"id":1,"op":"hello","resume":{"session":%q,"token":%q}}`, h["session"], h["resume_token"]), "session_expired")
}

// TestA3_Heartbeat: a client that stops talking loses its connection, and
// its locks, after heartbeat_ms; one without a heartbeat keeps them.
func TestA3_Heartbeat(t *testing.T) {
	ta := startAgent(t)
	quiet := ta.raw(t)
	quiet.ok(`{"id":1,"op":"hello","heartbeat_ms":500}`)
	quiet.ok(`{"id":2,"op":"acquire","name":"hb"}`)
	// Talking keeps it alive past the heartbeat.
	var lastPing time.Time // before the agent read the last ping
	for talk := time.Now(); time.Since(talk) < 700*time.Millisecond; {
		time.Sleep(50 * time.Millisecond)
		lastPing = time.Now()
		quiet.ok(`{"op":"ping"}`)
	}
	silent := ta.raw(t)
	silent.ok(`{"op":"acquire","name":"nohb"}`)

	quiet.requireClosed()
	assert.GreaterOrEqual(t, time.Since(lastPing), 500*time.Millisecond, "closed before the heartbeat ran out")
	other := ta.raw(t)
	// The connection is closed before its leases are released.
	require.Eventually(t, func() bool {
		return other.ok(`{"op":"acquire","name":"hb"}`)["acquired"] == true
	}, time.Second, time.Millisecond, "the silent client's lock is released")
	assert.Equal(t, false, other.ok(`{"op":"acquire","name":"nohb"}`)["acquired"], "without a heartbeat a silent client keeps its locks")
}

// TestA4_SlowReader: a client that never reads is cut off; others are not
// affected; its locks are released.
func TestA4_SlowReader(t *testing.T) {
	ta := startAgent(t, func(o *options) {
		o.Server.MaxQueueBytes = 64 << 10
		o.Server.WriteTimeout = 200 * time.Millisecond
	})
	slow := ta.raw(t)
	slow.ok(`{"op":"acquire","name":"slow"}`)
	good := ta.raw(t)
	g := good.ok(`{"op":"acquire","name":"good","ttl_ms":1000}`)
	granted := time.Now()

	pings := []byte(strings.Repeat(`{"id":"some-long-request-id-to-fill-buffers","op":"ping"}`+"\n", 1000))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 200; i++ {
			if _, err := slow.nc.Write(pings); err != nil {
				return
			}
		}
	}()
	for i := 0; i < 20; i++ {
		good.ok(`{"op":"ping"}`)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow reader was not cut off")
	}
	require.Eventually(t, func() bool {
		return good.ok(`{"op":"acquire","name":"slow"}`)["acquired"] == true
	}, 2*time.Second, 5*time.Millisecond)
	// Held all along and past its TTL: renewals went on.
	check := fmt.Sprintf(`{"op":"check","lease":%q}`, g["lease"])
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for ; time.Since(granted) < 1500*time.Millisecond; <-tick.C {
		require.Equal(t, true, good.ok(check)["held"], "%s after the grant", time.Since(granted))
	}
}

// TestSlowReaderCutOffIsLogged: a client cut off because a write to it
// stayed blocked for the timeout is logged as a slow consumer, like one
// cut off by the output bound.
func TestSlowReaderCutOffIsLogged(t *testing.T) {
	logs := new(logBuffer)
	ta := startAgent(t, withLogs(logs), func(o *options) {
		o.Server.MaxQueueBytes = 64 << 20 // the timeout comes first
		o.Server.WriteTimeout = 200 * time.Millisecond
	})
	slow := ta.raw(t)
	slow.ok(`{"op":"acquire","name":"slow"}`)
	pings := []byte(strings.Repeat(`{"id":"some-long-request-id-to-fill-buffers","op":"ping"}`+"\n", 1000))
	go func() {
		for {
			if _, err := slow.nc.Write(pings); err != nil {
				return
			}
		}
	}()
	good := ta.raw(t)
	require.Eventually(t, func() bool {
		return good.ok(`{"op":"acquire","name":"slow"}`)["acquired"] == true
	}, 10*time.Second, 5*time.Millisecond, "the slow reader was cut off, its lock released")
	assert.Equal(t, 1, logs.count("[WARN]", "slow consumer cut off", "blocked_for=200ms"), logs.String())
}

func TestLineTooLong(t *testing.T) {
	ta := startAgent(t, func(o *options) { o.Server.MaxLineBytes = 1024 })
	r := ta.raw(t)
	r.ok(`{"op":"acquire","name":"long"}`)
	pad := strings.Repeat(" ", 1024-len(`{"op":"ping"}`))
	r.ok(`{"op":"ping"}` + pad) // exactly the limit
	r.send(`{"op":"ping"}` + pad + " ")
	m := r.recv()
	requireCode(t, m, "line_too_long")
	r.requireClosed()
	assert.Equal(t, true, ta.raw(t).ok(`{"op":"acquire","name":"long"}`)["acquired"], "its locks went with it")
}

// TestF5_HugeLineWithoutNewline: a 10 MiB line is cut at the limit.
func TestF5_HugeLineWithoutNewline(t *testing.T) {
	ta := startAgent(t)
	r := ta.raw(t)
	go func() {
		chunk := make([]byte, 1<<20)
		for i := range chunk {
			chunk[i] = 'a'
		}
		for i := 0; i < 10; i++ {
			if _, err := r.nc.Write(chunk); err != nil {
				return
			}
		}
	}()
	requireCode(t, r.recv(), "line_too_long")
	r.requireClosed()
}

// TestF4_ConnectionsBeyondTheCap get an error line, not the backlog.
func TestF4_ConnectionsBeyondTheCap(t *testing.T) {
	ta := startAgent(t, func(o *options) {
		o.Server.MaxConns = 2
		o.Agent.Access.AdminUIDs = []uint32{} // no admin: no reserve beyond the cap
	})
	a, b := ta.raw(t), ta.raw(t)
	a.ok(`{"op":"ping"}`)
	b.ok(`{"op":"ping"}`)
	c := ta.raw(t)
	requireCode(t, c.recv(), "limit_exceeded")
	c.requireClosed()
	a.ok(`{"op":"ping"}`)
	b.nc.Close()
	require.Eventually(t, func() bool { return pings(ta.path) }, 2*time.Second, 5*time.Millisecond)
}

// pings tells whether a new connection gets an answer to ping.
func pings(path string) bool {
	nc, err := net.Dial("unix", path)
	if err != nil {
		return false
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(time.Second))
	if _, err := nc.Write([]byte(`{"op":"ping"}` + "\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(nc).ReadString('\n')
	return err == nil && strings.Contains(line, `"pong":true`)
}

// TestLargeAnswerIsNotASlowConsumer: the output bound is on what waits
// unwritten, not on the size of one answer.
func TestLargeAnswerIsNotASlowConsumer(t *testing.T) {
	ta := startAgent(t, func(o *options) { o.Server.MaxQueueBytes = 4096 })
	for i := 0; i < 40; i++ {
		ta.raw(t).ok(fmt.Sprintf(`{"op":"acquire","name":"big/%d","meta":%q}`, i, strings.Repeat("m", 200)))
	}
	r := ta.raw(t)
	r.send(`{"op":"list","all":true}`)
	line, err := r.r.ReadString('\n')
	require.NoError(t, err)
	assert.Greater(t, len(line), 4096)
	assert.Contains(t, line, `"ok":true`)
	r.ok(`{"op":"ping"}`)
}

// TestHelloOverTheSessionCap closes the connection, like an implicit session would.
func TestHelloOverTheSessionCap(t *testing.T) {
	ta := startAgent(t, func(o *options) {
		o.Agent.MaxSessions = 1
		o.Agent.Access.AdminUIDs = []uint32{} // no admin: no reserve beyond the cap
	})
	ta.raw(t).ok(`{"op":"hello"}`)
	r := ta.raw(t)
	r.fail(`{"op":"hello"}`, "limit_exceeded")
	r.requireClosed()
}

// results is an Observer that keeps the results of acquires.
type results struct {
	mu  sync.Mutex
	got []string
}

func (r *results) Acquired(mode backend.Mode, result string, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, fmt.Sprintf("%v %s", mode, result))
}
func (r *results) Renewed(int, time.Duration, int) {}
func (r *results) Lost(string)                     {}
func (r *results) BackendError(string)             {}

// TestRefusedAcquiresAreObserved: acquires refused before they reach the
// agent, whose request cannot be run or whose implicit session cannot be
// opened, are counted like the others.
func TestRefusedAcquiresAreObserved(t *testing.T) {
	rec := &results{}
	ta := startAgent(t, func(o *options) {
		o.Agent.Observer = rec
		o.Agent.MaxSessions = 2
		o.Agent.Access.AdminUIDs = []uint32{} // no admin: no reserve beyond the cap
	})
	ta.raw(t).ok(`{"op":"acquire","name":"a"}`)
	r := ta.raw(t)
	r.fail(`{"op":"acquire","name":"a","ttl_ms":0}`, "invalid_argument")
	r.fail(`{"op":"acquire","mode":"shared"}`, "invalid_name")
	r.send(`{"id":"w","op":"acquire","name":"a","wait_ms":-1}`) // waits
	r.fail(`{"id":"w","op":"acquire","name":"b","wait_ms":-1,"mode":"shared"}`, "invalid_argument")
	ta.raw(t).fail(`{"op":"acquire","name":"a","mode":"shared"}`, "limit_exceeded")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Equal(t, []string{"exclusive granted", "exclusive error", "shared error", "shared error", "shared limit_exceeded"}, rec.got)
}
