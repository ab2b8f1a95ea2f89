package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit/etcdtest"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// upgradeConns is how many connections the load of an upgrade test has.
const upgradeConns = 1000

// TestUpgradeLosesNothing upgrades an agent serving 1,000 connections to
// a binary of another version, on the embedded backend, Redis and etcd: no
// connection closes, no event is sent, every lease is held with its
// token, the waiter and the candidate keep their places, the detached
// session resumes, the loops never fail. The old process exits 0 once the
// new one serves.
func TestUpgradeLosesNothing(t *testing.T) {
	for _, backend := range []string{"memory", "redis", "etcd"} {
		t.Run(backend, func(t *testing.T) {
			env := newAgentEnv(t)
			switch backend {
			case "redis":
				srv := redistest.Start(t, redistest.Options{})
				env.writeConfig(t, fmt.Sprintf("backend \"redis\" {\n  addresses  = [%q]\n  key_prefix = \"e2e\"\n}\n", srv.Addr()))
			case "etcd":
				c := etcdtest.Start(t, etcdtest.Options{Members: 3})
				env.writeConfig(t, fmt.Sprintf("backend \"etcd\" {\n  endpoints  = [%s]\n  key_prefix = \"e2e\"\n}\n", quoteList(c.Endpoints())))
			}
			u := startUpgradable(t, env, lockagentBin)
			old := u.status(t)
			ld := startLoad(t, env.socket, upgradeConns)

			u.install(t, nextBinary(t))
			r := u.upgrade(t)
			requireCode(t, 0, r, "ctl upgrade")
			u.firstExited(t)
			now := u.status(t)
			require.NotEqual(t, old.PID, now.PID, "the pid after the upgrade")
			require.Contains(t, r.stdout, fmt.Sprintf("upgraded: version %s (pid %d), was %s (pid %d)", nextVersion, now.PID, testVersion, old.PID))
			u.requireServing(t, now.PID, nextVersion)
			require.Positive(t, now.UpgradedAgo, "status: the last upgrade")
			require.GreaterOrEqual(t, now.Uptime, old.Uptime, "the uptime goes on across the upgrade")

			ld.verify(t)
			out := u.output(t)
			require.Contains(t, out, "upgraded: handed the agent over")
			require.Contains(t, out, "took the agent over")
			require.NotContains(t, out, "shutting down")
		})
	}
}

// TestUpgradeBackAndForth upgrades to the next version and back, twice,
// under load: the state's format of either is read by the other.
func TestUpgradeBackAndForth(t *testing.T) {
	env := newAgentEnv(t)
	u := startUpgradable(t, env, lockagentBin)
	ld := startLoad(t, env.socket, 100)
	for i, bin := range []string{nextBinary(t), lockagentBin, nextBinary(t), lockagentBin} {
		u.install(t, bin)
		requireCode(t, 0, u.upgrade(t), fmt.Sprintf("upgrade %d", i+1))
	}
	u.firstExited(t)
	require.Equal(t, testVersion, u.status(t).Version)
	ld.verify(t)
}

// TestSIGUSR2Upgrades: SIGUSR2 upgrades as ctl upgrade does.
func TestSIGUSR2Upgrades(t *testing.T) {
	env := newAgentEnv(t)
	u := startUpgradable(t, env, lockagentBin)
	ld := startLoad(t, env.socket, 50)
	u.install(t, nextBinary(t))
	require.NoError(t, u.first.Process.Signal(syscall.SIGUSR2))
	u.firstExited(t)
	st := u.status(t)
	require.Equal(t, nextVersion, st.Version)
	require.NotEqual(t, u.first.Process.Pid, st.PID)
	ld.verify(t)
}

// TestFailedUpgradesServeOn: an upgrade that fails at any step leaves the
// old agent serving with nothing lost, and says why; an upgrade after it
// succeeds. The metrics count them, across the processes.
func TestFailedUpgradesServeOn(t *testing.T) {
	env := newAgentEnv(t)
	env.writeConfig(t, "metrics {\n  address = \"127.0.0.1:0\"\n}\n")
	u := startUpgradable(t, env, lockagentBin)
	url := metricsURL.FindStringSubmatch(u.output(t))
	require.NotNil(t, url, "the metrics' address in the log")
	pid := u.first.Process.Pid
	ld := startLoad(t, env.socket, 100)

	fails := func(t *testing.T, what, reason string) {
		t.Helper()
		r := u.upgrade(t)
		requireCode(t, 1, r, what)
		require.Contains(t, r.stderr, "upgrade_failed", what)
		require.Contains(t, r.stderr, reason, what)
		u.requireServing(t, pid, testVersion)
	}

	t.Run("a binary that exits at once", func(t *testing.T) {
		u.installScript(t, "exit 3")
		fails(t, "a binary that exits at once", "exit status 3")
	})
	t.Run("a binary that cannot be executed", func(t *testing.T) {
		require.NoError(t, os.WriteFile(u.bin+".new", []byte("not a program"), 0o644))
		require.NoError(t, os.Rename(u.bin+".new", u.bin))
		fails(t, "a binary that cannot be executed", "permission denied")
	})
	t.Run("an invalid config", func(t *testing.T) {
		u.install(t, nextBinary(t))
		good, err := os.ReadFile(env.config)
		require.NoError(t, err)
		bad := strings.Replace(string(good), `log_level = "debug"`, `log_level = "loud"`, 1)
		require.NoError(t, os.WriteFile(env.config, []byte(bad), 0o600))
		defer os.WriteFile(env.config, good, 0o600)
		fails(t, "an invalid config", "log_level")
	})
	t.Run("another backend", func(t *testing.T) {
		u.install(t, nextBinary(t))
		good, err := os.ReadFile(env.config)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(env.config, append(good, "backend \"redis\" {\n  addresses = [\"127.0.0.1:1\"]\n}\n"...), 0o600))
		defer os.WriteFile(env.config, good, 0o600)
		fails(t, "another backend", "restart the agent to change it")
	})
	// The new process takes the state and its descriptors, then stops at
	// a stage, tells the test, and waits to be killed.
	for _, stage := range []string{"state", "commit"} {
		t.Run("killed in the middle of the handover, at "+stage, func(t *testing.T) {
			mark := fmt.Sprintf("%s/at-%s", env.dir, stage)
			u.installScript(t, fmt.Sprintf(`exec env %s=handover-then-wait %s %s %q "$@"`, helperEnv, testBinary(t), stage, mark))
			done := make(chan cliResult, 1)
			go func() { done <- runUpgrade(u.env) }()
			var helper int
			eventually(t, callTimeout, "the new process has the state", func() bool {
				b, err := os.ReadFile(mark)
				if err == nil {
					fmt.Sscan(string(b), &helper)
				}
				return helper > 0
			})
			// Frozen meanwhile: a request waits, and is answered once the
			// agent thaws.
			pinged := make(chan error, 1)
			go func() { pinged <- pingOnce(env.socket) }()
			time.Sleep(100 * time.Millisecond)
			require.NoError(t, syscall.Kill(helper, syscall.SIGKILL))
			r := receiveWithin(t, done, exitTimeout, "ctl upgrade ends")
			requireCode(t, 1, r, "an upgrade whose new process was killed")
			require.Contains(t, r.stderr, "upgrade_failed")
			require.NoError(t, receive(t, pinged, "the ping during the handover is answered"))
			u.requireServing(t, pid, testVersion)
		})
	}
	// A new process that takes the state and stalls: the agent thaws at
	// half the time to the first lease's local deadline (its leases have
	// TTLs of 5s), in time to renew it.
	t.Run("a new process that stalls", func(t *testing.T) {
		u.installScript(t, fmt.Sprintf(`exec env %s=handover-then-wait %s state %q "$@"`, helperEnv, testBinary(t), env.dir+"/stalled"))
		began := time.Now()
		r := runUpgrade(env)
		requireCode(t, 1, r, "an upgrade whose new process stalls")
		require.Contains(t, r.stderr, "the new process was not ready in")
		require.Less(t, time.Since(began), 4*time.Second, "the freeze ends before the first lease's deadline")
		u.requireServing(t, pid, testVersion)
	})
	t.Run("then an upgrade succeeds", func(t *testing.T) {
		u.install(t, nextBinary(t))
		requireCode(t, 0, u.upgrade(t), "ctl upgrade")
		u.firstExited(t)
		require.Equal(t, nextVersion, u.status(t).Version)
	})
	ld.verify(t)
	require.Equal(t, 7, strings.Count(u.output(t), "upgrade failed; serving on"), "the log of the failed upgrades")
	m := scrape(t, url[1])
	require.Equal(t, 7.0, m[`lockagent_upgrades_total{result="failed"}`])
	require.Equal(t, 1.0, m[`lockagent_upgrades_total{result="succeeded"}`])
	require.Positive(t, m["lockagent_last_upgrade_duration_seconds"])
	require.InDelta(t, float64(time.Now().Unix()), m["lockagent_last_upgrade_time_seconds"], 60)
}

// TestUpgradeIsForAdmins: another uid is refused.
func TestUpgradeIsForAdmins(t *testing.T) {
	env := newAgentEnv(t)
	u := startUpgradable(t, env, lockagentBin)
	require.NoError(t, os.Chmod(env.dir, 0o755))
	require.NoError(t, os.Chmod(env.socket, 0o666))
	r := lockagentAs(t, 65534, 65534, env.clientEnv(), "ctl", "upgrade")
	requireCode(t, 1, r, "ctl upgrade by nobody")
	require.Contains(t, r.stderr, "permission_denied")
	u.requireServing(t, u.first.Process.Pid, testVersion)
}

// runUpgrade runs `lockagent ctl upgrade` for env's agent, from any
// goroutine: it fails no test.
func runUpgrade(env *agentEnv) cliResult {
	ctx, cancel := context.WithTimeout(context.Background(), exitTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, lockagentBin, "ctl", "upgrade")
	cmd.Env = append(baseEnv(), env.clientEnv()...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Run()
	return cliResult{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}

// receiveWithin returns the next value of ch, failing the test with what
// did not happen if none comes within timeout.
func receiveWithin[T any](t *testing.T, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatal(what + ": not within " + timeout.String())
		var zero T
		return zero
	}
}

// TestStopRightAfterAnUpgrade: SIGTERM to the new process as soon as it
// answers the upgrade, while it is still taking up its 1,000 connections
// and before its agent runs: it stops cleanly, in bounded time, telling
// every client.
func TestStopRightAfterAnUpgrade(t *testing.T) {
	env := newAgentEnv(t)
	u := startUpgradable(t, env, lockagentBin)
	ld := startLoad(t, env.socket, upgradeConns)
	c := dialAgent(t, env.socket, "upgrader")
	ctx, cancel := context.WithTimeout(context.Background(), exitTimeout)
	defer cancel()
	up, err := c.Upgrade(ctx)
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(up.PID, syscall.SIGTERM))
	eventually(t, exitTimeout, "the new process exits", func() bool { return !alive(up.PID) })
	for _, cl := range ld.clients {
		waitDone(t, cl, exitTimeout)
	}
	out := u.output(t)
	require.NotContains(t, out, "panic")
	require.Contains(t, out, "stopped")
}

// TestUpgradedConnectionsEnd: a connection the new process ends is over
// for its client too. The new process once kept, until it exited, a copy
// of every descriptor it was handed: a client the agent dropped (here at
// its heartbeat) was never told, while its lock went to another.
func TestUpgradedConnectionsEnd(t *testing.T) {
	const heartbeat = 500 * time.Millisecond
	env := newAgentEnv(t)
	startUpgradable(t, env, lockagentBin)
	ctx, cancel := context.WithTimeout(context.Background(), exitTimeout)
	defer cancel()
	silent, err := client.Dial(ctx, env.socket)
	require.NoError(t, err)
	t.Cleanup(func() { silent.Close() })
	_, err = silent.Hello(ctx, client.HelloOptions{Client: "silent", Heartbeat: heartbeat})
	require.NoError(t, err)
	_, err = silent.Acquire(ctx, "upgrade/silent", client.AcquireOptions{})
	require.NoError(t, err)

	// It pings until the upgrade is over, then falls silent.
	pinging := make(chan struct{})
	go func() {
		defer close(pinging)
		for ctx.Err() == nil {
			if silent.Ping(ctx) != nil {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(heartbeat / 5):
			}
		}
	}()
	c := dialAgent(t, env.socket, "upgrader")
	up, err := c.Upgrade(ctx)
	require.NoError(t, err)
	cancel()
	<-pinging
	silentSince := time.Now()

	waitDone(t, silent, exitTimeout)
	t.Logf("the silent client's connection ended %v after its last ping, in the process that took over (pid %d)",
		time.Since(silentSince).Round(time.Millisecond), up.PID)
	other := dialAgent(t, env.socket, "other")
	var g lease
	call(t, other, "acquire", map[string]any{"name": "upgrade/silent"}, &g)
	require.True(t, g.Acquired, "the dropped connection's lock is free")
}
