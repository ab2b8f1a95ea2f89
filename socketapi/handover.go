package socketapi

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"time"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/internal/descriptor"
	"github.com/lockagent/lockagent/internal/lockfile"
	"github.com/lockagent/lockagent/internal/rawsock"
	"github.com/lockagent/lockagent/internal/wire"
)

// A handover gives a serving agent's connections, listener and state to a
// new process, which goes on with them (an upgrade). The server's part:
//
//  0. Connections, while the server serves: the connections' ids and
//     descriptors, which the new process takes with Prepare, so that the
//     work of taking them is done before the freeze;
//  1. Freeze: no connection is accepted, and each connection stops reading
//     at a line's end, once the request it handles, if any, is answered;
//  2. the agent freezes (agent.Freeze): what it answers meanwhile is queued;
//  3. FreezeOutput: each connection stops writing, what it had not written
//     (a line's rest included) staying in its queue;
//  4. Snapshot: the connections' state, and the descriptors that go with
//     it: the listener's, and those of connections accepted since step 0;
//  5. in the new process, Adopt takes them, with the prepared ones, Resume
//     gives it the agent's waiting acquires (from agent.Restore), and
//     Serve goes on.
//
// If the handover fails, Thaw lets the server go on as if nothing had
// happened. If it succeeds, the old process exits without another step:
// the sockets are the new one's.

// State is what a server hands over: its connections, each with what it
// read and has not handled, what it queued and has not written, and the
// waiting acquires it is to answer. The sockets go with it as descriptors,
// which State names by their index among them.
type State struct {
	Listener     int         `json:"listener"`      // the listening socket
	ListenerLock int         `json:"listener_lock"` // its lock file; -1: none (systemd's socket)
	Path         string      `json:"path"`          // the socket's path, when the agent bound it
	Conns        []ConnState `json:"conns"`
}

// ConnState is one connection.
type ConnState struct {
	ID          uint64                     `json:"id"`
	FD          int                        `json:"fd"` // -1: it was among Connections
	Session     string                     `json:"session,omitempty"`
	Heartbeat   time.Duration              `json:"heartbeat,omitempty"`
	HeartbeatIn time.Duration              `json:"heartbeat_in,omitempty"` // until it runs out
	Input       []byte                     `json:"input,omitempty"`        // read, not handled
	Output      [][]byte                   `json:"output,omitempty"`       // queued, not written
	Waiting     map[string]json.RawMessage `json:"waiting,omitempty"`      // waiting acquires' ids, by key
	Upgrades    []json.RawMessage          `json:"upgrades,omitempty"`     // the ids of upgrade ops to answer
}

// Freeze stops the server for a handover (step 1): no connection is
// accepted, and every connection stops reading at a line's end. If ctx
// ends first, the server goes on and Freeze returns ctx's error.
func (s *Server) Freeze(ctx context.Context) error {
	return s.gate.freeze(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.frozeAt = time.Now()
		past := time.Unix(1, 0)
		s.ln.SetDeadline(past)
		for c := range s.conns {
			c.nc.SetReadDeadline(past)
		}
	})
}

// FreezeOutput stops every connection's writer (step 3).
func (s *Server) FreezeOutput() {
	for _, c := range s.connections() {
		c.out.freeze()
	}
}

// Thaw lets a frozen server go on: the handover failed. Thaw the agent
// first.
func (s *Server) Thaw() {
	conns := s.connections()
	for _, c := range conns {
		c.out.thaw()
	}
	s.gate.thaw(func() {
		s.ln.SetDeadline(time.Time{})
		// The time frozen does not count against a heartbeat or a line
		// begun: the peer could not be heard meanwhile.
		frozen := time.Since(s.frozeAt)
		for _, c := range conns {
			if !c.hbDeadline.IsZero() {
				c.hbDeadline = c.hbDeadline.Add(frozen)
			}
			if !c.lineDeadline.IsZero() {
				c.lineDeadline = c.lineDeadline.Add(frozen)
			}
			// The read deadline the read loop keeps, which Freeze
			// changed; the loop sets it again from the deadlines.
			c.nc.SetReadDeadline(c.readDeadline)
		}
	})
}

// connections is the server's connections now.
func (s *Server) connections() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.conns))
}

// Connections returns the server's connections now, by id, and their
// descriptors (step 0), which stay this process's: the receiving process
// gets copies of them. Until done is called, once they are sent, no
// socket is closed, so that no descriptor is reused meanwhile.
func (s *Server) Connections() (ids []uint64, fds []int, done func()) {
	s.keepMu.Lock()
	s.keep = []*net.UnixConn{}
	s.keepMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.fd >= 0 && !c.out.isClosed() {
			ids = append(ids, c.id)
			fds = append(fds, int(c.fd))
		}
	}
	return ids, fds, func() {
		s.keepMu.Lock()
		keep := s.keep
		s.keep = nil
		s.keepMu.Unlock()
		for _, nc := range keep {
			nc.Close()
		}
	}
}

// Prepare takes the connections of Connections, from their descriptors,
// in the new process, before the freeze: Adopt goes on with those the
// state names, and closes the others, which ended meanwhile. It closes
// each file once it has its own copy, so that an agent serving near its
// descriptor limit never holds two of each.
func (s *Server) Prepare(ids []uint64, files []*os.File) error {
	s.setDefaults()
	if len(ids) != len(files) {
		return fmt.Errorf("socketapi: prepare: %d connections, %d descriptors", len(ids), len(files))
	}
	s.prepared = make(map[uint64]*conn, len(ids))
	for i, f := range files {
		c, err := s.take(f)
		if err != nil {
			return err
		}
		c.id = ids[i]
		s.prepared[c.id] = c
	}
	return nil
}

// take makes a connection of a socket handed over, and closes f.
func (s *Server) take(f *os.File) (*conn, error) {
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("socketapi: adopt a connection: %w", err)
	}
	nc, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		return nil, fmt.Errorf("socketapi: adopt a connection: a %s socket, not a Unix one", fc.LocalAddr().Network())
	}
	peer, err := peerOf(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("socketapi: adopt a connection: %w", err)
	}
	return newConn(s, nc, nil, peer), nil
}

// Snapshot returns the state of a frozen server (step 4), and the
// descriptors it names, which stay this process's: the receiving process
// gets copies of them. The connections of sent, the ids Connections
// returned, are named without a descriptor.
func (s *Server) Snapshot(sent []uint64) (State, []int, error) {
	if !s.gate.frozen() {
		return State{}, nil, fmt.Errorf("socketapi: snapshot of a server that is not frozen")
	}
	var fds []int
	add := func(fd int) int {
		fds = append(fds, fd)
		return len(fds) - 1
	}
	lfd, err := descriptor.Of(s.ln.UnixListener)
	if err != nil {
		return State{}, nil, fmt.Errorf("socketapi: snapshot: the listener: %w", err)
	}
	st := State{Listener: add(lfd), ListenerLock: -1, Path: s.ln.path}
	if s.ln.lock != nil {
		st.ListenerLock = add(int(s.ln.lock.File().Fd()))
	}
	was := make(map[uint64]bool, len(sent))
	for _, id := range sent {
		was[id] = true
	}
	for _, c := range s.connections() {
		if c.out.isClosed() {
			continue // ending: its session is told it went (see Adopt)
		}
		cs := ConnState{ID: c.id, FD: -1, Heartbeat: c.heartbeat, Output: c.out.queued()}
		if !was[c.id] {
			cs.FD = add(int(c.fd))
		}
		if c.sess != nil {
			cs.Session = c.sess.ID()
		}
		if !c.hbDeadline.IsZero() {
			// What was left at the freeze: the time frozen does not count.
			cs.HeartbeatIn = max(c.hbDeadline.Sub(s.frozeAt), time.Nanosecond)
		}
		if c.lr.end > c.lr.start {
			cs.Input = slices.Clone(c.lr.buf[c.lr.start:c.lr.end])
		}
		c.mu.Lock()
		cs.Waiting = maps.Clone(c.waiting)
		c.mu.Unlock()
		s.mu.Lock()
		cs.Upgrades = s.upgrading[c]
		s.mu.Unlock()
		st.Conns = append(st.Conns, cs)
	}
	return st, fds, nil
}

// adopted is a connection handed over, which Serve goes on with.
type adopted struct {
	c  *conn
	st ConnState
}

// goneConn stands for the connection of a session that was attached when
// the agent froze, but whose connection was ending: it is told it went
// once the server serves (see Serve).
type goneConn struct{}

func (goneConn) Send(agent.Event) {}
func (goneConn) Close()           {}
func (goneConn) Written() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// AdoptListener takes over the listener of a State (see Adopt), from the
// files handed over with it.
func AdoptListener(st State, files []*os.File) (*Listener, error) {
	if st.Listener < 0 || st.Listener >= len(files) {
		return nil, fmt.Errorf("socketapi: adopt: no listener")
	}
	ln, err := net.FileListener(files[st.Listener])
	if err != nil {
		return nil, fmt.Errorf("socketapi: adopt the listener: %w", err)
	}
	uln, ok := ln.(*net.UnixListener)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("socketapi: adopt the listener: a %s socket, not a Unix one", ln.Addr().Network())
	}
	uln.SetUnlinkOnClose(false) // see Listener.Close
	l := &Listener{UnixListener: uln}
	if st.ListenerLock >= 0 && st.ListenerLock < len(files) {
		// The path is this process's as long as it holds the lock that
		// the other process took, and handed over.
		bound, err := os.Lstat(st.Path)
		if err != nil {
			uln.Close()
			return nil, fmt.Errorf("socketapi: adopt the listener: %w", err)
		}
		lf, err := descriptor.Dup(files[st.ListenerLock])
		if err != nil {
			uln.Close()
			return nil, fmt.Errorf("socketapi: adopt the listener's lock: %w", err)
		}
		l.lock, l.path, l.bound = lockfile.Adopt(lf), st.Path, bound
	}
	return l, nil
}

// Adopt takes over the connections of a State, from the files handed over
// with it (step 5): it returns what agent.Restore finds each session's
// connection with. Set the agent, Resume, then Serve with the listener
// from AdoptListener: it goes on with them. Adopt takes the connections
// Prepare took, and closes the files of the others as Prepare does; the
// other files stay the caller's to close.
func (s *Server) Adopt(st State, files []*os.File) (func(session string) agent.Conn, error) {
	s.setDefaults()
	bySession := make(map[string]*conn)
	for _, cs := range st.Conns {
		c := s.prepared[cs.ID]
		delete(s.prepared, cs.ID)
		switch {
		case cs.FD >= 0 && cs.FD < len(files):
			var err error
			if c, err = s.take(files[cs.FD]); err != nil {
				return nil, err
			}
			c.id = cs.ID
		case c == nil:
			return nil, fmt.Errorf("socketapi: adopt: connection %d has no descriptor", cs.ID)
		}
		s.lastID = max(s.lastID, c.id)
		// What it had queued goes first: until goOn, whatever the restored
		// agent sends it is queued behind.
		c.out.freeze()
		for _, line := range cs.Output {
			c.out.queue(line)
		}
		c.heartbeat = cs.Heartbeat
		c.lr = lineReader{r: rawsock.Wrap(c.nc), max: s.MaxLineBytes, begun: c.lineBegun}
		c.lr.resume(cs.Input)
		s.adopted = append(s.adopted, adopted{c, cs})
		if cs.Session != "" {
			bySession[cs.Session] = c
		}
	}
	// Connections that ended in the old process after they were sent:
	// their copies here would keep them open.
	for _, c := range s.prepared {
		c.nc.Close()
	}
	s.prepared = nil
	return func(session string) agent.Conn {
		if c := bySession[session]; c != nil {
			return c
		}
		s.gone = append(s.gone, session)
		return goneConn{}
	}, nil
}

// Resume gives the server the waiting acquires of the agent it serves, as
// agent.Restore returned them, for the adopted connections to answer.
func (s *Server) Resume(pending map[string]*agent.Pending) {
	s.resumed = pending
}

// goOn starts the adopted connections (see Adopt), within Serve: each
// answers its waiting acquires, writes what it had queued, and reads on.
// The session of a connection that was ending is told it went. Then it
// thaws the agent.
func (s *Server) goOn(ctx context.Context, idle *idlePoller) {
	for _, ad := range s.adopted {
		c, cs := ad.c, ad.st
		c.idle = idle
		if cs.HeartbeatIn > 0 {
			c.hbDeadline = time.Now().Add(cs.HeartbeatIn) // see Snapshot
		}
		s.register(c)
		if cs.Session != "" {
			c.sess = s.Agent.Session(cs.Session)
		}
		for _, id := range cs.Upgrades {
			c.out.queue(encodeOK(id, wire.UpgradeResult{Version: s.Agent.Info().Version, PID: os.Getpid()}))
		}
		for key, id := range cs.Waiting {
			p := s.resumed[key]
			if p == nil {
				continue // answered already: its answer is in Output
			}
			p.Granted(func(l agent.Lease) {
				c.out.queue(encodeGranted(id, l))
			})
			c.await(c.ctx, id, func() *agent.Pending { return p })
		}
		c.out.thaw()
		c.lookUpGroups()
		if len(cs.Input) > 0 {
			go c.readLoop()
		} else {
			c.park() // as an idle connection does, without a goroutine
		}
	}
	for _, id := range s.gone {
		if sess := s.Agent.Session(id); sess != nil {
			sess.Detach(goneConn{})
		}
	}
	s.adopted, s.gone, s.resumed = nil, nil, nil
	// Restored frozen (see agent.Restore), the agent goes on once its
	// waiting acquires have their callbacks and the connections their
	// queues.
	s.Agent.Thaw()
}

// upgrade starts an upgrade (see Server.Upgrade) and answers nothing now:
// the new process answers once it serves, or UpgradeFailed here. Admins
// only.
func (c *conn) upgrade(_ context.Context, id json.RawMessage, _ *request) bool {
	switch {
	case !c.srv.Agent.IsAdmin(c.peer):
		c.reply(id, nil, fmt.Errorf("%w: upgrade is for admins", agent.ErrPermissionDenied))
		return true
	case c.srv.Upgrade == nil:
		c.out.enqueue(encodeError(id, wire.CodeUpgradeFailed, "this agent cannot upgrade itself", nil), true)
		return true
	}
	c.srv.mu.Lock()
	if c.srv.upgrading == nil {
		c.srv.upgrading = make(map[*conn][]json.RawMessage)
	}
	c.srv.upgrading[c] = append(c.srv.upgrading[c], id)
	c.srv.mu.Unlock()
	c.srv.Upgrade()
	return true
}

// UpgradeFailed answers the upgrade ops that wait, with why the upgrade
// failed. The agent goes on.
func (s *Server) UpgradeFailed(err error) {
	s.mu.Lock()
	waiting := s.upgrading
	s.upgrading = nil
	s.mu.Unlock()
	for c, ids := range waiting {
		for _, id := range ids {
			c.out.enqueue(encodeError(id, wire.CodeUpgradeFailed, err.Error(), nil), false)
		}
	}
}
