package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockagent/lockagent/internal/testkit/etcdtest"
)

// etcdAgent starts an agent on etcd with the backend block's body.
func etcdAgent(t *testing.T, body string) *fleetAgent {
	t.Helper()
	a := &fleetAgent{env: newAgentEnv(t)}
	a.env.writeConfig(t, fmt.Sprintf("backend \"etcd\" {\n%s\n  key_prefix = \"e2e\"\n}\n", body))
	a.start(t)
	return a
}

// TestEtcdAcrossAgents: two agents on a three-member etcd. A waiter on
// one is woken by the release of a holder on the other, with a higher
// token; the leader is killed with SIGKILL while a lock is held, and
// the lease lives on through the election: no lost event, and the
// release after it succeeds.
func TestEtcdAcrossAgents(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	body := fmt.Sprintf("  endpoints = [%s]", quoteList(c.Endpoints()))
	a0, a1 := etcdAgent(t, body), etcdAgent(t, body)

	holder := a0.client(t, "holder")
	l := mustAcquire(t, holder, "etcd/a1", map[string]any{"ttl_ms": 5000})
	waiter := a1.client(t, "waiter")
	got := make(chan lease, 1)
	go func() {
		var w lease
		waiter.Call(t.Context(), "acquire", map[string]any{"name": "etcd/a1", "wait_ms": 10000}, &w)
		got <- w
	}()
	a1.waitQueued(t, 1)
	dropped := time.Now()
	holder.Close()
	w := receive(t, got, "the waiter's grant")
	require.True(t, w.Acquired)
	assert.Greater(t, w.Token, l.Token)
	took := time.Since(dropped)
	assert.Less(t, took, time.Second, "the waiter on the other agent was woken by the release")
	t.Logf("etcd across agents: granted %v after the holder dropped", took)

	// The leader dies while the waiter, now the holder, holds: renewals
	// go on through the election.
	leader := c.Leader(t)
	c.Member(leader).Kill()
	time.Sleep(3 * time.Second) // more than half the TTL: renewals must go through
	var rel struct {
		Released bool `json:"released"`
	}
	call(t, waiter, "release", map[string]any{"lease": w.Lease}, &rel)
	assert.True(t, rel.Released, "the lease outlived the leader")
	other := a0.client(t, "after")
	l2 := mustAcquire(t, other, "etcd/a1", nil)
	assert.Greater(t, l2.Token, w.Token, "tokens go on increasing after the leader's death")
}

// TestEtcdAuth: with etcd's authentication on, an agent given the user
// and a password file locks; one given a wrong password does not start,
// and says why.
func TestEtcdAuth(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := t.Context()
	for _, step := range []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "locks"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "locks", "e2e/", clientv3.GetPrefixRangeEnd("e2e/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, "lockagent", "s3cret"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "lockagent", "locks"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		require.NoError(t, step())
	}
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(good, []byte("s3cret\n"), 0o600))
	require.NoError(t, os.WriteFile(bad, []byte("wrong\n"), 0o600))
	body := fmt.Sprintf("  endpoints = [%q]\n  username = \"lockagent\"\n", c.Endpoints()[0])

	a := etcdAgent(t, body+fmt.Sprintf("  password_file = %q", good))
	l := mustAcquire(t, a.client(t, "app"), "auth/1", nil)
	assert.Positive(t, l.Token)

	e := newAgentEnv(t)
	e.writeConfig(t, fmt.Sprintf("backend \"etcd\" {\n%s  password_file = %q\n  key_prefix = \"e2e\"\n}\n", body, bad))
	p := e.spawn(t)
	assert.NotEqual(t, 0, p.wait(t, exitTimeout), "an agent with a wrong password")
	assert.Contains(t, strings.ToLower(p.stderr.String()), "authentication failed")
}

// quoteList renders strings as the items of an HCL list.
func quoteList(items []string) string {
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}
