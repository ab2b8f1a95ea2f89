package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/testkit"
)

// lockagentAs runs the binary like lockagent, as uid and gid (no other
// groups). The binary's directory is opened to every uid for it.
func lockagentAs(t *testing.T, uid, gid uint32, extraEnv []string, args ...string) cliResult {
	t.Helper()
	testkit.SkipShort(t, "the lockagent binary")
	require.NoError(t, os.Chmod(filepath.Dir(lockagentBin), 0o755))
	ctx, cancel := context.WithTimeout(context.Background(), exitTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, lockagentBin, args...)
	cmd.Env = append(baseEnv(), extraEnv...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 2 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "lockagent %q did not finish in time; stderr:\n%s", args, stderr.String())
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		require.NoError(t, err, "lockagent %q", args)
	}
	return cliResult{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}

var groupSeq atomic.Int32

// testGroup adds a group listing the user daemon (uid 1) for the test's
// length, and returns its name: membership that only the group database
// knows of. No user is created.
func testGroup(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("lae%d-%d", os.Getpid()%1000000, groupSeq.Add(1))
	if out, err := exec.Command("groupadd", "-U", "daemon", name).CombinedOutput(); err != nil {
		t.Fatalf("groupadd: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("groupdel", name).CombinedOutput(); err != nil {
			t.Errorf("groupdel: %v: %s", err, out)
		}
	})
	return name
}

// TestACLEndToEnd: the acl block of the config file, enforced on the
// client commands of other uids; admin groups by membership; audit lines;
// rules reloaded on SIGHUP.
func TestACLEndToEnd(t *testing.T) {
	t.Parallel()
	admins := testGroup(t)
	e := newAgentEnv(t)
	require.NoError(t, os.Chmod(e.dir, 0o755))
	acl := func(uid int) string {
		return fmt.Sprintf("socket {\n  mode = \"0666\"\n}\nacl {\n  admin_uids   = []\n  admin_groups = [%q]\n  rule \"jobs/*\" {\n    uids  = [%d]\n    modes = [\"exclusive\"]\n  }\n}\n", admins, uid)
	}
	e.writeConfig(t, acl(4242))
	r := lockagent(t, nil, "config", "check", "-config", e.config)
	requireCode(t, 0, r, "config check")
	a := e.start(t)
	env := e.clientEnv()

	requireCode(t, 0, lockagentAs(t, 4242, 4242, env, "run", "jobs/1", "--", "true"), "run by the uid the rule names")
	r = lockagentAs(t, 4242, 4242, env, "run", "-shared", "jobs/1", "--", "true")
	requireCode(t, 77, r, "run -shared, a mode the rule does not allow")
	require.Contains(t, r.stderr, "permission_denied")
	r = lockagentAs(t, 4243, 4243, env, "run", "jobs/1", "--", "true")
	requireCode(t, 77, r, "run by another uid")
	require.Contains(t, r.stderr, "permission_denied")
	require.Contains(t, r.stderr, "jobs/1")
	require.NotContains(t, r.stderr, "jobs/*", "the error never shows the rules")

	r = lockagentAs(t, 4243, 4243, env, "ctl", "list", "-all")
	requireCode(t, 1, r, "ctl list -all by a non-admin")
	require.Contains(t, r.stderr, "permission_denied")
	r = lockagent(t, env, "ctl", "list", "-all")
	requireCode(t, 1, r, "ctl list -all by root, not an admin once admin_uids is set")
	requireCode(t, 0, lockagentAs(t, 1, 1, env, "ctl", "list", "-all"), "ctl list -all by a member of the admin group")
	requireCode(t, 0, lockagentAs(t, 1, 1, env, "ctl", "break", "jobs/2"), "ctl break by a member of the admin group")
	eventually(t, exitTimeout, "audit lines", func() bool {
		s := a.stderr.String()
		return strings.Contains(s, `agent.audit: admin action: action="list -all" uid=1 gid=1`) &&
			strings.Contains(s, "agent.audit: admin action: action=break uid=1 gid=1") && strings.Contains(s, "name=jobs/2 broken=0")
	})
	require.Equal(t, 2, strings.Count(a.stderr.String(), "admin action"), "only the actions done are audited")

	e.writeConfig(t, acl(4243))
	a.signal(t, syscall.SIGHUP)
	eventually(t, exitTimeout, "reload", func() bool { return strings.Contains(a.stderr.String(), "acl_rules=1") })
	requireCode(t, 0, lockagentAs(t, 4243, 4243, env, "run", "jobs/1", "--", "true"), "run by the uid the reloaded rule names")
	requireCode(t, 77, lockagentAs(t, 4242, 4242, env, "run", "jobs/1", "--", "true"), "run by the uid the rule no longer names")
	stopAgent(t, a)
}
