package socketapi_test

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
)

// logBuffer collects an agent's log lines for a test to read.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// count counts the lines that contain every one of subs.
func (l *logBuffer) count(subs ...string) int {
	n := 0
	for _, line := range strings.Split(l.String(), "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

// withLogs sends the agent's and the server's logs to a buffer.
func withLogs(logs *logBuffer) func(*options) {
	return func(o *options) {
		l := hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})
		o.Agent.Logger = l.Named("agent")
		o.Server.Logger = l.Named("socket")
	}
}

// everybody opens the socket to every uid, so that the ACL alone decides.
func everybody(o *options) { o.SocketMode = 0o666 }

func TestACLTable(t *testing.T) {
	team := testGroup(t)
	rules := []agent.Rule{
		{Pattern: "orders/*", UIDs: []uint32{4001}},
		{Pattern: "reports/??", GIDs: []uint32{4100}, Modes: []backend.Mode{backend.Shared}},
		{Pattern: "shared/*", Modes: []backend.Mode{backend.Shared}},
		{Pattern: "team/*", GIDs: []uint32{team}},
		{Pattern: "public/*"},
	}
	ta := startAgent(t, everybody, func(o *options) { o.Agent.Access.Rules = rules })

	peers := map[string]cred{
		"uid 4001":                  {uid: 4001, gid: 4001},
		"gid 4100":                  {uid: 4002, gid: 4100},
		"daemon, a member of team":  {uid: 1, gid: 1},
		"uid 4004 with no rule":     {uid: 4004, gid: 4004},
		"gid 4100 as a supplement":  {uid: 4005, gid: 4005, groups: []uint32{4100}},
		"root, not listed anywhere": {uid: 0, gid: 0},
	}
	relays := map[string]*peerProc{}
	for name, c := range peers {
		relays[name] = startPeer(t, c, "relay", ta.path)
	}
	for _, tc := range []struct {
		peer, op, name, mode string
		allowed              bool
	}{
		{"uid 4001", "acquire", "orders/1", "exclusive", true},
		{"uid 4001", "acquire", "orders/a/b", "shared", true}, // * crosses /
		{"uid 4001", "inspect", "orders/9", "", true},
		{"uid 4001", "acquire", "reports/42", "shared", false},
		{"uid 4001", "acquire", "public/1", "exclusive", true},
		{"uid 4001", "acquire", "order/1", "exclusive", false}, // no rule matches
		{"gid 4100", "acquire", "reports/42", "shared", true},
		{"gid 4100", "acquire", "reports/43", "exclusive", false}, // mode not allowed
		{"gid 4100", "acquire", "reports/123", "shared", false},   // ? is one character
		{"gid 4100", "inspect", "reports/42", "", true},           // any allowed mode will do
		{"gid 4100", "acquire", "orders/2", "exclusive", false},
		{"uid 4004 with no rule", "acquire", "shared/x", "shared", true},
		{"uid 4004 with no rule", "acquire", "shared/y", "exclusive", false},
		{"uid 4004 with no rule", "acquire", "orders/3", "exclusive", false},
		{"uid 4004 with no rule", "inspect", "orders/3", "", false},
		{"uid 4004 with no rule", "acquire", "team/1", "exclusive", false},
		{"uid 4004 with no rule", "acquire", "public/2", "exclusive", true},
		{"daemon, a member of team", "acquire", "team/1", "exclusive", true},
		{"daemon, a member of team", "acquire", "orders/4", "exclusive", false},
		{"daemon, a member of team", "campaign", "orders/4", "", false},
		{"uid 4004 with no rule", "campaign", "shared/z", "", false}, // a campaign's terms are exclusive
		{"daemon, a member of team", "campaign", "team/leader", "", true},
		// Groups come from the uid, not from the process's own list.
		{"gid 4100 as a supplement", "acquire", "reports/44", "shared", false},
		{"root, not listed anywhere", "acquire", "orders/5", "exclusive", false},
	} {
		verb := "denied"
		if tc.allowed {
			verb = "allowed"
		}
		t.Run(fmt.Sprintf("%s %s %s %s %s", tc.peer, tc.op, tc.name, tc.mode, verb), func(t *testing.T) {
			p := relays[tc.peer]
			p.t = t
			req := fmt.Sprintf(`{"id":1,"op":%q,"name":%q}`, tc.op, tc.name)
			if tc.mode != "" {
				req = fmt.Sprintf(`{"id":1,"op":%q,"name":%q,"mode":%q}`, tc.op, tc.name, tc.mode)
			}
			m := p.call(req)
			if !tc.allowed {
				requireCode(t, m, "permission_denied")
				msg := m["error"].(map[string]any)["message"].(string)
				assert.Contains(t, msg, tc.name, "the message names the name")
				for _, r := range rules {
					assert.NotContains(t, msg, r.Pattern, "the message never shows a rule")
				}
				return
			}
			require.Equal(t, true, m["ok"], "response %v", m)
			if tc.op == "acquire" {
				require.Equal(t, true, m["acquired"], "response %v", m)
			}
		})
	}

	// A session's own leases need no rule: after a reload that drops the
	// rule, the holder still releases; it cannot take the name again.
	p := relays["uid 4001"]
	p.t = t
	lease := p.call(`{"op":"acquire","name":"orders/10"}`)["lease"].(string)
	ta.agent.SetAccess(agent.Access{Rules: rules[1:]})
	require.Equal(t, true, p.call(fmt.Sprintf(`{"op":"release","lease":%q}`, lease))["ok"])
	requireCode(t, p.call(`{"op":"acquire","name":"orders/10"}`), "permission_denied")
}

// TestF6_WrongPeer: the socket's mode and group keep out who they should;
// the ACL refuses the rest with permission_denied, and a peer that keeps
// asking cannot flood the log.
func TestF6_WrongPeer(t *testing.T) {
	t.Run("socket permissions", func(t *testing.T) {
		ta := startAgent(t, func(o *options) { o.SocketMode, o.SocketGroup = 0o660, "4200" })
		fi, err := os.Lstat(ta.path)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o660), fi.Mode().Perm())

		out := startPeer(t, cred{uid: 4300, gid: 4300}, "relay", ta.path)
		assert.Contains(t, out.line(), "permission denied", "a peer outside the group cannot connect")
		in := startPeer(t, cred{uid: 4301, gid: 4200}, "relay", ta.path)
		assert.Equal(t, true, in.call(`{"op":"ping"}`)["ok"], "a peer of the group can")
	})

	t.Run("acl and logs", func(t *testing.T) {
		logs := new(logBuffer)
		ta := startAgent(t, everybody, withLogs(logs), func(o *options) {
			o.Agent.Access.Rules = []agent.Rule{{Pattern: "*", UIDs: []uint32{4400}}}
		})
		flood := startPeer(t, cred{uid: 4300, gid: 4300}, "relay", ta.path)
		for i := 0; i < 100; i++ {
			requireCode(t, flood.call(fmt.Sprintf(`{"op":"acquire","name":"x/%d"}`, i)), "permission_denied")
		}
		requireCode(t, flood.call(`{"op":"list","all":true}`), "permission_denied")
		requireCode(t, flood.call(`{"op":"break","name":"x/1"}`), "permission_denied")

		other := startPeer(t, cred{uid: 4301, gid: 4301}, "relay", ta.path)
		requireCode(t, other.call(`{"op":"acquire","name":"y"}`), "permission_denied")
		allowed := startPeer(t, cred{uid: 4400, gid: 4400}, "relay", ta.path)
		require.Equal(t, true, allowed.call(`{"op":"acquire","name":"y"}`)["acquired"])

		n := logs.count("request refused", "uid=4300")
		assert.Positive(t, n, "refusals are logged")
		assert.LessOrEqual(t, n, 10, "one peer's refusals are rate-limited:\n%s", logs)
		assert.Equal(t, 1, logs.count("request refused", "uid=4301"), "another peer's refusal is still logged")
		require.Equal(t, true, flood.call(`{"op":"ping"}`)["ok"], "the refused peer is still served")
	})
}

// TestAdminGroupsAndAudit: members of an admin group (by the group
// database) may list every session and break locks; every admin action is
// an audit line; others are refused and nothing is audited for them.
func TestAdminGroupsAndAudit(t *testing.T) {
	admins := testGroup(t)
	logs := new(logBuffer)
	ta := startAgent(t, everybody, withLogs(logs), func(o *options) {
		o.Agent.Access = agent.Access{AdminUIDs: []uint32{}, AdminGIDs: []uint32{admins}}
	})
	holder := startPeer(t, cred{uid: 4800, gid: 4800}, "relay", ta.path)
	require.Equal(t, true, holder.call(`{"op":"acquire","name":"jobs/1"}`)["acquired"])

	nobody := startPeer(t, cred{uid: 4801, gid: 4801}, "relay", ta.path)
	requireCode(t, nobody.call(`{"op":"list","all":true}`), "permission_denied")
	requireCode(t, nobody.call(`{"op":"break","name":"jobs/1"}`), "permission_denied")
	root := ta.raw(t)
	root.fail(`{"op":"list","all":true}`, "permission_denied") // admin_uids replaced the built-in admins

	admin := startPeer(t, cred{uid: 1, gid: 1}, "relay", ta.path)
	list := admin.call(`{"op":"list","all":true}`)
	require.Equal(t, true, list["ok"], "%v", list)
	assert.Len(t, list["sessions"], 4, "every session of the agent")
	brk := admin.call(`{"op":"break","name":"jobs/1"}`)
	require.Equal(t, true, brk["ok"], "%v", brk)
	assert.EqualValues(t, 1, brk["broken"])
	ev := holder.call(`{"op":"ping"}`) // the lost event comes first
	assert.Equal(t, "lost", ev["event"])

	assert.Equal(t, 1, logs.count("agent.audit", "admin action", `action="list -all"`, "uid=1 "), "%s", logs)
	assert.Equal(t, 1, logs.count("agent.audit", "admin action", "action=break", "uid=1 ", "name=jobs/1", "broken=1"), "%s", logs)
	assert.Equal(t, 2, logs.count("admin action"), "refusals are not admin actions:\n%s", logs)
}

// TestF4_PerUIDConnectionCap: a uid beyond its connection cap gets
// limit_exceeded on each new connection, while every other uid is served.
func TestF4_PerUIDConnectionCap(t *testing.T) {
	logs := new(logBuffer)
	ta := startAgent(t, everybody, withLogs(logs), func(o *options) { o.Server.MaxConnsPerUID = 5 })
	greedy := startPeer(t, cred{uid: 4500, gid: 4500}, "conns", ta.path, "30")
	require.Equal(t, "accepted 5 refused 25", greedy.line())
	other := startPeer(t, cred{uid: 4501, gid: 4501}, "conns", ta.path, "5")
	require.Equal(t, "accepted 5 refused 0", other.line())
	require.True(t, pings(ta.path), "root is served")
	assert.LessOrEqual(t, logs.count("connection refused", "uid=4500"), 10, "refusals are rate-limited:\n%s", logs)

	// The connections held count until they end.
	greedy.stdin.Close()
	require.Eventually(t, func() bool {
		p := startPeer(t, cred{uid: 4500, gid: 4500}, "conns", ta.path, "1")
		return p.line() == "accepted 1 refused 0"
	}, 10*time.Second, 100*time.Millisecond)
}

// TestAdminReserve: once other users have filled the agent (its sessions
// and connections at their caps), an admin still gets in, for
// agent.AdminReserve more connections and sessions, and nobody else does.
func TestAdminReserve(t *testing.T) {
	ta := startAgent(t, everybody, func(o *options) {
		o.Server.MaxConns = 5
		o.Agent.MaxSessions = 5
	})
	filler := startPeer(t, cred{uid: 4700, gid: 4700}, "conns", ta.path, "8")
	require.Equal(t, "accepted 5 refused 3", filler.line())
	for range agent.AdminReserve {
		ta.raw(t).ok(`{"op":"status"}`) // root, an admin: its session stays open
	}
	requireCode(t, ta.raw(t).recv(), "limit_exceeded")
	other := startPeer(t, cred{uid: 4701, gid: 4701}, "conns", ta.path, "1")
	require.Equal(t, "accepted 0 refused 1", other.line())
}

// TestAdminReserveByGroup: an admin by one of its groups (admin_groups),
// not its primary one, gets the reserve of connections too.
func TestAdminReserveByGroup(t *testing.T) {
	ta := startAgent(t, everybody, func(o *options) {
		o.Server.MaxConns = 5
		o.Agent.Access.AdminGIDs = []uint32{4999}
		o.Server.GroupsOf = func(uid uint32) ([]uint32, error) {
			if uid == 4901 {
				return []uint32{4901, 4999}, nil // a member of the admin group
			}
			return []uint32{uid}, nil
		}
	})
	filler := startPeer(t, cred{uid: 4700, gid: 4700}, "conns", ta.path, "6")
	require.Equal(t, "accepted 5 refused 1", filler.line())
	admin := startPeer(t, cred{uid: 4901, gid: 4901}, "conns", ta.path, "1")
	require.Equal(t, "accepted 1 refused 0", admin.line())
}

// TestF7_PerUIDLeaseCap: the leases of all the sessions of one uid are
// capped together; beyond the cap limit_exceeded, and other uids lock on.
func TestF7_PerUIDLeaseCap(t *testing.T) {
	ta := startAgent(t, everybody, func(o *options) { o.Agent.MaxLeasesPerUID = 3 })
	a := startPeer(t, cred{uid: 4600, gid: 4600}, "relay", ta.path)
	b := startPeer(t, cred{uid: 4600, gid: 4600}, "relay", ta.path)
	var leases []string
	for i := 0; i < 2; i++ {
		m := a.call(fmt.Sprintf(`{"op":"acquire","name":"a/%d"}`, i))
		require.Equal(t, true, m["acquired"], "%v", m)
		leases = append(leases, m["lease"].(string))
	}
	require.Equal(t, true, b.call(`{"op":"acquire","name":"b/0"}`)["acquired"])
	requireCode(t, a.call(`{"op":"acquire","name":"a/2"}`), "limit_exceeded")
	requireCode(t, b.call(`{"op":"acquire","name":"b/1","wait_ms":1000}`), "limit_exceeded")
	requireCode(t, a.call(`{"op":"campaign","name":"a/c"}`), "limit_exceeded")

	other := startPeer(t, cred{uid: 4601, gid: 4601}, "relay", ta.path)
	for i := 0; i < 3; i++ {
		require.Equal(t, true, other.call(fmt.Sprintf(`{"op":"acquire","name":"o/%d"}`, i))["acquired"])
	}

	require.Equal(t, true, a.call(fmt.Sprintf(`{"op":"release","lease":%q}`, leases[0]))["ok"])
	require.Equal(t, true, b.call(`{"op":"acquire","name":"b/1"}`)["acquired"], "a released lease frees its place")
}

// TestF3_Slowloris: 500 connections of one uid that trickle a request byte
// by byte are closed when their line times out, while a well-behaved
// client's requests keep their latency and an idle holder keeps its lock.
func TestF3_Slowloris(t *testing.T) {
	ta := startAgent(t, everybody, func(o *options) { o.Server.LineTimeout = time.Second })
	idle := ta.raw(t)
	lease := idle.ok(`{"op":"acquire","name":"kept"}`)["lease"].(string)

	loris := startPeer(t, cred{uid: 4700, gid: 4700}, "slowloris", ta.path, "500")
	require.Equal(t, "open 500", loris.line())

	good := ta.raw(t)
	var worst time.Duration
	closed := make(chan string, 1)
	go func() {
		loris.out.SetReadDeadline(time.Now().Add(20 * time.Second))
		s, _ := loris.r.ReadString('\n')
		closed <- strings.TrimSpace(s)
	}()
	for i := 0; ; i++ {
		start := time.Now()
		l := good.ok(fmt.Sprintf(`{"op":"acquire","name":"good/%d"}`, i))["lease"].(string)
		good.ok(fmt.Sprintf(`{"op":"release","lease":%q}`, l))
		worst = max(worst, time.Since(start))
		select {
		case s := <-closed:
			require.Equal(t, "closed 500", s, "every slow connection was closed; stderr: %s", loris.err)
			// Slow connections that held the others up would hold them
			// until they time out, a second.
			assert.Less(t, worst, 500*time.Millisecond, "a good client's round trip")
			t.Logf("%d good round trips; the slowest took %s", i+1, worst)
			// An idle connection, with no line begun, is not cut off.
			idle.ok(fmt.Sprintf(`{"op":"check","lease":%q}`, lease))
			return
		default:
		}
	}
}
