package socketapi_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitingCount is how many acquires wait on the agent, from list -all.
func waitingCount(t *testing.T, r *raw) int {
	t.Helper()
	n := 0
	for _, s := range r.ok(`{"op":"list","all":true}`)["sessions"].([]any) {
		n += len(s.(map[string]any)["waiting"].([]any))
	}
	return n
}

func TestWaitTimeout(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	a.ok(`{"id":1,"op":"acquire","name":"w"}`)
	start := time.Now()
	m := b.ok(`{"id":1,"op":"acquire","name":"w","wait_ms":100}`)
	assert.Equal(t, false, m["acquired"])
	assert.Equal(t, "timeout", m["reason"])
	assert.Len(t, m["holders"], 1)
	assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)
}

func TestWaitGrantedOnRelease(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	m := a.ok(`{"id":1,"op":"acquire","name":"w"}`)
	b.send(`{"id":7,"op":"acquire","name":"w","wait_ms":-1}`)
	require.Eventually(t, func() bool { return waitingCount(t, a) == 1 }, 2*time.Second, time.Millisecond)
	a.ok(fmt.Sprintf(`{"id":2,"op":"release","lease":%q}`, m["lease"]))
	g := b.recv()
	assert.EqualValues(t, 7, g["id"])
	assert.Equal(t, true, g["acquired"])
}

// TestResponsesOutOfOrder: a blocking acquire never delays a later request.
func TestResponsesOutOfOrder(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	m := a.ok(`{"id":1,"op":"acquire","name":"o"}`)
	b.send(`{"id":"slow","op":"acquire","name":"o","wait_ms":-1}`)
	b.send(`{"id":"fast","op":"ping"}`)
	assert.Equal(t, "fast", b.recv()["id"])
	a.ok(fmt.Sprintf(`{"id":2,"op":"release","lease":%q}`, m["lease"]))
	assert.Equal(t, "slow", b.recv()["id"])
}

func TestCancel(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	a.ok(`{"id":1,"op":"acquire","name":"c"}`)
	b.send(`{"id":"w","op":"acquire","name":"c","wait_ms":-1}`)
	require.Eventually(t, func() bool { return waitingCount(t, a) == 1 }, 2*time.Second, time.Millisecond)
	b.send(`{"id":"x","op":"cancel","target":"w"}`)
	got := map[any]map[string]any{}
	for i := 0; i < 2; i++ {
		m := b.recv()
		got[m["id"]] = m
	}
	assert.Equal(t, true, got["x"]["canceled"])
	requireCode(t, got["w"], "canceled")
	assert.Equal(t, 0, waitingCount(t, a))

	assert.Equal(t, false, b.ok(`{"id":"y","op":"cancel","target":"w"}`)["canceled"], "finished target")
	assert.Equal(t, false, b.ok(`{"id":"y","op":"cancel","target":12}`)["canceled"], "unknown target")
	assert.Equal(t, false, b.ok(`{"id":"y","op":"cancel"}`)["canceled"], "no target")
	b.fail(`{"id":"y","op":"cancel","target":{"a":1}}`, "invalid_argument")
}

// TestCancelRacingAGrant: a cancel sent as the name is released races the
// grant of the acquire it targets; whichever wins, the two answers agree:
// canceled true when the acquire was answered canceled, false when it was
// granted (its lease is then held, and the client must know it).
func TestCancelRacingAGrant(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	outcomes := map[string]int{}
	for range 500 {
		// The last round's canceled waiter leaves the queue in the
		// background: the holder waits for it rather than try.
		l := a.ok(`{"id":1,"op":"acquire","name":"r","wait_ms":5000}`)
		require.Equal(t, true, l["acquired"])
		b.send(`{"id":"w","op":"acquire","name":"r","wait_ms":-1}`)
		require.Eventually(t, func() bool { return waitingCount(t, a) == 1 }, 2*time.Second, time.Millisecond)
		a.send(fmt.Sprintf(`{"id":2,"op":"release","lease":%q}`, l["lease"]))
		b.send(`{"id":"c","op":"cancel","target":"w"}`)
		got := map[any]map[string]any{}
		for range 2 {
			m := b.recv()
			got[m["id"]] = m
		}
		a.recv() // the release's answer
		acq, canceled := got["w"], got["c"]["canceled"]
		if acq["acquired"] == true {
			outcomes["granted"]++
			require.Equal(t, false, canceled, "cancel of an acquire answered with a grant")
			b.ok(fmt.Sprintf(`{"id":3,"op":"release","lease":%q}`, acq["lease"]))
			continue
		}
		outcomes["canceled"]++
		requireCode(t, acq, "canceled")
		require.Equal(t, true, canceled, "cancel of an acquire answered canceled")
	}
	t.Logf("outcomes: %v", outcomes)
}

func TestPendingIDInUse(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	a.ok(`{"id":1,"op":"acquire","name":"p"}`)
	b.send(`{"id":5,"op":"acquire","name":"p","wait_ms":-1}`)
	require.Eventually(t, func() bool { return waitingCount(t, a) == 1 }, 2*time.Second, time.Millisecond)
	b.fail(`{"id":5,"op":"acquire","name":"q","wait_ms":-1}`, "invalid_argument")
	b.fail(`{"id":6,"op":"acquire","name":"p","wait_ms":-1}`, "invalid_argument") // same name pending
}

// TestFIFO: waiters are served in arrival order; a try never jumps the queue.
func TestFIFO(t *testing.T) {
	ta := startAgent(t)
	holder := ta.raw(t)
	m := holder.ok(`{"id":1,"op":"acquire","name":"f"}`)
	const n = 5
	var waiters []*raw
	for i := 0; i < n; i++ {
		w := ta.raw(t)
		w.send(fmt.Sprintf(`{"id":%d,"op":"acquire","name":"f","wait_ms":-1}`, i))
		require.Eventually(t, func() bool { return waitingCount(t, holder) == i+1 }, 2*time.Second, time.Millisecond)
		waiters = append(waiters, w)
	}
	lease := m["lease"]
	for i, w := range waiters {
		holder.ok(fmt.Sprintf(`{"op":"release","lease":%q}`, lease))
		if i == 0 {
			// The name is free for a moment, but a try must not jump ahead.
			assert.Equal(t, false, ta.raw(t).ok(`{"op":"acquire","name":"f"}`)["acquired"])
		}
		g := w.recv()
		require.EqualValues(t, i, g["id"])
		require.Equal(t, true, g["acquired"])
		lease = g["lease"]
		holder = w
	}
}

// TestSharedWaitersTogether: shared waiters at the head are granted
// together; a shared request behind a waiting exclusive one queues.
func TestSharedWaitersTogether(t *testing.T) {
	ta := startAgent(t)
	holder := ta.raw(t)
	m := holder.ok(`{"id":1,"op":"acquire","name":"rw"}`)
	s1, s2, x, s3 := ta.raw(t), ta.raw(t), ta.raw(t), ta.raw(t)
	for i, w := range []struct {
		r    *raw
		mode string
	}{{s1, "shared"}, {s2, "shared"}, {x, "exclusive"}, {s3, "shared"}} {
		w.r.send(fmt.Sprintf(`{"id":1,"op":"acquire","name":"rw","mode":%q,"wait_ms":-1}`, w.mode))
		require.Eventually(t, func() bool { return waitingCount(t, holder) == i+1 }, 2*time.Second, time.Millisecond)
	}
	holder.ok(fmt.Sprintf(`{"op":"release","lease":%q}`, m["lease"]))
	g1, g2 := s1.recv(), s2.recv()
	assert.Equal(t, true, g1["acquired"])
	assert.Equal(t, true, g2["acquired"])
	assert.Equal(t, 2, waitingCount(t, holder), "the exclusive waiter and the shared one behind it still wait")
	s1.ok(fmt.Sprintf(`{"op":"release","lease":%q}`, g1["lease"]))
	s2.ok(fmt.Sprintf(`{"op":"release","lease":%q}`, g2["lease"]))
	gx := x.recv()
	assert.Equal(t, true, gx["acquired"])
	x.ok(fmt.Sprintf(`{"op":"release","lease":%q}`, gx["lease"]))
	assert.Equal(t, true, s3.recv()["acquired"])
}

func TestWaiterLeavesWithItsConnection(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	a.ok(`{"id":1,"op":"acquire","name":"g"}`)
	b.send(`{"id":1,"op":"acquire","name":"g","wait_ms":-1}`)
	require.Eventually(t, func() bool { return waitingCount(t, a) == 1 }, 2*time.Second, time.Millisecond)
	b.nc.Close()
	require.Eventually(t, func() bool { return waitingCount(t, a) == 0 }, 2*time.Second, time.Millisecond)
}

func TestBackendUnavailableOnTheWire(t *testing.T) {
	ta := startAgent(t)
	r := ta.raw(t)
	r.ok(`{"op":"ping"}`)
	require.NoError(t, ta.backend.Close())
	r.fail(`{"op":"acquire","name":"u"}`, "backend_unavailable")
	r.fail(`{"op":"inspect","name":"u"}`, "backend_unavailable")
}

// TestWaitingAcquiresKeepTheirOrder: requests of one name sent in one
// write, after a waiting acquire, come after it: the acquire read first
// waits, and the later acquire and campaign of its name are the ones
// refused as in progress, every time.
func TestWaitingAcquiresKeepTheirOrder(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	a.ok(`{"id":1,"op":"acquire","name":"ord"}`)
	for i := range 50 {
		w := fmt.Sprintf(`{"id":"w%d","op":"acquire","name":"ord","wait_ms":-1}`, i)
		w2 := fmt.Sprintf(`{"id":"w2-%d","op":"acquire","name":"ord","wait_ms":-1}`, i)
		c := fmt.Sprintf(`{"id":"c%d","op":"campaign","name":"ord"}`, i)
		_, err := b.nc.Write([]byte(w + "\n" + w2 + "\n" + c + "\n"))
		require.NoError(t, err)
		refused := map[any]bool{}
		for range 2 { // a waiting acquire's answer may come out of order
			m := b.recv()
			requireCode(t, m, "invalid_argument")
			refused[m["id"]] = true
		}
		require.Equal(t, map[any]bool{fmt.Sprintf("w2-%d", i): true, fmt.Sprintf("c%d", i): true}, refused, "round %d", i)
		m := b.call(fmt.Sprintf(`{"id":"x%d","op":"cancel","target":"w%d"}`, i, i))
		if m["id"] != fmt.Sprintf("x%d", i) { // the canceled acquire first
			require.Equal(t, fmt.Sprintf("w%d", i), m["id"])
			requireCode(t, m, "canceled")
			m = b.recv()
		}
		require.Equal(t, true, m["canceled"], "round %d: the acquire read first waited", i)
	}
}
