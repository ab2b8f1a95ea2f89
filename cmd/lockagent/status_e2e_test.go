package main

import (
	"encoding/json"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/wire"
)

func TestCtlStatus(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	a := e.start(t)
	env := e.clientEnv()
	c := dialAgent(t, e.socket, "e2e-app")
	mustAcquire(t, c, "status/1", nil)
	mustAcquire(t, c, "status/2", map[string]any{"mode": "shared"})
	mustAcquire(t, dialAgent(t, e.socket, "e2e-app2"), "status/3", nil)

	r := lockagent(t, env, "ctl", "status")
	requireCode(t, 0, r, "ctl status")
	// Two sessions of the test, and ctl's own.
	pid := strconv.Itoa(a.cmd.Process.Pid)
	require.Regexp(t, regexp.MustCompile(`(?m)^version: +`+testVersion+`\npid: +`+pid+`\nuptime: +\d+s\nbackend: +memory \(ok\)\nsessions: +3\nleases: +3\nwaiters: +0\n$`), r.stdout)

	r = lockagent(t, env, "ctl", "status", "-json")
	requireCode(t, 0, r, "ctl status -json")
	var st wire.StatusResult
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	assert.Equal(t, wire.StatusResult{Version: testVersion, PID: a.cmd.Process.Pid, UptimeMs: st.UptimeMs, Backend: "memory", BackendState: "ok", Sessions: 3, Leases: 3}, st)
	assert.GreaterOrEqual(t, st.UptimeMs, int64(0))
	var fields map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &fields))
	assert.NotContains(t, fields, "id", "the wire's id")
	assert.NotContains(t, fields, "ok", "the wire's ok")

	requireCode(t, 2, lockagent(t, env, "ctl", "status", "extra"), "ctl status with an argument")
	requireCode(t, 1, lockagent(t, []string{"LOCKAGENT_SOCKET=" + e.dir + "/none"}, "ctl", "status"), "ctl status without an agent")
	stopAgent(t, a)
}
