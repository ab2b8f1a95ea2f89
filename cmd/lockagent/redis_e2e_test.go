package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
	"github.com/lockagent/lockagent/internal/wire"
)

// TestA1_AcrossAgents: an app on one agent holds a lock and drops; a
// waiter on another agent gets it well under 100 ms later, with a higher
// token. Then an app process holding five locks is killed with SIGKILL:
// the waiters on the other agent get them all within a second.
func TestA1_AcrossAgents(t *testing.T) {
	t.Parallel()
	f := startFleet(t, 2, redistest.Options{}, "")
	holder := f.agents[0].client(t, "holder")
	l := mustAcquire(t, holder, "fleet/a1", nil)

	waiter := f.agents[1].client(t, "waiter")
	require.False(t, tryAcquire(t, waiter, "fleet/a1", nil).Acquired)
	got := make(chan lease, 1)
	go func() {
		var w lease
		waiter.Call(t.Context(), "acquire", map[string]any{"name": "fleet/a1", "wait_ms": 10000}, &w)
		got <- w
	}()
	f.agents[1].waitQueued(t, 1)
	dropped := time.Now()
	holder.Close()
	w := <-got
	took := time.Since(dropped)
	require.True(t, w.Acquired)
	assert.Greater(t, w.Token, l.Token)
	assert.Less(t, took, 100*time.Millisecond, "the waiter on the other agent was woken by the release")
	t.Logf("A1 across agents: granted %v after the holder dropped", took)

	// An application process holding several locks through agent 0 is
	// killed with SIGKILL: apps on agent 1 waiting for each get them all.
	names := []string{"fleet/k0", "fleet/k1", "fleet/k2", "fleet/k3", "fleet/k4"}
	self, err := os.Executable()
	require.NoError(t, err)
	app := startProc(t, "holder app", append(f.agents[0].env.clientEnv(), helperEnv+"=hold"), self, names...)
	fields := strings.Fields(app.waitOutput(t, "\n", exitTimeout))
	require.Len(t, fields, 1+len(names))
	require.Equal(t, "held", fields[0])
	granted := make(chan lease, len(names))
	for _, n := range names {
		c := f.agents[1].client(t, "waiter "+n)
		go func() {
			var w lease
			c.Call(t.Context(), "acquire", map[string]any{"name": n, "wait_ms": 10000}, &w)
			granted <- w
		}()
	}
	f.agents[1].waitQueued(t, len(names))
	app.signal(t, syscall.SIGKILL)
	app.wait(t, exitTimeout)
	killed := time.Now()
	held := map[string]uint64{}
	for i, n := range names {
		tok, err := strconv.ParseUint(fields[1+i], 10, 64)
		require.NoError(t, err)
		held[n] = tok
	}
	for i := range names {
		w := receive(t, granted, fmt.Sprintf("%d of %d waiters got their lock after the kill", i, len(names)))
		require.True(t, w.Acquired, "%+v", w)
		assert.Greater(t, w.Token, held[w.Name], "%s: the token of a later grant", w.Name)
	}
	allIn := time.Since(killed)
	assert.Less(t, allIn, releaseBound, "all granted soon after the kill")
	t.Logf("A1 across agents, kill -9: the %d waiters on the other agent had their locks %v after the kill", len(names), allIn)
}

// TestWaitReplicasConfig: backend "redis" { wait_replicas } reaches the
// backend: on a server without replicas, an acquire fails as unavailable,
// saying why, and leaves the name free.
func TestWaitReplicasConfig(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	a := opsAgent(t, fmt.Sprintf("  addresses = [%q]\n  wait_replicas = 1\n  wait_timeout = \"20ms\"", srv.Addr()))
	c := a.client(t, "wait")
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	err := c.Call(ctx, "acquire", map[string]any{"name": "w/1"}, nil)
	var se *client.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "backend_unavailable", se.Code)
	assert.Contains(t, se.Message, "reached 0 of 1 replicas")
	assert.Zero(t, srv.Client(t).Exists(ctx, lockKey("w/1")).Val(), "the grant was given back")
}

// TestWaiterThroughARedisRestart: an app waits for a name held on another
// agent while Redis is down for two seconds (a restart, with its data
// kept): the wait goes on, asking again, and the app gets the name once
// the holder lets it go, as if Redis had never been away.
func TestWaiterThroughARedisRestart(t *testing.T) {
	t.Parallel()
	f := startFleet(t, 2, redistest.Options{Persistence: true}, "")
	holder := f.agents[0].client(t, "holder")
	waiter := f.agents[1].client(t, "waiter")
	held := mustAcquire(t, holder, "restart/x", nil)
	got := make(chan grab, 1)
	go func() {
		var l lease
		err := waiter.Call(t.Context(), "acquire", map[string]any{"name": "restart/x", "wait_ms": -1}, &l)
		got <- grab{l, time.Now(), err}
	}()
	rc := f.redis.Client(t)
	eventually(t, callTimeout, "the waiter is queued", func() bool {
		return rc.Exists(t.Context(), lockKey("restart/x")+":q").Val() == 1
	})

	f.redis.Kill()
	time.Sleep(2 * time.Second) // the outage
	f.redis.Restart(t)
	restarted := time.Now()
	select {
	case g := <-got:
		t.Fatalf("the wait ended with the outage: %+v", g)
	default:
	}
	opsRelease(t, holder, held.Lease)
	g := receive(t, got, "the waiter did not get restart/x")
	require.NoError(t, g.err)
	require.True(t, g.l.Acquired)
	assert.Greater(t, g.l.Token, held.Token)
	t.Logf("Redis down 2s with a waiter queued: it got the name %s after the restart", msString(g.at.Sub(restarted)))
}

// TestStatusWhileRedisIsDown: with no lease to renew, an agent whose
// Redis is down says so in ctl status (the last call that failed, and
// when), and stops saying it once a call reaches Redis again.
func TestStatusWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	a := opsAgent(t, fmt.Sprintf("  addresses = [%q]", srv.Addr()))
	app := a.client(t, "status-app")
	status := func() (string, wire.StatusResult) {
		r := lockagent(t, a.env.clientEnv(), "ctl", "status")
		requireCode(t, 0, r, "ctl status")
		rj := lockagent(t, a.env.clientEnv(), "ctl", "status", "-json")
		requireCode(t, 0, rj, "ctl status -json")
		var st wire.StatusResult
		require.NoError(t, json.Unmarshal([]byte(rj.stdout), &st), rj.stdout)
		return r.stdout, st
	}
	text, st := status()
	assert.NotContains(t, text, "backend error")
	assert.Empty(t, st.BackendError)

	srv.Kill()
	err := app.Call(t.Context(), "acquire", map[string]any{"name": "status/x"}, nil)
	var se *client.Error
	require.ErrorAs(t, err, &se)
	require.Equal(t, "backend_unavailable", se.Code)
	text, st = status()
	assert.Regexp(t, `(?m)^backend: +redis \(ok\)\nbackend error: +\d+s ago: .*unavailable`, text, "renewals are fine: there are none")
	assert.Contains(t, st.BackendError, "unavailable")
	assert.Positive(t, st.BackendErrorAgoMs)

	srv.Restart(t)
	acquireSoon(t, app, "status/x", callTimeout)
	// The error is told until a call reaches Redis 5 s after the last
	// failure: the agent's own calls, from the next acquire on.
	eventually(t, 10*time.Second, "the backend error cleared", func() bool {
		opsRelease(t, app, mustAcquire(t, app, "status/y", nil).Lease)
		text, st = status() // a renewal may clear it between the two calls
		return st.BackendError == "" && !strings.Contains(text, "backend error")
	})
}

// TestWaiterAfterItsSubscriptionDied (redis.md section 7, case 23): the
// connection on which an agent hears of releases is killed while its app
// waits, and the lock released at once, while the agent subscribes again:
// the waiter gets the lock within milliseconds all the same (told by the
// channel, or woken to ask again when the subscription is back), not at
// its next poll, a second later.
func TestWaiterAfterItsSubscriptionDied(t *testing.T) {
	t.Parallel()
	f := startFleet(t, 2, redistest.Options{}, "")
	rc := f.redis.Client(t)
	ctx := t.Context()
	holder := f.agents[0].client(t, "holder")
	waiter := f.agents[1].client(t, "waiter")
	channel := func(name string) string { return lockKey(name) + ":c" }
	subscribed := func(name string) bool {
		n, err := rc.PubSubNumSub(ctx, channel(name)).Result()
		return err == nil && n[channel(name)] > 0
	}
	handover := func(name string, kill bool) time.Duration {
		t.Helper()
		mustAcquire(t, holder, name, nil)
		got := make(chan lease, 1)
		go func() {
			var w lease
			waiter.Call(ctx, "acquire", map[string]any{"name": name, "wait_ms": 10000}, &w)
			got <- w
		}()
		eventually(t, 5*time.Second, "the waiter's agent subscribed", func() bool { return subscribed(name) })
		if kill {
			require.NoError(t, rc.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err())
		}
		released := time.Now()
		holder.Close()
		holder = f.agents[0].client(t, "holder")
		w := receive(t, got, fmt.Sprintf("%s: the waiter did not get the lock", name))
		require.True(t, w.Acquired, name)
		opsRelease(t, waiter, w.Lease)
		return time.Since(released)
	}
	killed := handover("sub/killed", true)
	assert.Less(t, killed, 500*time.Millisecond, "woken when subscribed again, before its poll")
	again := handover("sub/again", false)
	assert.Less(t, again, 200*time.Millisecond, "subscribed again, the release is heard")
	t.Logf("subscription killed: the waiter got the lock %s after the release; subscribed again: %s", msString(killed), msString(again))
}

// TestStopDuringStartup: a SIGTERM while the agent waits for its Redis
// (here, a server that accepts and never answers) stops it cleanly: exit
// 0 within a Redis read's timeout, its socket removed.
func TestStopDuringStartup(t *testing.T) {
	t.Parallel()
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer mute.Close()
	go func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	e := newAgentEnv(t)
	e.writeConfig(t, fmt.Sprintf("backend \"redis\" {\n  addresses = [%q]\n}\n", mute.Addr().String()))
	p := e.spawn(t)
	eventually(t, exitTimeout, "the agent binds its socket", func() bool {
		_, err := os.Stat(e.socket)
		return err == nil
	})
	p.signal(t, syscall.SIGTERM)
	stopped := time.Now()
	require.Equal(t, 0, p.wait(t, exitTimeout), "exit status; stderr:\n%s", p.stderr)
	// A read from Redis in flight ends at its timeout (3 s), not at once.
	require.Less(t, time.Since(stopped), 5*time.Second, "stopped within a read's timeout, not after the backend's (10 s)")
	require.Contains(t, p.stderr.String(), "stopped during start-up")
	_, err = os.Stat(e.socket)
	require.ErrorIs(t, err, os.ErrNotExist, "socket removed")
}
