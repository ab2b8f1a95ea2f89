package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/testkit/faultproxy"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// wireScene is what an example of docs/protocol.md takes place in: the
// agent's state before its first line, set up on its connection or on
// others, and what makes the agent send lines that answer no request
// shown (an event, an answer to a line described in prose).
type wireScene struct {
	// redis runs the agent on a real redis-server, reached through a
	// fault proxy.
	redis bool
	setup func(s *wireStage)
	// before is called before the agent's i-th line of the example is
	// read.
	before func(s *wireStage, i int)
	// after is called once the example is replayed.
	after func(s *wireStage)
}

// wireStage is an example's agent, its connection and its replay.
type wireStage struct {
	t     *testing.T
	e     *agentEnv
	agent *proc
	proxy *faultproxy.Proxy
	redis *redistest.Server
	r     *replay
}

// other connects another application, with a session of its own.
func (s *wireStage) other(name string) *wireConn {
	w := dialWire(s.t, s.e.socket)
	w.call(map[string]any{"id": 1, "op": "hello", "client": name})
	return w
}

// hold has another application hold name (in mode, with meta).
func (s *wireStage) hold(name string, args map[string]any) *wireConn {
	w := s.other("holder")
	req := map[string]any{"id": 2, "op": "acquire", "name": name}
	for k, v := range args {
		req[k] = v
	}
	require.Equal(s.t, true, w.call(req)["acquired"], "%s is held", name)
	return w
}

// breakName ends every lease on name, from an admin's connection.
func (s *wireStage) breakName(name string) {
	s.other("admin").call(map[string]any{"id": 2, "op": "break", "name": name})
}

// wireScenes are the scenes of the examples that need one, by their first
// line. An example without one runs on a fresh agent, its first line
// first.
var wireScenes = map[string]wireScene{
	// A line longer than the limit, described in prose.
	`{"id":null,"ok":false,"error":{"code":"line_too_long","message":"a line is at most 65536 bytes"}}`: {
		before: func(s *wireStage, i int) { s.r.w.send(strings.Repeat("x", 65537)) },
	},
	// A detached session, with a session-scoped lease broken meanwhile.
	`{"id":1,"op":"hello","session_ttl_ms":30000,"resume":{"session":"s_lnl3…","token":"odla…"}}`: {
		setup: func(s *wireStage) {
			w := dialWire(s.t, s.e.socket)
			h := w.call(map[string]any{"id": 1, "op": "hello", "session_ttl_ms": 30000})
			s.r.bind("s_lnl3…", h["session"])
			s.r.bind("odla…", h["resume_token"])
			l := w.call(map[string]any{"id": 2, "op": "acquire", "name": "s/1", "scope": "session"})
			s.r.bind("l_mdjx…", l["lease"])
			w.close()
			admin := s.other("admin")
			eventually(s.t, callTimeout, "the session is detached", func() bool {
				list := admin.call(map[string]any{"id": 3, "op": "list", "all": true})
				for _, ss := range list["sessions"].([]any) {
					if m := ss.(map[string]any); m["session"] == h["session"] {
						return m["attached"] == false
					}
				}
				return false
			})
			admin.call(map[string]any{"id": 4, "op": "break", "name": "s/1"})
		},
	},
	// orders/42 held by another application.
	`{"id":3,"op":"acquire","name":"orders/42"}`: {
		setup: func(s *wireStage) { s.hold("orders/42", map[string]any{"meta": "invoice run"}) },
	},
	// s/1 held by this session.
	`{"id":11,"op":"acquire","name":"s/1"}`: {
		setup: func(s *wireStage) {
			l := s.r.w.call(map[string]any{"id": 10, "op": "acquire", "name": "s/1", "scope": "session", "ttl_ms": 2000})
			s.r.bind("l_mdjx…", l["lease"])
		},
	},
	// Two waiting acquires of one name, q/1, which another application
	// holds.
	`{"id":"w3","ok":false,"error":{"code":"invalid_argument","message":"agent: invalid argument: an acquire of \"q/1\" is already in progress in this session"}}`: {
		setup: func(s *wireStage) { s.hold("q/1", nil) },
		before: func(s *wireStage, i int) {
			s.r.w.send(`{"id":"w2","op":"acquire","name":"q/1","wait_ms":-1}`)
			s.r.w.send(`{"id":"w3","op":"acquire","name":"q/1","wait_ms":-1}`)
		},
	},
	// A lease of this session.
	`{"id":3,"op":"release","lease":"l_tmr4…"}`: {setup: acquired("q/1", "l_tmr4…")},
	`{"id":2,"op":"check","lease":"l_tmr4…"}`:   {setup: acquired("q/1", "l_tmr4…")},
	// A lease of this session that Redis no longer has, checked.
	`{"event":"lost","lease":"l_tmr4…","name":"q/1","token":4294967301,"reason":"expired"}`: {
		redis: true,
		setup: acquired("q/1", "l_tmr4…"),
		before: func(s *wireStage, i int) {
			if i == 0 {
				ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
				defer cancel()
				require.NoError(s.t, s.redis.Client(s.t).FlushAll(ctx).Err())
				s.r.w.send(`{"id":2,"op":"check","lease":"` + s.r.binds["l_tmr4…"] + `"}`)
			}
		},
	},
	// sem/1 held shared by two applications.
	`{"id":11,"op":"inspect","name":"sem/1"}`: {
		setup: func(s *wireStage) {
			s.hold("sem/1", map[string]any{"mode": "shared"})
			s.hold("sem/1", map[string]any{"mode": "shared"})
		},
	},
	// Another session, whose id sorts first, holding orders/42.
	`{"id":5,"op":"list"}`: {
		setup: func(s *wireStage) {
			sessions := func() []any { return s.r.w.call(map[string]any{"id": 0, "op": "list"})["sessions"].([]any) }
			mine := sessions()[0].(map[string]any)["session"].(string)
			for tries := 0; ; tries++ {
				require.Less(s.t, tries, 30, "a session id that sorts before %s", mine)
				w := dialWire(s.t, s.e.socket)
				h := w.call(map[string]any{"id": 1, "op": "hello", "client": "billing-worker"})
				if h["session"].(string) < mine {
					w.call(map[string]any{"id": 2, "op": "acquire", "name": "orders/42", "meta": "invoice run"})
					break
				}
				w.close()
			}
			eventually(s.t, callTimeout, "the sessions of the connections closed end", func() bool { return len(sessions()) == 2 })
		},
	},
	`{"id":42,"op":"break","name":"orders/42"}`: {
		setup: func(s *wireStage) { s.hold("orders/42", nil) },
	},
	`{"id":"x","op":"acquire","name":"q/1","wait_ms":-1}`: {
		setup: func(s *wireStage) { s.hold("q/1", nil) },
	},
	// The agent hands itself over to a new process, which the test stops.
	`{"id":7,"op":"upgrade"}`: {
		setup: func(s *wireStage) {
			stopUpgradedAtCleanup(s.t, s.e.socket, s.agent.cmd.Process.Pid)
		},
	},
	// A campaign of this session, elected.
	`{"id":9,"op":"resign","campaign":"c_4ijm…"}`: {
		setup: func(s *wireStage) {
			c := s.r.w.call(map[string]any{"id": 1, "op": "campaign", "name": "svc/scheduler"})
			s.r.bind("c_4ijm…", c["campaign"])
			s.r.w.recvEvent("elected")
		},
	},
	// A lease of this session, broken.
	`{"event":"lost","lease":"l_274h…","name":"orders/42","token":4294967309,"reason":"broken"}`: {
		setup:  acquired("orders/42", "l_274h…"),
		before: func(s *wireStage, i int) { s.breakName("orders/42") },
	},
	// A campaign's term, lost while the agent was stopped past its TTL.
	`{"event":"lost","campaign":"c_4ijm…","lease":"l_q2ov…","name":"svc/scheduler","token":1796020650247064,"reason":"expired"}`: {
		setup: func(s *wireStage) {
			c := s.r.w.call(map[string]any{"id": 1, "op": "campaign", "name": "svc/scheduler", "ttl_ms": 1000})
			s.r.bind("c_4ijm…", c["campaign"])
			s.r.bind("l_q2ov…", s.r.w.recvEvent("elected")["lease"])
		},
		before: func(s *wireStage, i int) {
			s.agent.signal(s.t, syscall.SIGSTOP)
			time.Sleep(1500 * time.Millisecond) // the fault: past the TTL
			s.agent.signal(s.t, syscall.SIGCONT)
		},
	},
	// Redis refuses the agent's connections while it holds a lease, then
	// takes them again.
	`{"event":"backend","state":"degraded","message":"renewals are failing; leases stay valid until their local deadline"}`: {
		redis: true,
		setup: func(s *wireStage) {
			s.r.w.call(map[string]any{"id": 1, "op": "acquire", "name": "q/1", "ttl_ms": 3000})
		},
		before: func(s *wireStage, i int) {
			if i == 0 {
				s.proxy.Refuse()
			} else {
				s.proxy.Pass()
			}
		},
	},
	// The agent stops.
	`{"event":"shutdown","message":"the agent is stopping; every lease is being released"}`: {
		setup:  func(s *wireStage) { s.r.w.call(map[string]any{"id": 1, "op": "ping"}) },
		before: func(s *wireStage, i int) { s.agent.signal(s.t, syscall.SIGTERM) },
	},
}

// acquired is a scene: name held by the example's session, its lease
// bound to short.
func acquired(name, short string) func(s *wireStage) {
	return func(s *wireStage) {
		l := s.r.w.call(map[string]any{"id": 100, "op": "acquire", "name": name})
		s.r.bind(short, l["lease"])
	}
}

// TestDocProtocol: every example of docs/protocol.md made of → and ←
// lines is replayed against a real agent process, in the scene it takes
// place in (wireScenes), and the agent's lines compared with the
// example's: field names, JSON types, error codes, events, reasons, modes
// and booleans. The table of ops names every field each op answered with,
// and the result fields that name a backend name every backend.
func TestDocProtocol(t *testing.T) {
	t.Parallel()
	examples, arrows := wireExamples(t, "docs/protocol.md")
	require.GreaterOrEqual(t, len(examples), 25, "the examples found")
	// No → or ← line is left out: each is in a block of such lines only.
	replayed := 0
	for _, ex := range examples {
		replayed += len(ex.lines)
	}
	require.Equal(t, arrows, replayed, "the → and ← lines of docs/protocol.md in blocks of other lines too")
	results := map[string]map[string]bool{}
	used := map[string]bool{}
	for _, ex := range examples {
		first := ex.lines[0].text
		scene, ok := wireScenes[first]
		used[first] = ok
		t.Run(fmt.Sprintf("line %d", ex.line), func(t *testing.T) {
			s := &wireStage{t: t, e: newAgentEnv(t)}
			if scene.redis {
				s.redis = redistest.Start(t, redistest.Options{})
				s.proxy = faultproxy.New(t, s.redis.Addr())
				s.e.writeConfig(t, fmt.Sprintf("backend \"redis\" {\n  addresses = [%q]\n}\n", s.proxy.Addr()))
			}
			s.agent = s.e.start(t)
			s.r = newReplay(t, dialWire(t, s.e.socket), results)
			if scene.setup != nil {
				scene.setup(s)
			}
			if scene.before != nil {
				s.r.before = func(i int) { scene.before(s, i) }
			}
			s.r.run(ex.lines)
			if scene.after != nil {
				scene.after(s)
			}
		})
	}
	for first := range wireScenes {
		require.Contains(t, used, first, "a scene for an example docs/protocol.md no longer has")
	}
	if t.Failed() {
		return
	}

	// The table of ops names what each op answers.
	table := opsTable(t)
	for op, fields := range results {
		for f := range fields {
			if f != "id" && f != "ok" {
				require.Contains(t, table[op], f, "the table of ops: a result field of %s", op)
			}
		}
	}
	// A result field that names the backend names every backend.
	src := readDoc(t, "docs/protocol.md")
	rows := regexp.MustCompile("(?m)^\\| `(agent\\.backend|backend)` \\| ([^|]*) \\|$").FindAllStringSubmatch(src, -1)
	require.Len(t, rows, 2, "the rows of hello's agent.backend and status's backend")
	for _, m := range rows {
		for _, kind := range []string{"memory", "redis", "etcd"} {
			require.Contains(t, m[2], "`"+kind+"`", "the result field %s names the backend %s", m[1], kind)
		}
	}
}
