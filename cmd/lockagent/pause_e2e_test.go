package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// lineConn is a client connection read and written line by line, without
// a reading goroutine: what the agent has written and the test has not
// read stays in the socket, where the test can look for it.
type lineConn struct {
	t   *testing.T
	nc  *net.UnixConn
	buf []byte // read, not yet returned
}

func dialLines(t *testing.T, socket string) *lineConn {
	t.Helper()
	nc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	return &lineConn{t: t, nc: nc}
}

func (c *lineConn) send(format string, args ...any) {
	c.t.Helper()
	_, err := fmt.Fprintf(c.nc, format+"\n", args...)
	require.NoError(c.t, err)
}

// line returns the next whole line read, if there is one.
func (c *lineConn) line() (map[string]any, bool, error) {
	i := bytes.IndexByte(c.buf, '\n')
	if i < 0 {
		return nil, false, nil
	}
	var m map[string]any
	if err := json.Unmarshal(c.buf[:i], &m); err != nil {
		return nil, false, fmt.Errorf("%q: %w", c.buf[:i], err)
	}
	c.buf = c.buf[i+1:]
	return m, true, nil
}

// next reads the next line, waiting until deadline at most. It may be
// called from any goroutine.
func (c *lineConn) next(deadline time.Time) (map[string]any, error) {
	c.nc.SetReadDeadline(deadline)
	for {
		if m, ok, err := c.line(); ok || err != nil {
			return m, err
		}
		b := make([]byte, 4096)
		n, err := c.nc.Read(b)
		if err != nil {
			return nil, err
		}
		c.buf = append(c.buf, b[:n]...)
	}
}

// call sends a request and returns its answer, which must come next.
func (c *lineConn) call(format string, args ...any) map[string]any {
	c.t.Helper()
	c.send(format, args...)
	m, err := c.next(time.Now().Add(callTimeout))
	require.NoError(c.t, err)
	require.Equal(c.t, true, m["ok"], "%s → %v", fmt.Sprintf(format, args...), m)
	return m
}

// written returns the next line if the agent has written it already,
// without waiting for it. It may be called from any goroutine.
func (c *lineConn) written() (map[string]any, bool, error) {
	if m, ok, err := c.line(); ok || err != nil {
		return m, ok, err
	}
	rc, err := c.nc.SyscallConn()
	if err != nil {
		return nil, false, err
	}
	b := make([]byte, 4096)
	var n int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		n, rerr = syscall.Read(int(fd), b) // the socket never blocks: EAGAIN
		return true
	})
	switch {
	case err != nil:
		return nil, false, err
	case rerr != nil && rerr != syscall.EAGAIN:
		return nil, false, os.NewSyscallError("read", rerr)
	}
	c.buf = append(c.buf, b[:max(n, 0)]...)
	return c.line()
}

// pauseRounds is how many times TestPausedAgentTellsTheHolderFirst stops
// the agent; pausePairs is how many holders of each kind lose their lease
// to another session at each stop.
const (
	pauseRounds = 3
	pausePairs  = 6
)

// TestPausedAgentTellsTheHolderFirst: an agent stopped (SIGSTOP) past its
// leases' TTL finds, once continued, that the embedded backend has let
// them expire, and that waiters, woken waiters and campaigns can have
// their names. Every holder's lost event is written before any grant of
// its name: when a waiter reads its grant, the holder's lost event is in
// the holder's socket already. A try made after the stop is answered only
// after the holder's loss too.
func TestPausedAgentTellsTheHolderFirst(t *testing.T) {
	e := newAgentEnv(t)
	a := e.start(t)
	type pair struct {
		kind, name string
		holder     *lineConn
		other      *lineConn
		long       *lineConn // woken: the long shared holder whose release wakes the waiter
		longLease  string
	}
	var (
		orders = map[string]int{} // kind → grants that came after the holder's lost
		mu     sync.Mutex
	)
	for round := range pauseRounds {
		var pairs []*pair
		for _, kind := range []string{"wait", "woken", "campaign", "try"} {
			for i := range pausePairs {
				p := &pair{kind: kind, name: fmt.Sprintf("pause/%d/%s/%d", round, kind, i)}
				p.holder = dialLines(t, e.socket)
				p.other = dialLines(t, e.socket)
				mode := "exclusive"
				if kind == "woken" {
					mode = "shared"
					p.long = dialLines(t, e.socket)
					p.longLease = p.long.call(`{"id":1,"op":"acquire","name":%q,"mode":"shared","ttl_ms":600000}`, p.name)["lease"].(string)
				}
				got := p.holder.call(`{"id":1,"op":"acquire","name":%q,"mode":%q,"ttl_ms":1000}`, p.name, mode)
				require.Equal(t, true, got["acquired"], "%v", got)
				switch kind {
				case "wait", "woken":
					p.other.send(`{"id":7,"op":"acquire","name":%q,"wait_ms":-1}`, p.name)
				case "campaign":
					p.other.call(`{"id":7,"op":"campaign","name":%q,"ttl_ms":1000}`, p.name)
				}
				pairs = append(pairs, p)
			}
		}
		// Waiters queue (list shows them) before the agent stops.
		ctl := dialLines(t, e.socket)
		eventually(t, exitTimeout, "every waiter queued", func() bool {
			n := 0
			for _, s := range ctl.call(`{"id":1,"op":"list"}`)["sessions"].([]any) {
				n += len(s.(map[string]any)["waiting"].([]any))
			}
			return n == 3*pausePairs
		})

		a.signal(t, syscall.SIGSTOP)
		time.Sleep(1500*time.Millisecond + time.Duration(round)*400*time.Millisecond) // the fault: the agent stopped past every TTL
		a.signal(t, syscall.SIGCONT)

		var wg sync.WaitGroup
		for _, p := range pairs {
			switch p.kind {
			case "woken":
				p.long.send(`{"id":2,"op":"release","lease":%q}`, p.longLease)
			case "try":
				p.other.send(`{"id":7,"op":"acquire","name":%q}`, p.name)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := p.other.next(time.Now().Add(callTimeout))
				switch {
				case err != nil:
					t.Errorf("%s: %v", p.name, err)
					return
				case p.kind == "campaign" && got["event"] != "elected", p.kind != "campaign" && got["acquired"] != true:
					t.Errorf("%s: not granted: %v", p.name, got)
					return
				}
				// Read at once: had the grant been written first, the
				// lost event could not be there yet.
				lost, ok, err := p.holder.written()
				switch {
				case err != nil:
					t.Errorf("%s: %v", p.name, err)
				case !ok:
					t.Errorf("%s (%s): granted to another session before its holder was told of the loss", p.name, p.kind)
				case lost["event"] != "lost":
					t.Errorf("%s: the holder was sent %v", p.name, lost)
				default:
					mu.Lock()
					orders[p.kind]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	require.False(t, t.Failed())
	t.Logf("grants after their holder's lost event, by kind, over %d stops: %v", pauseRounds, orders)
}
