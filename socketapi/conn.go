package socketapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/internal/rawsock"
	"github.com/lockagent/lockagent/internal/wire"
)

// conn is one client connection: a read loop that decodes and dispatches
// requests, and exactly one writer at a time that drains a bounded queue of
// responses and events.
type conn struct {
	srv  *Server
	id   uint64 // the server's number for it, kept across a handover
	nc   *net.UnixConn
	fd   int32       // nc's descriptor, for idle; -1: unknown
	idle *idlePoller // where the connection waits while idle; nil: none
	out  *output     // what is written to the peer
	peer agent.Peer
	log  hclog.Logger
	ctx  context.Context // the connection's own (see end)

	// Owned by the read loop.
	sess         *agent.Session
	heartbeat    time.Duration
	lr           lineReader
	hbDeadline   time.Time // when the heartbeat runs out; zero: none
	lineDeadline time.Time // when the line begun must end; zero: none
	readDeadline time.Time // the socket's
	ended        func()    // called once the connection is over

	// mu guards the pending requests. It is never held while calling the
	// agent.
	mu      sync.Mutex
	pending map[string]*pendingReq     // cancellable requests by id key
	waiting map[string]json.RawMessage // waiting acquires' ids, by their agent's key (see agent.Pending.Key)
	reqWG   sync.WaitGroup             // request goroutines

	// end ends the connection's context, and with it every request in
	// flight: when the connection ends, and when the agent closes it (its
	// session ended, or another connection resumed it).
	end context.CancelFunc
}

// newConn returns the connection of nc, a socket accepted from peer.
// register then gives it its context.
func newConn(s *Server, nc *net.UnixConn, idle *idlePoller, peer agent.Peer) *conn {
	fd, raw := connFD(nc)
	c := &conn{srv: s, nc: nc, fd: fd, idle: idle, log: s.Logger, peer: peer}
	// From the start: the agent may close an adopted connection before
	// Serve registers it (see Server.Adopt).
	c.ctx, c.end = context.WithCancel(context.Background())
	c.out = &output{
		w:        newLineWriter(nc, raw, s.WriteTimeout),
		maxBytes: s.MaxQueueBytes,
		budget:   s.budget,
		uid:      peer.UID,
		closeSocket: func() {
			// A parked connection is first taken out of the idle
			// poller, before its descriptor can be reused, and its read
			// loop started: it finds the socket closed and finishes the
			// connection.
			if c.idle != nil {
				c.idle.unpark(c.fd)
			}
			s.closeSocket(c.nc)
		},
		warn: func(msg string, args ...any) {
			s.PeerLog.Log(s.Logger, hclog.Warn, c.peer.UID, msg, append([]any{"pid", c.peer.PID, "uid", c.peer.UID}, args...)...)
		},
		debug: func(msg string, args ...any) {
			c.log.Debug(msg, append([]any{"pid", c.peer.PID, "uid", c.peer.UID}, args...)...)
		},
	}
	if s.Observer != nil {
		c.out.cut = s.Observer.CutOff
	}
	return c
}

// pendingReq is a waiting acquire that cancel can name.
type pendingReq struct {
	cancel   context.CancelFunc
	done     chan struct{} // closed once the acquire is answered
	canceled bool          // it was answered canceled; set before done is closed
}

// serve looks the peer's groups up and runs the connection's read loop.
// Once the connection has ended and every goroutine it started has
// finished, c.ended is called.
func (c *conn) serve() {
	c.lookUpGroups()
	c.lr = lineReader{r: rawsock.Wrap(c.nc), max: c.srv.MaxLineBytes, begun: c.lineBegun}
	c.armHeartbeat()
	c.readLoop()
}

// lookUpGroups reads the groups of the peer's uid, for ACL rules.
func (c *conn) lookUpGroups() {
	groups, err := c.srv.groups.groups(c.peer.UID)
	if err != nil {
		// The peer keeps its primary group only: rules can match less,
		// never more.
		c.srv.PeerLog.Log(c.srv.Logger, hclog.Warn, c.peer.UID, "cannot read the groups of the peer's uid", "pid", c.peer.PID, "uid", c.peer.UID, "error", err)
	}
	c.peer.Groups = groups
}

// armHeartbeat starts the wait for the next request: it must come within
// the heartbeat, if the session has one.
func (c *conn) armHeartbeat() {
	c.hbDeadline = time.Time{}
	if c.heartbeat > 0 {
		c.hbDeadline = time.Now().Add(c.heartbeat)
	}
}

// lineBegun arms the line's own deadline: a line begun must end within
// LineTimeout (and before the heartbeat runs out), so that a peer that
// trickles bytes cannot hold its connection.
func (c *conn) lineBegun() {
	c.lineDeadline = time.Now().Add(c.srv.LineTimeout)
	c.setReadDeadline(soonest(c.hbDeadline, c.lineDeadline))
}

// setReadDeadline sets the socket's read deadline, unless it is set
// already.
func (c *conn) setReadDeadline(t time.Time) {
	if !t.Equal(c.readDeadline) {
		c.readDeadline = t
		c.nc.SetReadDeadline(t)
	}
}

// readLoop reads and handles requests until the connection ends.
//
// Handling a request grows the goroutine's stack to several KiB, which the
// runtime gives back only a half at a time at each garbage collection:
// thousands of idle connections would each keep that much. So a read loop
// that is waiting for a request Server.IdleHandoff after the first it
// handled returns, and the connection waits without a goroutine (see
// park).
func (c *conn) readLoop() {
	ctx := c.ctx
	g := &c.srv.gate
	g.enter()
	var idle time.Time // when to park, once a request was handled
	for {
		c.setReadDeadline(soonest(soonest(c.hbDeadline, idle), c.lineDeadline))
		// Checked after the deadline is set: Freeze sets its own once the
		// gate is frozen, which this read then fails on.
		if g.frozen() {
			g.pause()
			continue
		}
		line, err := c.lr.readLine()
		if err != nil && g.frozen() {
			continue // stopped for a handover (see Server.Freeze): what was read stays
		}
		if err != nil {
			if c.idleTimeout(err, idle) {
				c.lr.idle()
				g.exit()
				c.park()
				return
			}
			c.readFailed(err)
			break
		}
		c.lineDeadline = time.Time{}
		if ctx.Err() != nil {
			break // closed by the agent: what was read is not its session's any more
		}
		if len(bytes.Trim(line, " \t")) == 0 {
			c.armHeartbeat() // a blank line is a line all the same
			continue
		}
		if !c.handle(ctx, line) {
			break
		}
		if idle.IsZero() {
			// Armed once, not for every request: a busy connection
			// moves to a new goroutine once in a while, at no cost.
			idle = time.Now().Add(c.srv.IdleHandoff)
		}
		c.armHeartbeat()
	}
	g.exit()
	c.finish()
}

// park hands the wait for the next request over to the server's idle
// poller, which starts a new read loop when the peer writes or hangs up,
// or the connection is closed. A connection with a heartbeat, whose
// deadline the read loop keeps, or one the poller cannot take, goes on
// waiting in a new goroutine, whose stack starts small again.
func (c *conn) park() {
	if c.hbDeadline.IsZero() && c.idle != nil && c.fd >= 0 {
		// While the socket is sure to stay open: it is unparked before
		// it is closed (newConn).
		if c.out.whileOpen(func() bool { return c.idle.park(c.fd, c.readLoop) }) {
			return
		}
	}
	go c.readLoop()
}

// idleTimeout tells whether err is the end of the idle wait that ends at
// idle (if set), rather than of the heartbeat or of a line begun.
func (c *conn) idleTimeout(err error, idle time.Time) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout() && !idle.IsZero() && c.lineDeadline.IsZero() &&
		(c.hbDeadline.IsZero() || idle.Before(c.hbDeadline))
}

// readFailed logs why reading ended, and answers a line too long.
func (c *conn) readFailed(err error) {
	if errors.Is(err, errLineTooLong) {
		c.srv.PeerLog.Log(c.srv.Logger, hclog.Warn, c.peer.UID, "line too long; connection closed", "pid", c.peer.PID, "uid", c.peer.UID, "max", c.srv.MaxLineBytes)
		c.out.enqueue(encodeError(nil, wire.CodeLineTooLong, fmt.Sprintf("a line is at most %d bytes", c.srv.MaxLineBytes), nil), true)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		if !c.lineDeadline.IsZero() && (c.hbDeadline.IsZero() || c.lineDeadline.Before(c.hbDeadline)) {
			c.srv.PeerLog.Log(c.srv.Logger, hclog.Warn, c.peer.UID, "line not completed in time; connection closed", "pid", c.peer.PID, "uid", c.peer.UID, "line_timeout", c.srv.LineTimeout)
		} else {
			c.log.Debug("heartbeat missed; connection dropped", "pid", c.peer.PID, "uid", c.peer.UID, "heartbeat", c.heartbeat)
		}
	}
}

// finish ends the connection once reading has: it abandons the pending
// requests, detaches the connection so that events go to the session's
// backlog and its connection-scoped leases are released, then flushes and
// closes, waits for every goroutine the connection started, and calls
// ended.
func (c *conn) finish() {
	c.end()
	if c.sess != nil {
		c.sess.Detach(c)
	}
	c.reqWG.Wait()
	c.Close()
	c.out.writers.Wait()
	c.ended()
}

// Send queues an event; part of agent.Conn.
func (c *conn) Send(ev agent.Event) { c.out.send(encodeEvent(ev)) }

// Written returns a channel closed once every line queued so far, events
// held back included, has been written, or the connection has closed;
// part of agent.Conn.
func (c *conn) Written() <-chan struct{} { return c.out.written() }

// Close closes the connection once what is queued is written; part of
// agent.Conn. It does not block.
func (c *conn) Close() {
	c.end()
	c.out.close()
}

// soonest is the earlier of two deadlines, where the zero time is none.
func soonest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
