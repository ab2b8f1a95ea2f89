package agentbin

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEnvIgnoresTheUsersSetup: what a user may have exported, as the
// README has them export LOCKAGENT_SOCKET, and what systemd gives a
// service never reaches the processes a test starts.
func TestEnvIgnoresTheUsersSetup(t *testing.T) {
	hostile := map[string]string{
		"LOCKAGENT_SOCKET":      "/tmp/users-agent.sock",
		"LOCKAGENT_TOKEN":       "7",
		"XDG_RUNTIME_DIR":       "/run/user/1000",
		"XDG_STATE_HOME":        "/home/u/.local/state",
		"HOME":                  "/home/u",
		"NOTIFY_SOCKET":         "/run/systemd/notify",
		"WATCHDOG_USEC":         "1000000",
		"WATCHDOG_PID":          "1",
		"LISTEN_FDS":            "1",
		"LISTEN_PID":            "1",
		"LISTEN_FDNAMES":        "lockagent.socket",
		"INVOCATION_ID":         "1f2e",
		"JOURNAL_STREAM":        "8:1234",
		"CREDENTIALS_DIRECTORY": "/run/credentials/lockagent.service",
		"GORACE":                "halt_on_error=1",
		"LA_UNRELATED":          "kept",
	}
	for k, v := range hostile {
		t.Setenv(k, v)
	}
	got := map[string][]string{}
	for _, kv := range Env("/tmp/la-home", "LOCKAGENT_SOCKET=/tmp/la-home/s") {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = append(got[k], v)
	}
	var passed []string
	for k := range hostile {
		switch k {
		case "LOCKAGENT_SOCKET":
			require.Equal(t, []string{"/tmp/la-home/s"}, got[k], "only the caller's %s", k)
		case "HOME", "XDG_RUNTIME_DIR":
			require.Equal(t, []string{"/tmp/la-home"}, got[k], k)
		case "GORACE":
			require.Equal(t, []string{"halt_on_error=1 atexit_sleep_ms=0"}, got[k], k)
		case "LA_UNRELATED":
			require.Equal(t, []string{"kept"}, got[k], k)
		default:
			if _, ok := got[k]; ok {
				passed = append(passed, k)
			}
		}
	}
	require.Empty(t, passed, "passed on")
}
