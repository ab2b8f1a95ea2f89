package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConfigCheckSaysWhatTheAgentWould: config check refuses what the
// agent would refuse at start, in the agent's words: credentials without
// $CREDENTIALS_DIRECTORY, password and TLS files it cannot read; and it
// passes once they are there.
func TestConfigCheckSaysWhatTheAgentWould(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	creds := filepath.Join(e.dir, "creds")
	require.NoError(t, os.Mkdir(creds, 0o700))
	missing := filepath.Join(e.dir, "missing")
	for _, tc := range []struct {
		name, hcl string
		env       []string // besides LOCKAGENT_SOCKET
		problems  []string // each on a line of its own
	}{{
		name:     "a credential without CREDENTIALS_DIRECTORY",
		hcl:      redisCredential,
		problems: []string{`redis password_credential "redis.password": $CREDENTIALS_DIRECTORY is not set (LoadCredential= in the unit sets it)`},
	}, {
		name:     "a credential missing from CREDENTIALS_DIRECTORY",
		hcl:      redisCredential,
		env:      []string{"CREDENTIALS_DIRECTORY=" + creds},
		problems: []string{"redis password_credential: open " + filepath.Join(creds, "redis.password") + ": no such file or directory"},
	}, {
		name: "the sentinels' credential, and a CA file",
		hcl: fmt.Sprintf(`backend "redis" {
  addresses = ["127.0.0.1:1", "127.0.0.1:2"]
  master_name = "m"
  password_file = %q
  sentinel_password_credential = "sentinel.password"
  tls { ca_file = %q }
}`, missing, missing),
		problems: []string{
			"redis password_file: open " + missing + ": no such file or directory",
			`redis sentinel_password_credential "sentinel.password": $CREDENTIALS_DIRECTORY is not set`,
			"redis tls ca_file: open " + missing + ": no such file or directory",
		},
	}, {
		name:     "etcd's password file",
		hcl:      fmt.Sprintf("backend \"etcd\" {\n  endpoints = [\"127.0.0.1:1\"]\n  username = \"u\"\n  password_file = %q\n}", missing),
		problems: []string{"etcd password_file: open " + missing + ": no such file or directory"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filepath.Join(e.dir, strings.ReplaceAll(tc.name, " ", "-")+".hcl")
			require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil, "state_dir = %q\n%s\n", e.stateDir, tc.hcl), 0o600))
			env := append([]string{"LOCKAGENT_SOCKET=" + e.socket}, tc.env...)
			check := lockagent(t, env, "config", "check", "-config", cfg)
			requireCode(t, 1, check, "config check")
			require.Empty(t, check.stdout)
			require.Contains(t, check.stderr, "the agent would not start with this configuration here:\n")
			agent := lockagent(t, env, "agent", "-config", cfg)
			requireCode(t, 1, agent, "the agent")
			for _, p := range tc.problems {
				require.Contains(t, check.stderr, "\n"+p, "config check says it")
				// The agent's log quotes a one-line error.
				require.True(t, strings.Contains(agent.stderr, p) || strings.Contains(agent.stderr, strings.ReplaceAll(p, `"`, `\"`)),
					"the agent says %q:\n%s", p, agent.stderr)
			}
		})
	}

	// With the credential there, the file passes; the password is never
	// printed.
	require.NoError(t, os.WriteFile(filepath.Join(creds, "redis.password"), []byte("s3cret\n"), 0o600))
	cfg := filepath.Join(e.dir, "good.hcl")
	require.NoError(t, os.WriteFile(cfg, []byte(redisCredential), 0o600))
	r := lockagent(t, []string{"CREDENTIALS_DIRECTORY=" + creds}, "config", "check", "-config", cfg)
	requireCode(t, 0, r, "config check with the credential")
	require.NotContains(t, r.stdout+r.stderr, "s3cret")
}

// redisCredential is a Redis backend whose password is a systemd
// credential.
const redisCredential = `backend "redis" {
  addresses           = ["127.0.0.1:1"]
  password_credential = "redis.password"
}
`

// TestConfigCheckSaysWhereValuesComeFrom: values that LOCKAGENT_SOCKET
// and the flags give, over the file's, are said to be theirs, with the
// value they replace.
func TestConfigCheckSaysWhereValuesComeFrom(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.writeConfig(t, "socket {\n  path = \"/run/lockagent/agent.sock\"\n}\n")
	r := lockagent(t, nil, "config", "check", "-config", e.config)
	requireCode(t, 0, r, "config check")
	require.NotContains(t, r.stdout, "comes from", "nothing overrides the file")

	r = lockagent(t, []string{"LOCKAGENT_SOCKET=/tmp/la-e2e-env.sock"}, "config", "check", "-config", e.config)
	requireCode(t, 0, r, "config check with LOCKAGENT_SOCKET")
	require.Equal(t, []string{
		"# The effective configuration of " + e.config + ".",
		`# socket.path comes from LOCKAGENT_SOCKET; without it, it would be "/run/lockagent/agent.sock".`,
	}, strings.Split(r.stdout, "\n")[:2])
	require.Contains(t, r.stdout, `path  = "/tmp/la-e2e-env.sock"`)

	r = lockagent(t, []string{"LOCKAGENT_SOCKET=/tmp/la-e2e-env.sock"}, "config", "check", "-config", e.config,
		"-socket", "/tmp/la-e2e-flag.sock", "-log-level", "warn")
	requireCode(t, 0, r, "config check with LOCKAGENT_SOCKET, -socket and -log-level")
	require.Equal(t, []string{
		"# The effective configuration of " + e.config + ".",
		`# socket.path comes from LOCKAGENT_SOCKET; without it, it would be "/run/lockagent/agent.sock".`,
		`# socket.path comes from -socket; without it, it would be "/tmp/la-e2e-env.sock".`,
		`# log_level comes from -log-level; without it, it would be "debug".`,
	}, strings.Split(r.stdout, "\n")[:4])
	require.Contains(t, r.stdout, `path  = "/tmp/la-e2e-flag.sock"`)
	require.Regexp(t, `(?m)^log_level\s+= "warn"$`, r.stdout)
}
