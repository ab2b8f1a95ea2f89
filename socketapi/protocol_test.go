package socketapi_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/client"
)

func TestHello(t *testing.T) {
	ta := startAgent(t)
	r := ta.raw(t)
	m := r.ok(`{"id":1,"op":"hello","version":1,"client":"billing-worker"}`)
	assert.EqualValues(t, 1, m["id"])
	assert.Regexp(t, `^s_`, m["session"])
	assert.NotEmpty(t, m["resume_token"])
	assert.Equal(t, false, m["resumed"])
	info := m["agent"].(map[string]any)
	assert.Equal(t, "memory", info["backend"])
	assert.Equal(t, "test", info["version"])
	assert.EqualValues(t, 65536, info["max_line_bytes"])
	assert.Equal(t, map[string]any{"default": 15000.0, "min": 1000.0, "max": 86400000.0}, info["ttl_ms"])

	r.fail(`{"id":2,"op":"hello"}`, "bad_request") // only as the first request
}

func TestHelloArguments(t *testing.T) {
	ta := startAgent(t)
	for _, line := range []string{
		`{"id":1,"op":"hello","version":2}`,
		`{"id":1,"op":"hello","session_ttl_ms":-1}`,
		`{"id":1,"op":"hello","session_ttl_ms":3600001}`,
		`{"id":1,"op":"hello","heartbeat_ms":99}`,
		`{"id":1,"op":"hello","heartbeat_ms":3600001}`,
		`{"id":1,"op":"hello","client":7}`,
		`{"id":1,"op":"hello","client":"` + strings.Repeat("x", 257) + `"}`,
	} {
		ta.raw(t).fail(line, "invalid_argument")
	}
	// A refused hello opens no session: hello may come again.
	r := ta.raw(t)
	r.fail(`{"id":1,"op":"hello","version":2}`, "invalid_argument")
	r.ok(`{"id":2,"op":"hello","version":1,"heartbeat_ms":100,"session_ttl_ms":3600000}`)
}

func TestImplicitSession(t *testing.T) {
	ta := startAgent(t)
	r := ta.raw(t)
	r.fail(`not json`, "bad_request") // does not count as the first request
	// Nor do lines refused for a lone surrogate or a field's type.
	r.fail(`{"id":1,"op":"acquire","name":"sur\ud800x"}`, "bad_request")
	r.fail(`{"id":2,"op":"cancel","target":true}`, "invalid_argument")
	r.ok(`{"id":"a","op":"hello"}`)

	r = ta.raw(t)
	m := r.ok(`{"id":"p","op":"ping"}`)
	assert.Equal(t, "p", m["id"])
	assert.Equal(t, true, m["pong"])
	r.fail(`{"id":1,"op":"hello"}`, "bad_request")
}

func TestIDs(t *testing.T) {
	ta := startAgent(t)
	r := ta.raw(t)
	assert.Nil(t, r.ok(`{"op":"ping"}`)["id"])
	assert.Equal(t, "x\u00e9", r.ok(`{"id":"x\u00e9","op":"ping"}`)["id"])
	r.send(`{"id":123456789012345678901234567890,"op":"ping"}`)
	line, err := r.r.ReadString('\n')
	require.NoError(t, err)
	assert.Contains(t, line, `"id":123456789012345678901234567890,`, "big integer ids are echoed verbatim")
	for _, bad := range []string{`1.5`, `true`, `{}`, `[1]`} {
		m := r.fail(`{"id":`+bad+`,"op":"ping"}`, "bad_request")
		assert.Nil(t, m["id"])
	}
	// A string id comes back byte for byte, in answers and errors alike:
	// escapes as sent, HTML characters and a raw U+2028 unescaped.
	const id = `"<a&b>\u00e9` + "\u2028" + `"`
	for _, req := range []string{`{"id":` + id + `,"op":"ping"}`, `{"id":` + id + `,"op":"nope"}`} {
		r.send(req)
		line, err := r.r.ReadString('\n')
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(line, `{"id":`+id+`,`), "%s: %s", req, line)
	}
}

func TestAcquireExclusive(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	m := a.ok(`{"id":1,"op":"acquire","name":"orders/42","meta":"worker 1"}`)
	assert.Equal(t, true, m["acquired"])
	assert.Regexp(t, `^l_`, m["lease"])
	assert.Equal(t, "orders/42", m["name"])
	assert.Equal(t, "exclusive", m["mode"])
	assert.Equal(t, "connection", m["scope"])
	assert.EqualValues(t, 15000, m["ttl_ms"])
	token := m["token"].(float64)
	assert.Greater(t, token, 0.0)
	assert.Less(t, token, float64(1<<53))

	d := b.ok(`{"id":1,"op":"acquire","name":"orders/42"}`)
	assert.Equal(t, false, d["acquired"])
	assert.Equal(t, "held", d["reason"])
	holders := d["holders"].([]any)
	require.Len(t, holders, 1)
	h := holders[0].(map[string]any)
	assert.Equal(t, "exclusive", h["mode"])
	assert.Equal(t, token, h["token"])
	assert.Equal(t, "worker 1", h["meta"])
	assert.Equal(t, "testhost", h["host"])
	assert.Greater(t, h["expires_in_ms"], 0.0)

	// A shared request is denied by an exclusive holder too.
	assert.Equal(t, false, b.ok(`{"id":2,"op":"acquire","name":"orders/42","mode":"shared"}`)["acquired"])

	// already_held carries the existing lease.
	e := a.fail(`{"id":3,"op":"acquire","name":"orders/42","mode":"shared"}`, "already_held")
	l := e["error"].(map[string]any)["lease"].(map[string]any)
	assert.Equal(t, m["lease"], l["lease"])
	assert.Equal(t, token, l["token"])

	a.ok(fmt.Sprintf(`{"id":4,"op":"release","lease":%q}`, m["lease"]))
	m2 := b.ok(`{"id":3,"op":"acquire","name":"orders/42"}`)
	assert.Equal(t, true, m2["acquired"])
	assert.Greater(t, m2["token"].(float64), token, "tokens increase")
}

func TestAcquireShared(t *testing.T) {
	ta := startAgent(t)
	c1, c2, c3 := ta.raw(t), ta.raw(t), ta.raw(t)
	s1 := c1.ok(`{"id":1,"op":"acquire","name":"cfg","mode":"shared"}`)
	s2 := c2.ok(`{"id":1,"op":"acquire","name":"cfg","mode":"shared"}`)
	assert.Equal(t, true, s1["acquired"])
	assert.Equal(t, true, s2["acquired"])
	assert.Greater(t, s2["token"], s1["token"], "every grant gets a new token")
	assert.Equal(t, false, c3.ok(`{"id":1,"op":"acquire","name":"cfg"}`)["acquired"])

	i := c3.ok(`{"id":2,"op":"inspect","name":"cfg"}`)
	assert.Equal(t, true, i["locked"])
	assert.Equal(t, "shared", i["mode"])
	assert.Len(t, i["holders"], 2)
	assert.Equal(t, s2["token"], i["last_token"])
}

func TestAcquireSemaphore(t *testing.T) {
	ta := startAgent(t)
	var conns []*raw
	for i := 0; i < 3; i++ {
		c := ta.raw(t)
		conns = append(conns, c)
		m := c.ok(`{"id":1,"op":"acquire","name":"pool","mode":"shared","limit":3}`)
		require.Equal(t, true, m["acquired"], "holder %d", i)
	}
	extra := ta.raw(t)
	d := extra.ok(`{"id":1,"op":"acquire","name":"pool","mode":"shared","limit":3}`)
	assert.Equal(t, false, d["acquired"])
	assert.Len(t, d["holders"], 3)
	// A larger limit in the request is checked against the same holders.
	assert.Equal(t, true, extra.ok(`{"id":2,"op":"acquire","name":"pool","mode":"shared","limit":4}`)["acquired"])
	conns[0].nc.Close()
	c := ta.raw(t)
	require.Eventually(t, func() bool {
		return c.ok(`{"id":1,"op":"acquire","name":"pool","mode":"shared","limit":4}`)["acquired"] == true
	}, 2*time.Second, 5*time.Millisecond)
}

func TestAcquireInvalid(t *testing.T) {
	ta := startAgent(t)
	r := ta.raw(t)
	for _, tc := range []struct{ line, code string }{
		{`{"op":"acquire"}`, "invalid_name"},
		{`{"op":"acquire","name":""}`, "invalid_name"},
		{`{"op":"acquire","name":"a b"}`, "invalid_name"},
		{`{"op":"acquire","name":"a\tb"}`, "invalid_name"},
		{`{"op":"acquire","name":"a\u00a0b"}`, "invalid_name"},
		{`{"op":"acquire","name":"a\u200bb"}`, "invalid_name"},
		{`{"op":"acquire","name":"a\u2028b"}`, "invalid_name"},
		{`{"op":"acquire","name":"` + strings.Repeat("n", 257) + `"}`, "invalid_name"},
		{`{"op":"acquire","name":"a","limit":2}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","mode":"shared","limit":0}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","mode":"shared","limit":-1}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","mode":"read"}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","scope":"forever"}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","ttl_ms":999}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","ttl_ms":0}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","ttl_ms":86400001}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","ttl_ms":1e3}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","ttl_ms":99999999999999999999}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","wait_ms":-2}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","wait_ms":"5"}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","wait_ms":9223372036854775807}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","meta":"` + strings.Repeat("m", 257) + `"}`, "invalid_argument"},
		{`{"op":"acquire","name":7}`, "invalid_argument"},
		{`{"op":"acquire","name":"a","mode":null,"limit":true}`, "invalid_argument"},
	} {
		m := r.call(tc.line)
		requireCode(t, m, tc.code)
	}
	// The longest name is fine, and nothing was leaked by the refusals.
	assert.Equal(t, true, r.ok(`{"op":"acquire","name":"` + strings.Repeat("n", 256) + `"}`)["acquired"])
	assert.Equal(t, true, r.ok(`{"op":"acquire","name":"a"}`)["acquired"])
	assert.Equal(t, true, r.ok(`{"op":"acquire","name":"订单/42"}`)["acquired"])
}

// TestArgumentMessages: an argument the agent refuses is named as the wire
// names it, with its bounds in the wire's units.
func TestArgumentMessages(t *testing.T) {
	r := startAgent(t).raw(t)
	for line, want := range map[string]string{
		`{"op":"acquire","name":"a","ttl_ms":0}`:                                "ttl_ms must be between 1000 and 86400000",
		`{"op":"acquire","name":"a","ttl_ms":999}`:                              "ttl_ms must be between 1000 and 86400000",
		`{"op":"acquire","name":"a","wait_ms":-2}`:                              "wait_ms must be -1, 0 or positive",
		`{"op":"acquire","name":"a","mode":"shared","limit":0}`:                 "limit must be a positive integer up to 2147483648, with mode shared",
		`{"op":"acquire","name":"a","limit":3}`:                                 "limit must be a positive integer up to 2147483648, with mode shared",
		`{"op":"campaign","name":"a","ttl_ms":-5}`:                              "ttl_ms must be between 1000 and 86400000",
		`{"op":"acquire","name":"a","meta":"` + strings.Repeat("m", 257) + `"}`: "meta must be UTF-8 of at most 256 bytes",
	} {
		m := r.fail(line, "invalid_argument")
		assert.Equal(t, want, m["error"].(map[string]any)["message"], line)
	}
}

func TestTypeErrorNamesTheField(t *testing.T) {
	ta := startAgent(t)
	m := ta.raw(t).fail(`{"id":9,"op":"acquire","name":"a","ttl_ms":"x"}`, "invalid_argument")
	assert.EqualValues(t, 9, m["id"])
	assert.Contains(t, m["error"].(map[string]any)["message"], "ttl_ms")
}

func TestReleaseAndNotHeld(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	m := a.ok(`{"id":1,"op":"acquire","name":"x"}`)
	// A6: another session's lease, a malformed one, a missing one.
	b.fail(fmt.Sprintf(`{"id":1,"op":"release","lease":%q}`, m["lease"]), "not_held")
	b.fail(fmt.Sprintf(`{"id":1,"op":"check","lease":%q}`, m["lease"]), "not_held")
	b.fail(`{"id":2,"op":"release","lease":"garbage"}`, "not_held")
	b.fail(`{"id":3,"op":"release"}`, "not_held")
	b.fail(`{"id":3,"op":"release","lease":17}`, "invalid_argument")
	// The holder's lease is untouched.
	c := a.ok(fmt.Sprintf(`{"id":2,"op":"check","lease":%q}`, m["lease"]))
	assert.Equal(t, true, c["held"])
	assert.Equal(t, m["token"], c["token"])
	assert.Greater(t, c["expires_in_ms"], 0.0)

	assert.Equal(t, true, a.ok(fmt.Sprintf(`{"id":3,"op":"release","lease":%q}`, m["lease"]))["released"])
	a.fail(fmt.Sprintf(`{"id":4,"op":"release","lease":%q}`, m["lease"]), "not_held") // twice
	a.fail(fmt.Sprintf(`{"id":5,"op":"check","lease":%q}`, m["lease"]), "not_held")
}

func TestInspect(t *testing.T) {
	ta := startAgent(t)
	r := ta.raw(t)
	i := r.ok(`{"id":1,"op":"inspect","name":"never"}`)
	assert.Equal(t, false, i["locked"])
	assert.Nil(t, i["mode"])
	assert.Equal(t, []any{}, i["holders"])
	assert.EqualValues(t, 0, i["last_token"])
	r.fail(`{"id":2,"op":"inspect","name":""}`, "invalid_name")
	r.fail(`{"id":2,"op":"inspect"}`, "invalid_name")

	m := r.ok(`{"id":3,"op":"acquire","name":"k"}`)
	r.ok(fmt.Sprintf(`{"id":4,"op":"release","lease":%q}`, m["lease"]))
	i = r.ok(`{"id":5,"op":"inspect","name":"k"}`)
	assert.Equal(t, false, i["locked"])
	assert.Equal(t, m["token"], i["last_token"], "the last grant is known")
}

func TestPingAndUnknownOp(t *testing.T) {
	ta := startAgent(t)
	r := ta.raw(t)
	r.fail(`{"id":1,"op":"frobnicate"}`, "unknown_op")
	r.fail(`{"id":1}`, "bad_request")
	r.fail(`{"id":1,"op":""}`, "bad_request")
	assert.Equal(t, true, r.ok(`{"id":2,"op":"ping","future_field":{"x":[1,2]}}`)["pong"], "unknown fields are ignored")
}

func TestBye(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	a.ok(`{"id":1,"op":"hello","session_ttl_ms":60000}`)
	a.ok(`{"id":2,"op":"acquire","name":"s","scope":"session"}`)
	a.ok(`{"id":3,"op":"acquire","name":"c"}`)
	a.ok(`{"id":4,"op":"bye"}`)
	a.requireClosed()
	// Every lease, session-scoped too, was released before the answer.
	assert.Equal(t, true, b.ok(`{"id":1,"op":"acquire","name":"s"}`)["acquired"])
	assert.Equal(t, true, b.ok(`{"id":2,"op":"acquire","name":"c"}`)["acquired"])
}

func TestBlankLinesAndCRLF(t *testing.T) {
	ta := startAgent(t)
	r := ta.raw(t)
	_, err := r.nc.Write([]byte("\n\r\n \t\n\n{\"id\":1,\"op\":\"ping\"}\r\n"))
	require.NoError(t, err)
	m := r.recv()
	assert.EqualValues(t, 1, m["id"])
	assert.Equal(t, true, m["pong"])
}

func TestList(t *testing.T) {
	ta := startAgent(t)
	a := ta.raw(t)
	a.ok(`{"id":1,"op":"hello","client":"lister"}`)
	a.ok(`{"id":2,"op":"acquire","name":"l1","meta":"m"}`)
	b := ta.raw(t)
	b.ok(`{"id":1,"op":"ping"}`)
	b.send(`{"id":2,"op":"acquire","name":"l1","wait_ms":-1,"mode":"shared"}`)

	require.Eventually(t, func() bool {
		m := a.ok(`{"id":3,"op":"list"}`)
		for _, s := range m["sessions"].([]any) {
			if w := s.(map[string]any)["waiting"].([]any); len(w) == 1 {
				return w[0].(map[string]any)["name"] == "l1"
			}
		}
		return false
	}, 2*time.Second, 5*time.Millisecond)

	m := a.ok(`{"id":4,"op":"list"}`)
	var mine map[string]any
	for _, s := range m["sessions"].([]any) {
		if s.(map[string]any)["client"] == "lister" {
			mine = s.(map[string]any)
		}
	}
	require.NotNil(t, mine)
	assert.EqualValues(t, os.Getpid(), mine["pid"])
	assert.EqualValues(t, os.Getuid(), mine["uid"])
	assert.Equal(t, true, mine["attached"])
	ls := mine["leases"].([]any)
	require.Len(t, ls, 1)
	l := ls[0].(map[string]any)
	assert.Equal(t, "l1", l["name"])
	assert.Equal(t, "m", l["meta"])
	assert.Greater(t, l["expires_in_ms"], 0.0)
	assert.Contains(t, l, "held_for_ms")
	assert.Len(t, a.ok(`{"id":5,"op":"list","all":true}`)["sessions"], 2)
}

func TestAdminOnly(t *testing.T) {
	ta := startAgent(t, func(o *options) { o.Agent.Access.AdminUIDs = []uint32{uint32(os.Getuid()) + 1} })
	r := ta.raw(t)
	r.fail(`{"id":1,"op":"list","all":true}`, "permission_denied")
	r.fail(`{"id":2,"op":"break","name":"x"}`, "permission_denied")
	assert.Len(t, r.ok(`{"id":3,"op":"list"}`)["sessions"], 1, "own sessions need no rights")
}

func TestBreak(t *testing.T) {
	ta := startAgent(t)
	holder := ta.client(t, map[string]any{"client": "h"})
	l1 := acquire(t, holder, map[string]any{"name": "b", "mode": "shared"})
	other := ta.client(t, map[string]any{"client": "o"})
	l2 := acquire(t, other, map[string]any{"name": "b", "mode": "shared"})

	admin := ta.raw(t)
	m := admin.ok(`{"id":1,"op":"break","name":"b"}`)
	assert.EqualValues(t, 2, m["broken"])
	for _, tc := range []struct {
		c *clientLease
	}{{&clientLease{holder, l1}}, {&clientLease{other, l2}}} {
		ev := nextEvent(t, tc.c.c)
		assert.Equal(t, "lost", ev.Event)
		assert.Equal(t, "broken", ev.Reason)
		assert.Equal(t, tc.c.l.Lease, ev.Lease)
		assert.Equal(t, "b", ev.Name)
		assert.Equal(t, tc.c.l.Token, ev.Token)
		err := tc.c.c.Call(context.Background(), "release", map[string]any{"lease": tc.c.l.Lease}, nil)
		assert.Equal(t, "not_held", code(err), "after lost the lease id is dead")
	}
	assert.EqualValues(t, 0, admin.ok(`{"id":2,"op":"break","name":"b"}`)["broken"])
	admin.fail(`{"id":3,"op":"break","name":" "}`, "invalid_name")
}

type clientLease struct {
	c *client.Client
	l lease
}

func TestLimits(t *testing.T) {
	ta := startAgent(t, func(o *options) {
		o.Agent.MaxSessions = 2
		o.Agent.MaxLeasesPerSession = 2
		o.Agent.MaxWaiters = 1
		o.Agent.Access.AdminUIDs = []uint32{} // no admin: no reserve beyond the cap
	})
	a := ta.raw(t)
	a.ok(`{"id":1,"op":"acquire","name":"x1"}`)
	a.ok(`{"id":2,"op":"acquire","name":"x2"}`)
	a.fail(`{"id":3,"op":"acquire","name":"x3"}`, "limit_exceeded")

	b := ta.raw(t)
	b.send(`{"id":1,"op":"acquire","name":"x1","wait_ms":-1}`)
	require.Eventually(t, func() bool {
		s := a.ok(`{"id":4,"op":"list"}`)["sessions"].([]any) // the sessions of its uid
		return len(s) == 2 && len(s[1].(map[string]any)["waiting"].([]any))+len(s[0].(map[string]any)["waiting"].([]any)) == 1
	}, 2*time.Second, 5*time.Millisecond)
	b.fail(`{"id":2,"op":"acquire","name":"x2","wait_ms":1000}`, "limit_exceeded")

	c := ta.raw(t)
	c.fail(`{"id":1,"op":"ping"}`, "limit_exceeded")
	c.requireClosed()
}

func TestShuttingDownAfterStop(t *testing.T) {
	ta := startAgent(t)
	c := ta.client(t, map[string]any{})
	acquire(t, c, map[string]any{"name": "z"})
	ta.stop()
	ev := nextEvent(t, c)
	assert.Equal(t, "shutdown", ev.Event)
	assert.NotEmpty(t, ev.Message)
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("connection not closed after shutdown")
	}
	info, err := ta.backend.Inspect(context.Background(), "z")
	require.NoError(t, err)
	assert.Empty(t, info.Holders, "every lease is released at shutdown")
	_, err = os.Stat(ta.path)
	assert.True(t, os.IsNotExist(err), "socket removed")
	_, err = ta.agent.Open(agent.Peer{}, agent.SessionOptions{}, nil)
	assert.ErrorIs(t, err, agent.ErrShuttingDown)
}
