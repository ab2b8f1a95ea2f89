package socketapi_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestIdleConnections: a connection that waits for a request
// Server.IdleHandoff (20 ms here) after its first waits without a
// goroutine, in the server's idle poller, and loses nothing: requests,
// alone or pipelined, are answered; a hang-up releases its locks at once;
// events and grants reach it; the agent closing it (a resumed session,
// shutdown) finishes it. A connection with a heartbeat keeps a read loop,
// and its heartbeat; a line begun keeps its timeout.
func TestIdleConnections(t *testing.T) {
	ta := startAgent(t, func(o *options) {
		o.Server.IdleHandoff = 20 * time.Millisecond
		o.Server.LineTimeout = 300 * time.Millisecond
	})

	t.Run("requests", func(t *testing.T) {
		c := ta.raw(t)
		for range 5 {
			c.ok(`{"op":"ping"}`)
			requireReadLoops(t, 0)
		}
		c.ok(`{"op":"acquire","name":"idle/requests"}`)
		requireReadLoops(t, 0)
		_, err := c.nc.Write([]byte(strings.Repeat(`{"op":"ping"}`+"\n\n", 100)))
		require.NoError(t, err)
		for range 100 {
			require.Equal(t, true, c.recv()["pong"])
		}
		requireReadLoops(t, 0)
		assert.Equal(t, false, ta.raw(t).ok(`{"op":"acquire","name":"idle/requests"}`)["acquired"], "the lease stays with its connection")
	})

	t.Run("many", func(t *testing.T) {
		var cs []*raw
		for i := range 200 {
			c := ta.raw(t)
			c.ok(fmt.Sprintf(`{"op":"acquire","name":"idle/many/%d"}`, i))
			cs = append(cs, c)
		}
		requireReadLoops(t, 0)
		for i, c := range cs {
			if i%2 == 0 {
				c.nc.Close()
			}
		}
		for i, c := range cs {
			if i%2 == 1 {
				c.ok(`{"op":"ping"}`)
			}
		}
		o := ta.raw(t)
		for i := range cs {
			if i%2 == 0 { // the closed connections' locks are freed
				assert.Equal(t, true, o.ok(fmt.Sprintf(`{"op":"acquire","name":"idle/many/%d","wait_ms":5000}`, i))["acquired"], "idle/many/%d", i)
			} else {
				assert.Equal(t, false, o.ok(fmt.Sprintf(`{"op":"acquire","name":"idle/many/%d"}`, i))["acquired"], "idle/many/%d", i)
			}
		}
		for i, c := range cs {
			if i%2 == 1 {
				c.nc.Close()
			}
		}
	})

	t.Run("hang-up", func(t *testing.T) {
		c := ta.raw(t)
		c.ok(`{"op":"acquire","name":"idle/hangup"}`)
		w := ta.raw(t)
		w.send(`{"id":1,"op":"acquire","name":"idle/hangup","wait_ms":5000}`)
		requireReadLoops(t, 0)
		c.nc.Close()
		assert.Equal(t, true, w.recv()["acquired"], "the waiter is granted once the idle holder hangs up")
	})

	t.Run("grant while idle", func(t *testing.T) {
		h, w := ta.raw(t), ta.raw(t)
		m := h.ok(`{"op":"acquire","name":"idle/grant"}`)
		w.send(`{"id":1,"op":"acquire","name":"idle/grant","wait_ms":5000}`)
		requireReadLoops(t, 0)
		h.ok(fmt.Sprintf(`{"op":"release","lease":%q}`, m["lease"]))
		assert.Equal(t, true, w.recv()["acquired"])
	})

	t.Run("closed by the agent", func(t *testing.T) {
		a := ta.raw(t)
		h := a.ok(`{"op":"hello","session_ttl_ms":60000}`)
		a.ok(`{"op":"acquire","name":"idle/resumed","scope":"session"}`)
		requireReadLoops(t, 0)
		b := ta.raw(t)
		b.ok(fmt.Sprintf(`{"op":"hello","resume":{"session":%q,"token":%q}}`, h["session"], h["resume_token"]))
		a.requireClosed()
		assert.Equal(t, false, ta.raw(t).ok(`{"op":"acquire","name":"idle/resumed"}`)["acquired"], "the resumed session keeps its lease")
	})

	t.Run("heartbeat", func(t *testing.T) {
		c := ta.raw(t)
		c.ok(`{"op":"hello","heartbeat_ms":300}`)
		var last time.Time // before the agent read the last ping
		for range 3 {
			time.Sleep(60 * time.Millisecond) // past IdleHandoff, inside the heartbeat
			last = time.Now()
			c.ok(`{"op":"ping"}`)
		}
		c.requireClosed()
		assert.GreaterOrEqual(t, time.Since(last), 300*time.Millisecond, "closed before the heartbeat ran out")
	})

	t.Run("line timeout", func(t *testing.T) {
		c := ta.raw(t)
		c.ok(`{"op":"ping"}`)
		requireReadLoops(t, 0)
		begun := time.Now()
		c.nc.Write([]byte(`{"op":"pi`))
		c.requireClosed()
		assert.GreaterOrEqual(t, time.Since(begun), 280*time.Millisecond, "closed before the line timeout")
	})

	t.Run("shutdown", func(t *testing.T) {
		c := ta.raw(t)
		c.ok(`{"op":"acquire","name":"idle/shutdown"}`)
		requireReadLoops(t, 0)
		ta.stop()
		c.requireClosed()
	})
}

// requireReadLoops waits until n goroutines of the test's agents are in a
// connection's read loop: the others' connections wait in the idle poller.
func requireReadLoops(t *testing.T, n int) {
	t.Helper()
	var got int
	require.Eventually(t, func() bool {
		buf := make([]byte, 1<<20)
		for {
			k := runtime.Stack(buf, true)
			if k < len(buf) {
				buf = buf[:k]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		got = bytes.Count(buf, []byte("socketapi.(*conn).readLoop("))
		return got == n
	}, 5*time.Second, 5*time.Millisecond, "read loops: want %d", n)
}

// wcall sends a line and reads lines until one that is not an event.
func wcall(nc net.Conn, r *bufio.Reader, line string) (map[string]any, error) {
	if _, err := nc.Write([]byte(line + "\n")); err != nil {
		return nil, err
	}
	for {
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		if _, ev := m["event"]; !ev {
			if m["ok"] != true {
				return m, fmt.Errorf("not ok: %v", m)
			}
			return m, nil
		}
	}
}

// untilEOF reads until the agent closes the connection.
func untilEOF(nc net.Conn) error {
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, nc)
	return err
}

// TestIdleParkCloseStress: 40 clients, 60 connections each, that hold a
// lock and then, parked or not yet, hang up, send more, half-close, leave
// a line unfinished, pipeline and hang up, say bye, or are resumed from
// another connection, while an admin breaks names (events to parked
// connections): every session ends, no read loop is left, and the server
// stops.
func TestIdleParkCloseStress(t *testing.T) {
	ta := startAgent(t, func(o *options) {
		o.Server.IdleHandoff = time.Millisecond
		o.Server.LineTimeout = 100 * time.Millisecond
		o.Server.WriteTimeout = 300 * time.Millisecond
	})
	const workers, iters = 40, 60
	errs := make(chan error, workers*iters)
	stopBreak := make(chan struct{})
	var bwg sync.WaitGroup
	bwg.Add(1)
	go func() { // an admin breaking names: events to parked connections
		defer bwg.Done()
		nc, err := net.Dial("unix", ta.path)
		if err != nil {
			errs <- err
			return
		}
		defer nc.Close()
		r := bufio.NewReader(nc)
		for i := 0; ; i++ {
			select {
			case <-stopBreak:
				return
			default:
			}
			if _, err := wcall(nc, r, fmt.Sprintf(`{"op":"break","name":"s/%d/%d"}`, rand.IntN(workers), rand.IntN(iters))); err != nil {
				errs <- fmt.Errorf("break: %w", err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range iters {
				if err := stressOne(ta.path, w, i); err != nil {
					errs <- fmt.Errorf("worker %d iter %d: %w", w, i, err)
				}
			}
		}()
	}
	wg.Wait()
	close(stopBreak)
	bwg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.Eventually(t, func() bool { return ta.agent.Stats().Sessions == 0 }, 10*time.Second, 10*time.Millisecond,
		"sessions left: %d", ta.agent.Stats().Sessions)
	requireReadLoops(t, 0)
	done := make(chan struct{})
	go func() { ta.stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
}

// stressOne is one connection of TestIdleParkCloseStress.
func stressOne(path string, w, i int) error {
	nc, err := net.Dial("unix", path)
	if err != nil {
		return err
	}
	defer nc.Close()
	r := bufio.NewReader(nc)
	action := rand.IntN(7)
	var hello map[string]any
	if action == 6 {
		if hello, err = wcall(nc, r, `{"op":"hello","session_ttl_ms":60000}`); err != nil {
			return err
		}
	}
	if _, err := wcall(nc, r, fmt.Sprintf(`{"op":"acquire","name":"s/%d/%d","wait_ms":2000}`, w, i)); err != nil {
		return err
	}
	// Sometimes parked, sometimes not yet (IdleHandoff is 1 ms).
	if d := rand.IntN(4); d > 0 {
		time.Sleep(time.Duration(d) * time.Millisecond)
	}
	switch action {
	case 0:
		return nil // hang up
	case 1:
		if _, err := wcall(nc, r, `{"op":"ping"}`); err != nil {
			return err
		}
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		_, err := wcall(nc, r, `{"op":"ping"}`)
		return err
	case 2:
		nc.(*net.UnixConn).CloseWrite()
		return untilEOF(nc)
	case 3:
		nc.Write([]byte(`{"op":"pi`))
		return untilEOF(nc) // line timeout
	case 4:
		nc.Write([]byte(strings.Repeat(`{"op":"ping"}`+"\n", 20)))
		return nil
	case 5:
		_, err := wcall(nc, r, `{"op":"bye"}`)
		if err != nil {
			return err
		}
		return untilEOF(nc)
	case 6:
		b, err := net.Dial("unix", path)
		if err != nil {
			return err
		}
		defer b.Close()
		br := bufio.NewReader(b)
		if _, err := wcall(b, br, fmt.Sprintf(`{"op":"hello","resume":{"session":%q,"token":%q}}`, hello["session"], hello["resume_token"])); err != nil {
			return fmt.Errorf("resume: %w", err)
		}
		if err := untilEOF(nc); err != nil {
			return fmt.Errorf("resumed-from connection: %w", err)
		}
		if _, err := wcall(b, br, `{"op":"bye"}`); err != nil {
			return err
		}
		return untilEOF(b)
	}
	return nil
}

// holdAndStopReading makes a connection hold n leases, then stop reading;
// an admin breaks them all, so that lost events pile up for a parked
// connection.
func holdAndStopReading(t *testing.T, ta *testAgent, n int) {
	a := ta.raw(t)
	for i := range n {
		require.Equal(t, true, a.ok(fmt.Sprintf(`{"op":"acquire","name":"p/%d"}`, i))["acquired"])
	}
	requireReadLoops(t, 0)
	adm := ta.raw(t)
	for i := range n {
		adm.ok(fmt.Sprintf(`{"op":"break","name":"p/%d"}`, i))
	}
	require.Eventually(t, func() bool { return ta.agent.Stats().Sessions == 1 }, 10*time.Second, 10*time.Millisecond,
		"the parked connection that does not read is never finished; sessions %d", ta.agent.Stats().Sessions)
}

// TestIdleCutOffWhileParked: a parked connection that does not read the
// events queued for it is cut off, and its session ends.
func TestIdleCutOffWhileParked(t *testing.T) {
	ta := startAgent(t, func(o *options) {
		o.Server.IdleHandoff = time.Millisecond
		o.Server.MaxQueueBytes = 4096
		o.Server.WriteTimeout = time.Minute
	})
	holdAndStopReading(t, ta, 900)
}

// TestIdleWriteTimeoutWhileParked: the same, cut off by the write timeout.
func TestIdleWriteTimeoutWhileParked(t *testing.T) {
	ta := startAgent(t, func(o *options) {
		o.Server.IdleHandoff = time.Millisecond
		o.Server.WriteTimeout = 300 * time.Millisecond
	})
	holdAndStopReading(t, ta, 900)
}

// TestIdleDescriptorReuse: 200 connections park and close, their
// descriptors reused, while one stays parked throughout and is served.
func TestIdleDescriptorReuse(t *testing.T) {
	ta := startAgent(t, func(o *options) { o.Server.IdleHandoff = time.Millisecond })
	keep := ta.raw(t)
	keep.ok(`{"op":"acquire","name":"keep"}`)
	for i := range 200 {
		c, err := net.Dial("unix", ta.path)
		require.NoError(t, err)
		r := bufio.NewReader(c)
		_, err = wcall(c, r, fmt.Sprintf(`{"op":"acquire","name":"r/%d"}`, i))
		require.NoError(t, err)
		requireReadLoops(t, 0)
		c.Close()
		if i%20 == 0 {
			keep.ok(`{"op":"ping"}`)
		}
	}
	require.Eventually(t, func() bool { return ta.agent.Stats().Sessions == 1 }, 5*time.Second, 5*time.Millisecond)
	keep.ok(`{"op":"ping"}`)
}

// TestCloseWhileLookingUpGroups: a connection accepted just before
// shutdown, still looking up its peer's groups when Serve closes the
// remaining connections, is closed and finished (and, under -race,
// nothing of it is written while Close reads it).
func TestCloseWhileLookingUpGroups(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	ta := startAgent(t, func(o *options) {
		o.Server.GroupsOf = func(uid uint32) ([]uint32, error) {
			once.Do(func() { close(entered) })
			<-release
			return nil, nil
		}
	})
	nc, err := net.Dial("unix", ta.path)
	require.NoError(t, err)
	defer nc.Close()
	<-entered
	stopped := make(chan struct{})
	go func() { ta.stop(); close(stopped) }()
	// Wait until Serve has closed the connection (Close ran), then let
	// serve go on and set c.fd.
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = nc.Read(make([]byte, 1))
	require.Error(t, err)
	close(release)
	<-stopped
}
