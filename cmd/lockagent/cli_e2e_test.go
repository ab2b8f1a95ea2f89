package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/testkit"
)

// TestHelpAtEveryLevel: -h, and help, at every level of the command line
// print that level's usage on stdout and exit 0; a command's synopsis
// names each of its flags, and the top level's names every command.
func TestHelpAtEveryLevel(t *testing.T) {
	t.Parallel()
	noAgent := []string{"LOCKAGENT_SOCKET=/nonexistent/lockagent-e2e.sock"}
	levels := map[string][][]string{
		"":             {{"-h"}, {"-help"}, {"--help"}, {"help"}},
		"ctl":          {{"ctl", "-h"}, {"ctl", "help"}, {"help", "ctl"}},
		"run":          {{"run", "-h"}, {"run", "--help"}, {"run", "help"}, {"help", "run"}},
		"config":       {{"config", "-h"}, {"config", "help"}, {"help", "config"}},
		"config check": {{"config", "check", "-h"}, {"config", "check", "help"}, {"config", "help", "check"}, {"help", "config", "check"}},
		"agent":        {{"agent", "-h"}, {"agent", "help"}, {"help", "agent"}},
		"version":      {{"version", "-h"}, {"version", "help"}, {"help", "version"}},
	}
	for _, sub := range []string{"list", "inspect", "break", "status", "upgrade"} {
		levels["ctl "+sub] = [][]string{{"ctl", sub, "-h"}, {"ctl", sub, "help"}, {"ctl", "help", sub}, {"help", "ctl", sub}}
	}
	for level, forms := range levels {
		var first string
		for _, args := range forms {
			r := lockagent(t, noAgent, args...)
			what := fmt.Sprintf("lockagent %q", args)
			requireCode(t, 0, r, what)
			require.Empty(t, r.stderr, what)
			synopsis := level
			if level == "" {
				synopsis = "<command>"
			}
			want := `^usage: lockagent ` + regexp.QuoteMeta(synopsis) + `[ \n]`
			require.Regexp(t, want, r.stdout, "%s prints %q's usage", what, level)
			if first == "" {
				first = r.stdout
			}
			require.Equal(t, first, r.stdout, "%s prints what %q does", what, forms[0])
		}
		// The synopsis, the lines before the first blank one, names
		// every flag of the section "flags:".
		synopsis, _, _ := strings.Cut(first, "\n\n")
		_, flags, _ := strings.Cut(first, "\nflags:\n")
		for _, m := range regexp.MustCompile(`(?m)^  (-[a-z-]+)`).FindAllStringSubmatch(flags, -1) {
			require.Regexp(t, `[\[ ]`+regexp.QuoteMeta(m[1])+`[\] ]`, synopsis, "the synopsis of %q names its flag %s", level, m[1])
		}
	}
	top := lockagent(t, noAgent, "help").stdout
	for level := range levels {
		require.Contains(t, top, "\n  "+level, "the top usage lists %q", level)
	}
}

// TestRunFlagsAfterName: run's flags may follow NAME, as ctl's do; what
// follows -- is the command's, flags included.
func TestRunFlagsAfterName(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.start(t)
	env := e.clientEnv()

	r := lockagent(t, env, "run", "flags/1", "-ttl", "2s", "-grace", "1s", "--", "sh", "-c", `echo "$LOCKAGENT_NAME"`)
	requireCode(t, 0, r, "run NAME -ttl 2s -grace 1s -- CMD")
	require.Equal(t, "flags/1\n", r.stdout)

	// -wait after the name applies: the lock is held, run gives up.
	holder := dialAgent(t, e.socket, "e2e-holder")
	mustAcquire(t, holder, "flags/2", nil)
	r = lockagent(t, env, "run", "flags/2", "-wait", "100ms", "--", "echo", "ran")
	requireCode(t, exitTempFail, r, "run NAME -wait 100ms -- CMD of a held lock")
	require.Empty(t, r.stdout)

	r = lockagent(t, env, "run", "flags/3", "--", "sh", "-c", `echo "$@"`, "sh", "-wait", "1s")
	requireCode(t, 0, r, "run NAME -- CMD -wait 1s")
	require.Equal(t, "-wait 1s\n", r.stdout, "the flags after -- are the command's")
}

// TestRunRefusedName: a name the agent's access rules refuse to run's user
// (permission_denied) ends run with status 77, for a lock and for -elect,
// apart from an agent it cannot reach (1) and a malformed name (2).
func TestRunRefusedName(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.writeConfig(t, "acl {\n  rule \"ok/*\" {}\n}\n")
	e.start(t)
	env := e.clientEnv()

	requireCode(t, 0, lockagent(t, env, "run", "ok/1", "--", "true"), "run of an allowed name")
	for _, args := range [][]string{
		{"run", "no/1", "--", "echo", "ran"},
		{"run", "-wait", "1s", "no/1", "--", "echo", "ran"},
		{"run", "-elect", "no/1", "--", "echo", "ran"},
	} {
		r := lockagent(t, env, args...)
		requireCode(t, exitNoPerm, r, fmt.Sprintf("lockagent %q", args))
		require.Contains(t, r.stderr, "permission_denied")
		require.Empty(t, r.stdout, "the command must not run")
	}
	r := lockagent(t, []string{"LOCKAGENT_SOCKET=/nonexistent/lockagent-e2e.sock"}, "run", "no/1", "--", "true")
	requireCode(t, 1, r, "run without an agent")
}

// TestRunMuteAgent: run gives up on a socket that accepts the connection
// and answers nothing after the hello timeout, 5 s, with status 1, as the
// README says.
func TestRunMuteAgent(t *testing.T) {
	t.Parallel()
	testkit.SkipShort(t, "the lockagent binary")
	dir, err := os.MkdirTemp("", "la")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	mute := filepath.Join(dir, "mute")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: mute, Net: "unix"})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // open and mute until the test ends
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	start := time.Now()
	r := lockagent(t, nil, "run", "-socket", mute, "mute/1", "--", "echo", "ran")
	took := time.Since(start)
	requireCode(t, 1, r, "run on a mute socket")
	require.Contains(t, r.stderr, "accepted the connection but did not answer in 5s")
	require.Empty(t, r.stdout)
	require.GreaterOrEqual(t, took, helloTimeout)
	require.Less(t, took, helloTimeout+3*time.Second, "run gives up after the hello timeout, not the 30 s of connectTimeout")
}
