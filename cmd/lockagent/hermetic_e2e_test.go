package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/testkit"
)

// TestHarnessIgnoresTheUsersEnvironment: a user who follows the README has
// an agent running, LOCKAGENT_SOCKET exported and maybe XDG_RUNTIME_DIR
// set; a test run from a systemd unit also has NOTIFY_SOCKET and
// CREDENTIALS_DIRECTORY. The agents and client commands that the tests
// start see none of it: an agent started with its socket in
// LOCKAGENT_SOCKET serves there, a client command given no socket does not
// reach the user's agent, and nothing reaches the user's systemd. Not
// parallel: it sets the test process's environment.
func TestHarnessIgnoresTheUsersEnvironment(t *testing.T) {
	testkit.SkipShort(t, "the lockagent binary")
	users, err := os.MkdirTemp("", "la")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(users) })
	// The user's agents: sockets that accept connections, which an agent
	// takes for a live agent's and a client would hang on. Nothing accepts:
	// a connection made stays queued for the check at the end.
	live := func(path string) *net.UnixListener {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		require.NoError(t, err)
		t.Cleanup(func() { l.Close() })
		return l
	}
	require.NoError(t, os.Mkdir(filepath.Join(users, "runtime"), 0o700))
	exported := live(filepath.Join(users, "lockagent.sock"))
	runtimeDir := live(filepath.Join(users, "runtime", "lockagent.sock"))
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(users, "notify"), Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { notify.Close() })
	require.NoError(t, os.WriteFile(filepath.Join(users, "redis-password"), []byte("users-secret\n"), 0o600))
	t.Setenv("LOCKAGENT_SOCKET", exported.Addr().String())
	t.Setenv("XDG_RUNTIME_DIR", filepath.Dir(runtimeDir.Addr().String()))
	t.Setenv("HOME", users)
	t.Setenv("XDG_STATE_HOME", users)
	t.Setenv("NOTIFY_SOCKET", notify.LocalAddr().String())
	t.Setenv("CREDENTIALS_DIRECTORY", users)

	e := newAgentEnv(t)
	e.socketViaEnv = true
	a := e.start(t)
	requireCode(t, 0, lockagent(t, e.clientEnv(), "ctl", "status"), "ctl status of the test's agent")
	stopAgent(t, a)

	r := lockagent(t, nil, "ctl", "status")
	requireCode(t, 1, r, "ctl status with no socket given")
	require.Contains(t, r.stderr, "cannot reach the agent")
	require.NotContains(t, r.stderr, users)

	r = lockagent(t, nil, "config", "check")
	requireCode(t, 0, r, "config check of the defaults")
	require.NotContains(t, r.stdout, users)

	e.writeConfig(t, "backend \"redis\" {\n  addresses = [\"127.0.0.1:1\"]\n  password_credential = \"redis-password\"\n}\n")
	r = lockagent(t, nil, "agent", "-config", e.config, "-socket", e.socket)
	requireCode(t, 1, r, "an agent whose password is a systemd credential")
	require.Contains(t, r.stderr, "$CREDENTIALS_DIRECTORY is not set")

	// What reached the user's sockets would be queued there by now: every
	// process has exited.
	for _, l := range []*net.UnixListener{exported, runtimeDir} {
		require.NoError(t, l.SetDeadline(time.Now().Add(50*time.Millisecond)))
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, "a connection to the user's agent at %s", l.Addr())
	}
	require.NoError(t, notify.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	msg := make([]byte, 4096)
	n, _, err := notify.ReadFrom(msg)
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "the user's systemd was told %q", msg[:n])
}
