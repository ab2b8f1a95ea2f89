package main

// End-to-end tests of the lockagent binary: real agent processes, real
// sockets, real applications killed with SIGKILL. Scenario ids are those of
// docs/testing.md.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
)

// releaseBound is how soon a dropped application's locks must be free
// (docs/testing.md, guarantee 6: "well under a second").
const releaseBound = time.Second

func TestA1_AppKilledReleasesLocks(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.start(t)

	names := []string{"a1/0", "a1/1", "a1/2", "a1/3", "a1/4"}
	self, err := os.Executable()
	require.NoError(t, err)
	app := startProc(t, "holder app", append(e.clientEnv(), helperEnv+"=hold"), self, names...)
	out := app.waitOutput(t, "\n", exitTimeout)
	fields := strings.Fields(out)
	require.Len(t, fields, 1+len(names), "holder app printed %q", out)
	require.Equal(t, "held", fields[0], "holder app printed %q", out)
	held := map[string]uint64{}
	for i, n := range names {
		tok, err := strconv.ParseUint(fields[1+i], 10, 64)
		require.NoError(t, err)
		held[n] = tok
	}

	other := dialAgent(t, e.socket, "e2e-other")
	for _, n := range names {
		require.False(t, tryAcquire(t, other, n, nil).Acquired, "%s is free while the app holds it", n)
	}

	app.signal(t, syscall.SIGKILL)
	app.wait(t, exitTimeout)
	killed := time.Now()
	for _, n := range names {
		l := acquireSoon(t, other, n, releaseBound)
		require.Greater(t, l.Token, held[n], "token of %s after the holder died", n)
	}
	t.Logf("all %d locks acquired %s after the kill", len(names), time.Since(killed))

	t.Run("socket closed", func(t *testing.T) {
		app := dialAgent(t, e.socket, "e2e-closer")
		l := mustAcquire(t, app, "a1/closed", nil)
		require.NoError(t, app.Close())
		got := acquireSoon(t, other, "a1/closed", releaseBound)
		require.Greater(t, got.Token, l.Token)
	})
}

func TestC3_AgentKilledAndRestarted(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	a := e.start(t)
	app := dialAgent(t, e.socket, "e2e-app")
	conn := mustAcquire(t, app, "c3/conn", nil)
	sess := mustAcquire(t, app, "c3/sess", map[string]any{"scope": "session"})

	killAgent(t, a)
	waitDone(t, app, exitTimeout)
	for ev := range app.Events() {
		t.Logf("event before EOF: %+v", ev)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	require.Error(t, app.Call(ctx, "ping", nil, nil), "a call on the dead agent's connection")

	e.start(t)
	app2 := dialAgent(t, e.socket, "e2e-app")
	for _, old := range []lease{conn, sess} {
		l := mustAcquire(t, app2, old.Name, nil)
		require.Greater(t, l.Token, old.Token, "token of %s after the restart", old.Name)
	}
}

func TestStaleSocketIsReused(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	killAgent(t, e.start(t))
	fi, err := os.Lstat(e.socket)
	require.NoError(t, err, "kill -9 leaves the socket file behind")
	require.Equal(t, os.ModeSocket, fi.Mode().Type())

	e.start(t)
	c := dialAgent(t, e.socket, "e2e-stale")
	call(t, c, "ping", nil, nil)
}

func TestNonSocketPathIsRefused(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	require.NoError(t, os.WriteFile(e.socket, []byte("precious"), 0o600))

	a := e.spawn(t)
	require.Equal(t, 1, a.wait(t, exitTimeout), "exit status")
	require.Contains(t, a.stderr.String(), e.socket)
	require.Contains(t, a.stderr.String(), "not a socket")
	data, err := os.ReadFile(e.socket)
	require.NoError(t, err)
	require.Equal(t, "precious", string(data), "the file was touched")
}

func TestC4_SigtermShutdown(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	notify := listenNotify(t, e.dir)
	a := e.start(t, "NOTIFY_SOCKET="+notify.path, "WATCHDOG_USEC=200000")
	ready := notify.wait(t, "READY=1", exitTimeout)
	notify.wait(t, "WATCHDOG=1", exitTimeout)

	fi, err := os.Lstat(e.socket)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o660), fi.Mode().Perm(), "the default socket mode")

	app := dialAgent(t, e.socket, "e2e-app")
	mustAcquire(t, app, "c4/conn", nil)
	mustAcquire(t, app, "c4/sess", map[string]any{"scope": "session"})
	// A second application waits for one of the names when the agent stops.
	waiter := dialAgent(t, e.socket, "e2e-waiter")
	waited := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), exitTimeout)
		defer cancel()
		var l lease
		err := waiter.Call(ctx, "acquire", map[string]any{"name": "c4/conn", "wait_ms": -1}, &l)
		if err == nil {
			err = fmt.Errorf("acquire ended without an error: %+v", l)
		}
		waited <- err
	}()
	eventually(t, exitTimeout, "the waiter waits", func() bool {
		r := lockagent(t, e.clientEnv(), "ctl", "list")
		return strings.Contains(r.stdout, "c4/conn (exclusive")
	})

	start := time.Now()
	a.signal(t, syscall.SIGTERM)
	ev := waitEvent(t, app, "shutdown", exitTimeout)
	require.NotEmpty(t, ev.Message)
	waitDone(t, app, exitTimeout)
	select {
	case err := <-waited:
		require.Error(t, err)
		t.Logf("the waiting acquire ended with: %v", err)
	case <-time.After(exitTimeout):
		t.Fatal("the waiting acquire did not end at shutdown")
	}
	require.Equal(t, 0, a.wait(t, exitTimeout), "exit status after SIGTERM")
	t.Logf("stopped %s after SIGTERM", time.Since(start))

	_, err = os.Lstat(e.socket)
	require.ErrorIs(t, err, os.ErrNotExist, "the socket file is removed")
	stopping := notify.wait(t, "STOPPING=1", exitTimeout)
	require.Less(t, ready, stopping, "READY=1 comes before STOPPING=1: %q", notify.messages())
}

func TestC5_RestartTokensDoNotGoBack(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.socketViaEnv = true
	names := []string{"c5/a", "c5/b", "c5/c"}
	last := map[string]uint64{}
	for run := range 4 { // the first start and 3 restarts
		a := e.start(t)
		c := dialAgent(t, e.socket, "e2e-c5")
		for range 3 {
			for _, n := range names {
				l := mustAcquire(t, c, n, nil)
				require.Greater(t, l.Token, last[n], "run %d: token of %s", run, n)
				last[n] = l.Token
				var rel struct {
					Released bool `json:"released"`
				}
				call(t, c, "release", map[string]any{"lease": l.Lease}, &rel)
				require.True(t, rel.Released)
			}
		}
		require.NoError(t, c.Close())
		// Restart after a clean stop and after a crash, in turn.
		if run%2 == 0 {
			stopAgent(t, a)
		} else {
			killAgent(t, a)
		}
	}
}

func TestC7_SecondAgentSameSocket(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	first := e.start(t)
	app := dialAgent(t, e.socket, "e2e-app")
	l := mustAcquire(t, app, "c7/x", nil)

	second := e.spawn(t)
	require.Equal(t, 1, second.wait(t, exitTimeout), "the second agent's exit status")
	require.Contains(t, second.stderr.String(), e.socket, "the error names the socket")
	require.Contains(t, second.stderr.String(), fmt.Sprintf("socket in use by a live agent (%s.lock is held by pid %d)", e.socket, first.cmd.Process.Pid))

	require.False(t, first.exited(), "the first agent is still running")
	call(t, app, "ping", nil, nil)
	var chk struct {
		Held  bool   `json:"held"`
		Token uint64 `json:"token"`
	}
	call(t, app, "check", map[string]any{"lease": l.Lease}, &chk)
	require.True(t, chk.Held, "the held lock is intact")
	require.Equal(t, l.Token, chk.Token)

	fresh := dialAgent(t, e.socket, "e2e-fresh")
	call(t, fresh, "ping", nil, nil)
	require.False(t, tryAcquire(t, fresh, "c7/x", nil).Acquired, "the lock is still held")
	select {
	case ev := <-app.Events():
		t.Fatalf("the holder got an event: %+v", ev)
	default:
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	r := lockagent(t, nil, "version")
	requireCode(t, 0, r, "version")
	require.Regexp(t, `^lockagent `+testVersion+` \(commit \S+, go\S+\)\n$`, r.stdout)
	require.Contains(t, r.stdout, runtime.Version())
}

func TestConfigCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	good := filepath.Join(dir, "good.hcl")
	require.NoError(t, os.WriteFile(good, fmt.Appendf(nil, "state_dir = %q\nlog_level = \"debug\"\n", state), 0o600))

	r := lockagent(t, []string{"LOCKAGENT_SOCKET=/tmp/la-e2e-check.sock"}, "config", "check", "-config", good)
	requireCode(t, 0, r, "config check")
	require.Regexp(t, `(?m)^state_dir\s*=\s*`+regexp.QuoteMeta(strconv.Quote(state))+`$`, r.stdout)
	require.Regexp(t, `(?m)^log_level\s*=\s*"debug"$`, r.stdout)
	require.Regexp(t, `(?m)^\s+path\s*=\s*"/tmp/la-e2e-check.sock"$`, r.stdout, "LOCKAGENT_SOCKET applies")
	require.Contains(t, r.stdout, `backend "memory"`)
	require.True(t, strings.HasPrefix(r.stdout, "# The effective configuration of "+good+".\n"), "the file checked, first:\n%s", r.stdout)

	// Without -config, the defaults are checked, and the output says so.
	r = lockagent(t, []string{"LOCKAGENT_SOCKET=/tmp/la-e2e-check.sock"}, "config", "check")
	requireCode(t, 0, r, "config check without -config")
	require.True(t, strings.HasPrefix(r.stdout, "# No -config FILE given: the built-in defaults"), "the defaults, said first:\n%s", r.stdout)
	require.Contains(t, r.stdout, `backend "memory"`)

	bad := filepath.Join(dir, "bad.hcl")
	require.NoError(t, os.WriteFile(bad, fmt.Appendf(nil, "state_dir = %q\nlog_level = \"verbose\"\n", state), 0o600))
	r = lockagent(t, nil, "config", "check", "-config", bad)
	requireCode(t, 1, r, "config check of a bad value")
	require.Contains(t, r.stderr, bad+":2", "the error points at the line")
	require.Contains(t, r.stderr, "log_level")
	require.Empty(t, r.stdout)

	syntax := filepath.Join(dir, "syntax.hcl")
	require.NoError(t, os.WriteFile(syntax, []byte("log_level = \"debug\"\nsocket {\n  path = \"/x\"\n"), 0o600))
	r = lockagent(t, nil, "config", "check", "-config", syntax)
	requireCode(t, 1, r, "config check of a syntax error")
	require.Regexp(t, regexp.QuoteMeta(syntax)+`:\d+`, r.stderr)

	r = lockagent(t, nil, "config", "check", "-config", filepath.Join(dir, "missing.hcl"))
	requireCode(t, 1, r, "config check of a missing file")
	require.Contains(t, r.stderr, "missing.hcl")

	r = lockagent(t, []string{"LOCKAGENT_SOCKET=" + filepath.Join(dir, "s")}, "agent", "-config", good, "-log-level", "loud")
	requireCode(t, 1, r, "agent -log-level loud")
	require.Contains(t, r.stderr, "log_level")

	// The agent refuses the bad file the same way.
	r = lockagent(t, []string{"LOCKAGENT_SOCKET=" + filepath.Join(dir, "s")}, "agent", "-config", bad)
	requireCode(t, 1, r, "agent with a bad config")
	require.Contains(t, r.stderr, bad+":2")
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	noAgent := []string{"LOCKAGENT_SOCKET=/nonexistent/lockagent-e2e.sock"}
	for _, tc := range []struct {
		args []string
		cmd  string // whose usage the error points at
	}{
		{[]string{}, ""},
		{[]string{"bogus"}, ""},
		{[]string{"help", "bogus"}, ""},
		{[]string{"ctl"}, "ctl"},
		{[]string{"ctl", "bogus"}, "ctl"},
		{[]string{"ctl", "list", "extra"}, "ctl list"},
		{[]string{"ctl", "list", "-bogus"}, "ctl list"},
		{[]string{"ctl", "status", "-json=maybe"}, "ctl status"},
		{[]string{"ctl", "inspect"}, "ctl inspect"},
		{[]string{"ctl", "break", "a", "b"}, "ctl break"},
		{[]string{"run"}, "run"},
		{[]string{"run", "name"}, "run"},
		{[]string{"run", "name", "true"}, "run"},
		{[]string{"run", "name", "--"}, "run"},
		{[]string{"run", "--", "true"}, "run"},
		{[]string{"run", "a", "b", "--", "true"}, "run"},
		{[]string{"run", "-wait", "soon", "name", "--", "true"}, "run"},
		{[]string{"run", "-bogus", "name", "--", "true"}, "run"},
		{[]string{"run", "-elect", "name"}, "run"},
		{[]string{"run", "-elect", "name", "true"}, "run"},
		{[]string{"run", "-elect", "name", "--"}, "run"},
		{[]string{"run", "-elect", "name", "other", "--", "true"}, "run"},
		{[]string{"agent", "extra"}, "agent"},
		{[]string{"agent", "-bogus"}, "agent"},
		{[]string{"config"}, "config"},
		{[]string{"config", "bogus"}, "config"},
		{[]string{"config", "check", "extra.hcl"}, "config check"},
		{[]string{"config", "check", "-bogus"}, "config check"},
		{[]string{"version", "extra"}, "version"},
	} {
		r := lockagent(t, noAgent, tc.args...)
		what := fmt.Sprintf("lockagent %q", tc.args)
		requireCode(t, 2, r, what)
		// One line: the problem, and where the usage is; not the usage
		// itself, nor the error twice.
		where := strings.TrimSpace("lockagent " + tc.cmd)
		require.Regexp(t, `^`+regexp.QuoteMeta(where)+`: [^\n]+ \(see '`+regexp.QuoteMeta(where)+` -h'\)\n$`, r.stderr, what)
		require.Empty(t, r.stdout, what)
	}
}

// listJSON is `ctl list -json`, decoded independently of the command's own
// types.
type listJSON struct {
	Sessions []struct {
		Session  string `json:"session"`
		PID      int    `json:"pid"`
		UID      int    `json:"uid"`
		Client   string `json:"client"`
		Attached bool   `json:"attached"`
		Leases   []struct {
			Lease string `json:"lease"`
			Name  string `json:"name"`
			Mode  string `json:"mode"`
			Scope string `json:"scope"`
			Token uint64 `json:"token"`
		} `json:"leases"`
		Waiting []struct {
			Name string `json:"name"`
			Mode string `json:"mode"`
		} `json:"waiting"`
		Campaigns []struct {
			Campaign string `json:"campaign"`
			Name     string `json:"name"`
			Leader   bool   `json:"leader"`
		} `json:"campaigns"`
	} `json:"sessions"`
}

func TestCtlList(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.start(t)
	holder := dialAgent(t, e.socket, "e2e-holder")
	l := mustAcquire(t, holder, "ctl/list", nil)
	var camp struct {
		Campaign string `json:"campaign"`
	}
	leader := dialAgent(t, e.socket, "e2e-leader")
	require.NoError(t, leader.Call(t.Context(), "campaign", map[string]any{"name": "ctl/lead"}, &camp))

	// A second session waits for the name.
	waiter := dialAgent(t, e.socket, "e2e-waiter")
	granted := make(chan lease, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), exitTimeout)
		defer cancel()
		var w lease
		waiter.Call(ctx, "acquire", map[string]any{"name": "ctl/list", "wait_ms": -1}, &w)
		granted <- w
	}()

	listing := func(args ...string) listJSON {
		t.Helper()
		r := lockagent(t, e.clientEnv(), append([]string{"ctl", "list", "-json"}, args...)...)
		requireCode(t, 0, r, "ctl list -json")
		var res listJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), "ctl list -json output:\n%s", r.stdout)
		var fields map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &fields))
		require.NotContains(t, fields, "id", "the wire's fields are not the result's")
		require.NotContains(t, fields, "ok")
		return res
	}
	eventually(t, exitTimeout, "the waiter shows in ctl list -json", func() bool {
		for _, s := range listing().Sessions {
			if s.Client == "e2e-waiter" && len(s.Waiting) == 1 {
				return true
			}
		}
		return false
	})
	eventually(t, exitTimeout, "a campaign shows in ctl list -json, as leader", func() bool {
		for _, s := range listing().Sessions {
			if s.Client == "e2e-leader" && len(s.Campaigns) == 1 {
				c := s.Campaigns[0]
				return c.Campaign == camp.Campaign && c.Name == "ctl/lead" && c.Leader
			}
		}
		return false
	})

	res := listing()
	var found bool
	for _, s := range res.Sessions {
		if s.Client != "e2e-holder" {
			continue
		}
		found = true
		require.Equal(t, os.Getpid(), s.PID)
		require.Equal(t, os.Getuid(), s.UID)
		require.True(t, s.Attached)
		require.Len(t, s.Leases, 1)
		require.Equal(t, "ctl/list", s.Leases[0].Name)
		require.Equal(t, l.Token, s.Leases[0].Token)
		require.Equal(t, l.Lease, s.Leases[0].Lease)
		require.Equal(t, "exclusive", s.Leases[0].Mode)
		require.Equal(t, "connection", s.Leases[0].Scope)
	}
	require.True(t, found, "no session of e2e-holder in %+v", res)
	require.NotEmpty(t, listing("-all").Sessions, "ctl list -all as the agent's own uid")

	// A client name can hold anything: the table quotes what is not
	// printable, so that it cannot forge rows or reach the terminal.
	const forged = "forged\nrow\t\x1b[2J"
	mustAcquire(t, dialAgent(t, e.socket, forged), "ctl/forged", nil)

	// The table, found through -socket this time.
	r := lockagent(t, nil, "ctl", "list", "-socket", e.socket)
	requireCode(t, 0, r, "ctl list")
	require.Contains(t, r.stdout, strconv.Quote(forged))
	require.NotContains(t, r.stdout, "\x1b")
	require.NotContains(t, r.stdout, "\nrow")
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	require.Regexp(t, `^SESSION\s+PID\s+UID\s+CLIENT\s+LOCK\s+MODE\s+SCOPE\s+TOKEN\s+HELD FOR\s+EXPIRES IN\s+WAITING$`, lines[0])
	var row, waitRow []string
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		switch {
		case len(f) > 3 && f[3] == "e2e-holder":
			row = f
		case len(f) > 3 && f[3] == "e2e-waiter":
			waitRow = f
		}
	}
	require.Len(t, row, 11, "the holder's row in:\n%s", r.stdout)
	require.Equal(t, []string{strconv.Itoa(os.Getpid()), strconv.Itoa(os.Getuid()), "e2e-holder", "ctl/list", "exclusive", "connection", strconv.FormatUint(l.Token, 10)}, row[1:8])
	require.Equal(t, "-", row[10], "the holder waits for nothing")
	require.NotNil(t, waitRow, "the waiter's row in:\n%s", r.stdout)
	require.Contains(t, strings.Join(waitRow, " "), "ctl/list (exclusive,", "the waiter's row")

	// The waiter gets the lock once the holder lets go.
	require.NoError(t, holder.Close())
	select {
	case w := <-granted:
		require.True(t, w.Acquired, "the waiter's acquire: %+v", w)
		require.Greater(t, w.Token, l.Token)
	case <-time.After(exitTimeout):
		t.Fatal("the waiter was not granted the lock")
	}
}

func TestCtlInspect(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.start(t)
	host, err := os.Hostname()
	require.NoError(t, err)

	r := lockagent(t, e.clientEnv(), "ctl", "inspect", "ctl/never")
	requireCode(t, 0, r, "ctl inspect of a free name")
	require.Equal(t, "ctl/never: free (last token 0)\n", r.stdout)

	app := dialAgent(t, e.socket, "e2e-app")
	l := mustAcquire(t, app, "ctl/held", map[string]any{"meta": "job-17"})
	r = lockagent(t, e.clientEnv(), "ctl", "inspect", "ctl/held")
	requireCode(t, 0, r, "ctl inspect of a held name")
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	require.Len(t, lines, 3, "ctl inspect output:\n%s", r.stdout)
	require.Equal(t, fmt.Sprintf("ctl/held: held exclusive (last token %d)", l.Token), lines[0])
	require.Regexp(t, `^MODE\s+TOKEN\s+HOST\s+EXPIRES IN\s+META$`, lines[1])
	f := strings.Fields(lines[2])
	require.Len(t, f, 5, "holder row %q", lines[2])
	require.Equal(t, []string{"exclusive", strconv.FormatUint(l.Token, 10), host}, f[:3])
	require.Equal(t, "job-17", f[4])

	// A meta can hold anything: the table quotes what is not printable.
	const forged = "job\nexclusive 1 forged\x1b[0m"
	mustAcquire(t, app, "ctl/forged", map[string]any{"meta": forged})
	r = lockagent(t, e.clientEnv(), "ctl", "inspect", "ctl/forged")
	requireCode(t, 0, r, "ctl inspect of a name whose meta is not printable")
	lines = strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	require.Len(t, lines, 3, "ctl inspect output:\n%s", r.stdout)
	require.True(t, strings.HasSuffix(lines[2], strconv.Quote(forged)), "holder row %q", lines[2])

	// Shared holders are each listed.
	other := dialAgent(t, e.socket, "e2e-other")
	s1 := mustAcquire(t, app, "ctl/shared", map[string]any{"mode": "shared"})
	s2 := mustAcquire(t, other, "ctl/shared", map[string]any{"mode": "shared"})
	r = lockagent(t, e.clientEnv(), "ctl", "inspect", "ctl/shared")
	requireCode(t, 0, r, "ctl inspect of a shared name")
	require.Contains(t, r.stdout, fmt.Sprintf("ctl/shared: held shared (last token %d)", s2.Token))
	require.Regexp(t, fmt.Sprintf(`(?m)^shared\s+%d\s`, s1.Token), r.stdout)
	require.Regexp(t, fmt.Sprintf(`(?m)^shared\s+%d\s`, s2.Token), r.stdout)

	// After release the name is free and remembers its token.
	call(t, app, "release", map[string]any{"lease": l.Lease}, nil)
	r = lockagent(t, e.clientEnv(), "ctl", "inspect", "ctl/held")
	requireCode(t, 0, r, "ctl inspect after release")
	require.Equal(t, fmt.Sprintf("ctl/held: free (last token %d)\n", l.Token), r.stdout)

	for _, sub := range []string{"inspect", "break"} {
		r = lockagent(t, e.clientEnv(), "ctl", sub, "bad name")
		requireCode(t, 2, r, "ctl "+sub+" of a name the agent refuses: a usage error")
		require.Contains(t, r.stderr, "invalid_name")
		r = lockagent(t, e.clientEnv(), "ctl", sub, strings.Repeat("n", 70000))
		requireCode(t, 2, r, "ctl "+sub+" of a name longer than a line may be")
		require.Contains(t, r.stderr, "line_too_long")
	}

	// Flags may follow the name; after "--", a name may look like a flag.
	r = lockagent(t, nil, "ctl", "inspect", "ctl/held", "-socket", e.socket)
	requireCode(t, 0, r, "ctl inspect NAME -socket")
	require.Equal(t, fmt.Sprintf("ctl/held: free (last token %d)\n", l.Token), r.stdout)
	r = lockagent(t, nil, "ctl", "inspect", "-socket", e.socket, "--", "-held")
	requireCode(t, 0, r, "ctl inspect -- -held")
	require.Equal(t, "-held: free (last token 0)\n", r.stdout)
}

func TestCtlBreak(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.start(t)
	holder := dialAgent(t, e.socket, "e2e-holder")
	l := mustAcquire(t, holder, "ctl/break", nil)

	r := lockagent(t, nil, "ctl", "break", "ctl/break", "-socket", e.socket)
	requireCode(t, 0, r, "ctl break")
	require.Equal(t, "ctl/break: 1 lease(s) broken\n", r.stdout)
	ev := waitEvent(t, holder, "lost", exitTimeout)
	require.Equal(t, "broken", ev.Reason)
	require.Equal(t, l.Lease, ev.Lease)
	require.Equal(t, "ctl/break", ev.Name)
	require.Equal(t, l.Token, ev.Token)

	other := dialAgent(t, e.socket, "e2e-other")
	got := mustAcquire(t, other, "ctl/break", nil)
	require.Greater(t, got.Token, l.Token)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	err := holder.Call(ctx, "release", map[string]any{"lease": l.Lease}, nil)
	var se *client.Error
	require.ErrorAs(t, err, &se, "release of a broken lease")
	require.Equal(t, "not_held", se.Code)

	r = lockagent(t, e.clientEnv(), "ctl", "break", "ctl/free")
	requireCode(t, 0, r, "ctl break of a free name")
	require.Equal(t, "ctl/free: 0 lease(s) broken\n", r.stdout)
}

func TestClientCommandsWithoutAgent(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "la")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "s")
	env := []string{"LOCKAGENT_SOCKET=" + socket}
	for _, args := range [][]string{
		{"ctl", "list"},
		{"ctl", "list", "-json"},
		{"ctl", "inspect", "x"},
		{"ctl", "break", "x"},
		{"run", "x", "--", "sh", "-c", "echo ran"},
	} {
		r := lockagent(t, env, args...)
		requireCode(t, 1, r, fmt.Sprintf("lockagent %q", args))
		require.Contains(t, r.stderr, "cannot reach the agent", "lockagent %q", args)
		require.Contains(t, r.stderr, socket, "lockagent %q", args)
		require.Empty(t, r.stdout, "lockagent %q", args)
	}
	// -socket wins over LOCKAGENT_SOCKET.
	other := filepath.Join(dir, "other")
	r := lockagent(t, env, "ctl", "list", "-socket", other)
	requireCode(t, 1, r, "ctl list -socket")
	require.Contains(t, r.stderr, other)
	require.Contains(t, r.stderr, "no such file or directory (is the agent running?")
	require.Contains(t, r.stderr, "-socket or LOCKAGENT_SOCKET")
	require.Equal(t, 1, strings.Count(r.stderr, other), "the path, once: %s", r.stderr)

	// A socket file that nothing listens on any more.
	stale := filepath.Join(dir, "stale")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	require.NoError(t, err)
	l.SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
	r = lockagent(t, nil, "ctl", "status", "-socket", stale)
	requireCode(t, 1, r, "ctl status on a stale socket")
	require.Contains(t, r.stderr, "connection refused (the socket file is left from an agent that is gone")

	// A socket this user may not connect to (uid 1, daemon).
	require.NoError(t, os.Chmod(dir, 0o755))
	forbidden := filepath.Join(dir, "forbidden")
	l, err = net.ListenUnix("unix", &net.UnixAddr{Name: forbidden, Net: "unix"})
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, os.Chmod(forbidden, 0o600))
	r = lockagentAs(t, 1, 1, nil, "ctl", "list", "-socket", forbidden)
	requireCode(t, 1, r, "ctl list on a forbidden socket")
	require.Contains(t, r.stderr, "permission denied (the socket admits its owner and the members of its group")
	require.Contains(t, r.stderr, "usermod -aG lockagent")

	// A socket that accepts connections and answers nothing: ctl gives up
	// after the hello timeout, and says where to look.
	mute := filepath.Join(dir, "mute")
	ml, err := net.ListenUnix("unix", &net.UnixAddr{Name: mute, Net: "unix"})
	require.NoError(t, err)
	defer ml.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ml.Accept(); err == nil {
			accepted <- c
		}
	}()
	start := time.Now()
	r = lockagent(t, nil, "ctl", "inspect", "x", "-socket", mute)
	(<-accepted).Close()
	requireCode(t, 1, r, "ctl inspect on a mute socket")
	require.Contains(t, r.stderr, "the agent at "+mute+" accepted the connection but did not answer in 5s")
	require.Contains(t, r.stderr, "systemctl status lockagent")
	require.GreaterOrEqual(t, time.Since(start), 5*time.Second)
}

// queued tells whether a session of client has one acquire waiting.
func queued(t *testing.T, c *client.Client, name string) bool {
	t.Helper()
	var res listJSON
	call(t, c, "list", nil, &res)
	for _, s := range res.Sessions {
		if s.Client == name && len(s.Waiting) == 1 {
			return true
		}
	}
	return false
}

func TestRun(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.start(t)
	env := e.clientEnv()
	c := dialAgent(t, e.socket, "e2e-test")

	// requireFree checks that run let go of name, by taking it.
	requireFree := func(t *testing.T, name string, after uint64) {
		t.Helper()
		l := acquireSoon(t, c, name, releaseBound)
		require.Greater(t, l.Token, after)
		call(t, c, "release", map[string]any{"lease": l.Lease}, nil)
	}

	t.Run("token", func(t *testing.T) {
		r := lockagent(t, env, "run", "run/token", "--", "sh", "-c", `echo "$LOCKAGENT_TOKEN $LOCKAGENT_NAME"`)
		requireCode(t, 0, r, "run")
		f := strings.Fields(r.stdout)
		require.Len(t, f, 2, "output %q", r.stdout)
		tok, err := strconv.ParseUint(f[0], 10, 64)
		require.NoError(t, err, "LOCKAGENT_TOKEN %q", f[0])
		require.Equal(t, "run/token", f[1])
		require.Equal(t, tok, inspect(t, c, "run/token").LastToken)
		requireFree(t, "run/token", tok)
	})

	t.Run("exit status", func(t *testing.T) {
		r := lockagent(t, env, "run", "run/exit", "--", "sh", "-c", "exit 7")
		requireCode(t, 7, r, "run of exit 7")
		requireFree(t, "run/exit", 0)
	})

	t.Run("killed by signal", func(t *testing.T) {
		for sig, want := range map[string]int{"KILL": 137, "TERM": 143} {
			r := lockagent(t, env, "run", "run/signal", "--", "sh", "-c", "kill -"+sig+" $$")
			requireCode(t, want, r, "run of a command killed by SIG"+sig)
		}
		requireFree(t, "run/signal", 0)
	})

	t.Run("wait timeout", func(t *testing.T) {
		l := mustAcquire(t, c, "run/busy", nil)
		start := time.Now()
		r := lockagent(t, env, "run", "-wait", "200ms", "run/busy", "--", "sh", "-c", "echo ran")
		requireCode(t, 75, r, "run -wait on a held name")
		require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
		require.Empty(t, r.stdout, "the command must not run")
		require.Contains(t, r.stderr, "not acquired")
		call(t, c, "release", map[string]any{"lease": l.Lease}, nil)
	})

	t.Run("waits then runs", func(t *testing.T) {
		l := mustAcquire(t, c, "run/later", nil)
		p := startProc(t, "run", env, lockagentBin, "run", "-wait", "5s", "run/later", "--", "sh", "-c", `echo "got $LOCKAGENT_TOKEN"`)
		eventually(t, exitTimeout, "run waits for run/later", func() bool { return queued(t, c, "lockagent run") })
		require.False(t, p.exited())
		call(t, c, "release", map[string]any{"lease": l.Lease}, nil)
		require.Equal(t, 0, p.wait(t, exitTimeout))
		require.Regexp(t, `^got \d+\n$`, p.stdout.String())
		requireFree(t, "run/later", l.Token)
	})

	// ready is printed once the TERM trap is set, so that the test does not
	// break the lock before the command can handle it.
	const trapTerm = `trap "echo term; exit 42" TERM; echo ready; while :; do sleep 0.05; done`

	t.Run("lost lock terminates the command", func(t *testing.T) {
		p := startProc(t, "run", env, lockagentBin, "run", "run/break", "--", "sh", "-c", trapTerm)
		p.waitOutput(t, "ready", exitTimeout)
		r := lockagent(t, env, "ctl", "break", "run/break")
		requireCode(t, 0, r, "ctl break")
		require.Equal(t, 42, p.wait(t, exitTimeout), "run's exit status")
		require.Contains(t, p.stdout.String(), "term")
		require.Contains(t, p.stderr.String(), "broken")
		requireFree(t, "run/break", 0)
	})

	t.Run("grace then SIGKILL", func(t *testing.T) {
		p := startProc(t, "run", env, lockagentBin, "run", "-grace", "300ms", "run/grace", "--",
			"sh", "-c", `trap "" TERM; echo ready; while :; do sleep 0.05; done`)
		p.waitOutput(t, "ready", exitTimeout)
		start := time.Now()
		var br struct {
			Broken int `json:"broken"`
		}
		call(t, c, "break", map[string]any{"name": "run/grace"}, &br)
		require.Equal(t, 1, br.Broken)
		require.Equal(t, 137, p.wait(t, exitTimeout), "run's exit status")
		require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "SIGKILL came before the grace period")
		requireFree(t, "run/grace", 0)
	})

	t.Run("SIGTERM is passed to the command", func(t *testing.T) {
		p := startProc(t, "run", env, lockagentBin, "run", "run/forward", "--", "sh", "-c", trapTerm)
		p.waitOutput(t, "ready", exitTimeout)
		p.signal(t, syscall.SIGTERM)
		require.Equal(t, 42, p.wait(t, exitTimeout), "run's exit status")
		require.Contains(t, p.stdout.String(), "term")
		requireFree(t, "run/forward", 0)
	})

	t.Run("SIGQUIT is passed to the command", func(t *testing.T) {
		p := startProc(t, "run", env, lockagentBin, "run", "run/quit", "--", "sh", "-c",
			`trap "echo quit; exit 3" QUIT; echo ready; while :; do sleep 0.05; done`)
		p.waitOutput(t, "ready", exitTimeout)
		p.signal(t, syscall.SIGQUIT)
		require.Equal(t, 3, p.wait(t, exitTimeout), "run's exit status")
		require.Contains(t, p.stdout.String(), "quit")
		requireFree(t, "run/quit", 0)
	})

	t.Run("ttl", func(t *testing.T) {
		r := lockagent(t, env, "run", "-ttl", "2s", "run/ttl", "--", "sh", "-c", "echo $LOCKAGENT_LEASE")
		requireCode(t, 0, r, "run -ttl")
		p := startProc(t, "run", env, lockagentBin, "run", "-ttl", "2s", "run/ttl", "--", "sh", "-c", "echo ready; sleep 1000")
		p.waitOutput(t, "ready", exitTimeout)
		var res struct {
			Holders []struct {
				ExpiresIn int64 `json:"expires_in_ms"`
			} `json:"holders"`
		}
		call(t, c, "inspect", map[string]any{"name": "run/ttl"}, &res)
		require.Len(t, res.Holders, 1)
		require.LessOrEqual(t, res.Holders[0].ExpiresIn, int64(2000), "the lease's TTL is -ttl's")
		p.signal(t, syscall.SIGTERM)
		p.wait(t, exitTimeout)
	})

	t.Run("usage errors", func(t *testing.T) {
		for _, args := range [][]string{
			{"-wait", "-2s", "run/usage", "--", "true"},
			{"-grace", "-1s", "run/usage", "--", "true"},
			{"-ttl", "-1s", "run/usage", "--", "true"},
			{"-ttl", "500us", "run/usage", "--", "true"},
			{"-elect", "run/usage", "-shared", "--", "true"},
			{"-elect", "run/usage", "-wait", "1s", "--", "true"},
			{"run/usage", "true"},
			// Refused by the agent: a name or a TTL out of its bounds.
			{"", "--", "true"},
			{strings.Repeat("n", 300), "--", "true"},
			{"-ttl", "100h", "run/usage", "--", "true"},
			{"-elect", strings.Repeat("n", 300), "--", "true"},
			// A name longer than the agent's max_line_bytes.
			{strings.Repeat("n", 70000), "--", "true"},
			{"-elect", strings.Repeat("n", 70000), "--", "true"},
		} {
			r := lockagent(t, env, append([]string{"run"}, args...)...)
			requireCode(t, 2, r, fmt.Sprintf("run %.40q", args))
			require.Empty(t, r.stdout, "the command must not run")
		}
	})

	t.Run("agent stopped during -wait", func(t *testing.T) {
		e := newAgentEnv(t)
		a := e.start(t)
		holder := dialAgent(t, e.socket, "e2e-holder")
		mustAcquire(t, holder, "run/stopped", nil)
		start := time.Now()
		p := startProc(t, "run", e.clientEnv(), lockagentBin, "run", "-wait", "200ms", "-ttl", "1s", "run/stopped", "--", "sh", "-c", "echo ran")
		eventually(t, exitTimeout, "run waits for run/stopped", func() bool {
			return len(inspect(t, holder, "run/stopped").Holders) == 1 && queued(t, holder, "lockagent run")
		})
		// Stopped with run's acquire under way, the agent never answers it.
		a.signal(t, syscall.SIGSTOP)
		defer a.signal(t, syscall.SIGCONT)
		require.Equal(t, 1, p.wait(t, exitTimeout+helloTimeout), "run's exit status")
		took := time.Since(start)
		require.Contains(t, p.stderr.String(), "no answer within -wait and 6s more")
		require.Less(t, took, 200*time.Millisecond+time.Second+helloTimeout+2*time.Second, "bounded by -wait, -ttl and the hello timeout")
		require.Empty(t, p.stdout.String())
	})

	t.Run("shared", func(t *testing.T) {
		l := mustAcquire(t, c, "run/shared", map[string]any{"mode": "shared"})
		r := lockagent(t, env, "run", "-shared", "-wait", "2s", "run/shared", "--", "sh", "-c", "exit 0")
		requireCode(t, 0, r, "run -shared beside a shared holder")
		r = lockagent(t, env, "run", "-wait", "0s", "run/shared", "--", "sh", "-c", "echo ran")
		requireCode(t, 75, r, "exclusive run -wait 0s beside a shared holder")
		require.Empty(t, r.stdout)
		call(t, c, "release", map[string]any{"lease": l.Lease}, nil)
	})

	t.Run("command not found", func(t *testing.T) {
		r := lockagent(t, env, "run", "run/missing", "--", "/nonexistent/e2e-command")
		requireCode(t, 127, r, "run of a missing command")
		require.Contains(t, r.stderr, "/nonexistent/e2e-command")
		requireFree(t, "run/missing", 0)
		r = lockagent(t, env, "run", "run/missing", "--", "no-such-e2e-command")
		requireCode(t, 127, r, "run of a command not on PATH")

		notExec := filepath.Join(t.TempDir(), "script")
		require.NoError(t, os.WriteFile(notExec, []byte("#!/bin/sh\necho ran\n"), 0o644))
		r = lockagent(t, env, "run", "run/missing", "--", notExec)
		requireCode(t, 126, r, "run of a file that is not executable")
		require.Empty(t, r.stdout)
		requireFree(t, "run/missing", 0)
	})

	t.Run("run killed kills the command", func(t *testing.T) {
		p := startProc(t, "run", env, lockagentBin, "run", "run/orphan", "--", "sh", "-c", `echo "pid $$"; while :; do sleep 0.05; done`)
		p.waitOutput(t, "pid ", exitTimeout)
		var pid int
		_, err := fmt.Sscanf(p.stdout.String(), "pid %d", &pid)
		require.NoError(t, err)
		require.NoError(t, p.cmd.Process.Kill())
		eventually(t, exitTimeout, "the command dies with run", func() bool {
			// Gone, or a zombie nobody reaped yet.
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			return err != nil || strings.Contains(string(stat), ") Z ")
		})
		requireFree(t, "run/orphan", 0)
	})

	t.Run("agent killed terminates the command", func(t *testing.T) {
		e := newAgentEnv(t)
		a := e.start(t)
		p := startProc(t, "run", e.clientEnv(), lockagentBin, "run", "run/killed", "--", "sh", "-c", trapTerm)
		p.waitOutput(t, "ready", exitTimeout)
		killAgent(t, a)
		require.Equal(t, 42, p.wait(t, exitTimeout), "run's exit status")
		require.Contains(t, p.stderr.String(), "connection to the agent lost")
	})

	t.Run("agent shutdown terminates the command", func(t *testing.T) {
		e := newAgentEnv(t)
		a := e.start(t)
		p := startProc(t, "run", e.clientEnv(), lockagentBin, "run", "run/shutdown", "--", "sh", "-c", trapTerm)
		p.waitOutput(t, "ready", exitTimeout)
		stopAgent(t, a)
		require.Equal(t, 42, p.wait(t, exitTimeout), "run's exit status")
		require.Contains(t, p.stderr.String(), "shutting down")
	})
}

func TestSocketMode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		hcl  string
		want os.FileMode
	}{
		{"", 0o660},
		{"socket {\n  mode = \"0600\"\n}\n", 0o600},
	} {
		e := newAgentEnv(t)
		e.writeConfig(t, tc.hcl)
		e.start(t)
		fi, err := os.Lstat(e.socket)
		require.NoError(t, err)
		require.Equal(t, tc.want, fi.Mode().Perm(), "socket mode with config %q", tc.hcl)
	}
}

func TestAdminUIDs(t *testing.T) {
	t.Parallel()
	// admin_uids replaces the built-in admins (root and the agent's own
	// uid); an empty list leaves nobody.
	for _, admins := range []string{"[]", fmt.Sprintf("[%d]", os.Getuid()+4242)} {
		t.Run(admins, func(t *testing.T) {
			e := newAgentEnv(t)
			e.writeConfig(t, fmt.Sprintf("acl {\n  admin_uids = %s\n}\n", admins))
			e.start(t)
			holder := dialAgent(t, e.socket, "e2e-holder")
			l := mustAcquire(t, holder, "admin/x", nil)

			r := lockagent(t, e.clientEnv(), "ctl", "break", "admin/x")
			requireCode(t, 1, r, "ctl break by a non-admin")
			require.Contains(t, r.stderr, "permission_denied")
			r = lockagent(t, e.clientEnv(), "ctl", "list", "-all")
			requireCode(t, 1, r, "ctl list -all by a non-admin")
			require.Contains(t, r.stderr, "permission_denied")
			r = lockagent(t, e.clientEnv(), "ctl", "list")
			requireCode(t, 0, r, "ctl list of one's own sessions")
			require.Contains(t, r.stdout, "admin/x")

			var chk struct {
				Held bool `json:"held"`
			}
			call(t, holder, "check", map[string]any{"lease": l.Lease}, &chk)
			require.True(t, chk.Held, "the lease survived the refused break")
		})
	}
}

// TestRedisUnreachable: an agent whose Redis cannot be reached exits 1 and
// leaves no socket behind.
func TestRedisUnreachable(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.writeConfig(t, "backend \"redis\" {\n  addresses = [\"127.0.0.1:1\"]\n}\n")
	a := e.spawn(t)
	require.Equal(t, 1, a.wait(t, exitTimeout), "the agent's exit status")
	require.Contains(t, a.stderr.String(), "redis")
	_, err := os.Lstat(e.socket)
	require.ErrorIs(t, err, os.ErrNotExist, "no socket is left behind")
}

func TestReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	a := e.start(t)
	c := dialAgent(t, e.socket, "e2e-app")
	l := mustAcquire(t, c, "hup/x", nil)

	require.NoError(t, os.WriteFile(e.config, fmt.Appendf(nil, "state_dir = %q\nlog_level = \"trace\"\n", e.stateDir), 0o600))
	a.signal(t, syscall.SIGHUP)
	eventually(t, exitTimeout, "reload logged", func() bool {
		return strings.Contains(a.stderr.String(), "configuration reloaded: log_level=trace")
	})

	require.NoError(t, os.WriteFile(e.config, []byte("log_level = \"verbose\"\n"), 0o600))
	a.signal(t, syscall.SIGHUP)
	eventually(t, exitTimeout, "failed reload logged", func() bool {
		return strings.Contains(a.stderr.String(), "reload failed")
	})
	require.Contains(t, a.stderr.String(), e.config+":1", "the reload error points at the file")

	require.False(t, a.exited(), "a reload must not stop the agent")
	var chk struct {
		Held bool `json:"held"`
	}
	call(t, c, "check", map[string]any{"lease": l.Lease}, &chk)
	require.True(t, chk.Held)
	stopAgent(t, a)
}
