package socketapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/internal/peerlog"
	"github.com/lockagent/lockagent/internal/wire"
)

// Server serves the wire protocol for an agent. Set the fields, then call
// Serve; zero values take the defaults noted.
type Server struct {
	Agent  *agent.Agent // required
	Logger hclog.Logger // default: a null logger

	MaxLineBytes   int // default 65536
	MaxConns       int // open connections; beyond it a connection is refused (admins have agent.AdminReserve more). Default 10000
	MaxConnsPerUID int // open connections of one uid; 0: no cap beyond MaxConns
	MaxQueueBytes  int // unwritten output per connection before it is cut off, its longest line aside; default 1 MiB
	// MaxOutputBytes bounds the output not yet written of all the
	// connections, and MaxOutputBytesPerUID that of the connections of one
	// uid (see outputBudget). Defaults 64 MiB and 16 MiB.
	MaxOutputBytes, MaxOutputBytesPerUID int
	WriteTimeout                         time.Duration // a write blocked longer cuts the connection off; default 10s
	// LineTimeout is how long a line may take to arrive once its first
	// byte has: a connection that starts a line and never ends it is
	// closed. Default 10s.
	LineTimeout time.Duration
	// IdleHandoff is how long, after the first request it handled, a
	// connection waits for the next in a goroutine of its own: then it
	// waits in the server's idle poller, without a goroutine, so that
	// thousands of idle connections do not each keep a stack. Default 1s.
	IdleHandoff time.Duration
	// AfterIdleBurst, if set, is called once a burst of connections has
	// gone idle, at most once a minute: their goroutines have ended and
	// left their stacks free in the heap, tens of megabytes after a
	// burst of thousands, which the runtime returns to the system only
	// after its next collection. The agent returns them at once
	// (debug.FreeOSMemory).
	AfterIdleBurst func()

	// GroupsOf returns the groups of a uid, for ACL rules and admin
	// groups; the answers are kept for a few seconds. Default GroupsOfUID.
	GroupsOf func(uid uint32) ([]uint32, error)

	// PeerLog rate-limits the log lines a peer causes; share the
	// agent's. Default: one of its own (peerlog.Default).
	PeerLog *peerlog.Limiter

	// Observer, if set, is told of connections cut off and answers
	// refused, for metrics.
	Observer Observer

	// Upgrade, if set, starts an upgrade, for the upgrade op: it returns
	// at once, and the op is answered once the upgrade has ended: by the
	// new process, or by UpgradeFailed here. Without it the op is refused.
	Upgrade func()
	// Upgraded is when an upgrade handed the agent over to this process,
	// and Upgrading how long its clients waited for it; zero if none did.
	Upgraded  time.Time
	Upgrading time.Duration

	groups *groupCache
	budget *outputBudget
	lists  *turns // see conn.list
	gate   gate   // the handover's (see Freeze)
	// frozeAt is when the last Freeze began; set under mu, read while
	// frozen.
	frozeAt time.Time
	// The connections a handover's new process took before the freeze
	// (see Prepare), by id.
	prepared map[uint64]*conn

	// A handover's connections (see Adopt), which Serve goes on with.
	adopted []adopted
	gone    []string // sessions whose connection was ending
	resumed map[string]*agent.Pending

	// mu guards the connections and the listener, which Serve sets, and
	// the upgrade ops waiting for the upgrade's end.
	mu        sync.Mutex
	lastID    uint64 // the last connection's id
	upgrading map[*conn][]json.RawMessage
	conns     map[*conn]struct{}
	perUID    map[uint32]int // open connections by uid
	ln        *Listener
	wg        sync.WaitGroup // every connection's goroutines

	// While a handover sends the connections' descriptors (see
	// Connections), sockets are not closed but kept: a descriptor must
	// not be reused before it is sent. Nil otherwise. keepMu is taken
	// with no other lock of the server's held, or an output's alone.
	keepMu sync.Mutex
	keep   []*net.UnixConn
}

func (s *Server) setDefaults() {
	if s.Logger == nil {
		s.Logger = hclog.NewNullLogger()
	}
	if s.MaxLineBytes == 0 {
		s.MaxLineBytes = 64 << 10
	}
	if s.MaxConns == 0 {
		s.MaxConns = 10000
	}
	if s.MaxQueueBytes == 0 {
		s.MaxQueueBytes = 1 << 20
	}
	if s.MaxOutputBytes == 0 {
		s.MaxOutputBytes = 64 << 20
	}
	if s.MaxOutputBytesPerUID == 0 {
		s.MaxOutputBytesPerUID = 16 << 20
	}
	if s.WriteTimeout == 0 {
		s.WriteTimeout = 10 * time.Second
	}
	if s.LineTimeout == 0 {
		s.LineTimeout = 10 * time.Second
	}
	if s.IdleHandoff == 0 {
		s.IdleHandoff = time.Second
	}
	if s.GroupsOf == nil {
		s.GroupsOf = GroupsOfUID
	}
	if s.budget != nil {
		return // set already (Adopt, then Serve)
	}
	s.groups = &groupCache{lookup: s.GroupsOf, ttl: groupCacheTTL}
	s.budget = newOutputBudget(s.MaxOutputBytes, s.MaxOutputBytesPerUID)
	s.lists = &turns{}
	if s.PeerLog == nil {
		s.PeerLog = peerlog.Default()
	}
}

// Observer is told what the server does to clients that do not read what
// it sends. Its methods must not block.
type Observer interface {
	// CutOff counts a connection cut off, for reason: one of the Cut
	// constants.
	CutOff(reason string)
	// AnswerRefused counts an answer that did not fit the output budget,
	// and went as limit_exceeded (see outputBudget).
	AnswerRefused()
}

// Why a connection is cut off (Observer.CutOff).
const (
	CutWriteTimeout = "write_timeout" // a write made no progress for WriteTimeout
	CutQueue        = "queue"         // its queue passed MaxQueueBytes
	CutUIDOutput    = "uid_output"    // its uid's unread output passed MaxOutputBytesPerUID
	CutAgentOutput  = "agent_output"  // all the unread output passed MaxOutputBytes
)

// groupCacheTTL is how long the groups of a uid are kept.
const groupCacheTTL = 10 * time.Second

// Serve accepts connections on ln until ctx is done. Then it stops
// accepting, waits for the agent to finish its shutdown (which tells every
// session and closes its connection), closes what connections remain, and
// returns nil once every connection's goroutines have finished. The
// listener is closed (and the socket file Listen bound removed) when Serve
// returns.
func (s *Server) Serve(ctx context.Context, ln *Listener) error {
	s.setDefaults()
	idle, err := newIdlePoller(s.AfterIdleBurst)
	if err != nil {
		s.Logger.Warn("idle connections will each keep a goroutine", "error", err)
	} else {
		defer idle.close()
	}
	s.mu.Lock()
	s.conns, s.perUID, s.ln = make(map[*conn]struct{}), make(map[uint32]int), ln
	s.mu.Unlock()
	s.goOn(ctx, idle)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()

	var backoff time.Duration
	s.gate.enter()
	for {
		var nc *net.UnixConn
		nc, err = ln.AcceptUnix()
		if err != nil && s.gate.frozen() && ctx.Err() == nil {
			// Stopped for a handover (see Freeze): it takes the backlog.
			s.gate.pause()
			ln.SetDeadline(time.Time{})
			continue
		}
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				err = nil
				break
			}
			// Out of descriptors, or another passing failure: keep serving
			// the connections there are, and try again a little later.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.Logger.Warn("accept failed; retrying", "error", err, "in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			continue
		}
		backoff = 0
		var peer agent.Peer
		peer, err = peerOf(nc)
		if err != nil {
			s.Logger.Warn("connection refused", "error", err)
			nc.Close()
			continue
		}
		s.mu.Lock()
		n := len(s.conns)
		full := n >= s.MaxConns && (n >= s.MaxConns+agent.AdminReserve || !s.admin(peer))
		fullUID := s.MaxConnsPerUID > 0 && s.perUID[peer.UID] >= s.MaxConnsPerUID
		s.mu.Unlock()
		if full || fullUID {
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.refuse(nc, peer, fullUID)
			}()
			continue
		}
		c := newConn(s, nc, idle, peer)
		s.register(c)
		go c.serve()
	}
	s.gate.exit()
	ln.Close()
	if ctx.Err() != nil {
		<-s.Agent.Done()
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// register counts c among the server's connections until it ends. Its
// requests end with it, not with the server's context ctx: at shutdown
// the agent answers them itself.
func (s *Server) register(c *conn) {
	uid := c.peer.UID
	c.ended = func() {
		s.mu.Lock()
		delete(s.conns, c)
		if s.perUID[uid]--; s.perUID[uid] == 0 {
			delete(s.perUID, uid)
		}
		s.mu.Unlock()
		s.wg.Done()
	}
	s.mu.Lock()
	if c.id == 0 {
		s.lastID++
		c.id = s.lastID
	}
	s.conns[c] = struct{}{}
	s.perUID[uid]++
	s.mu.Unlock()
	s.wg.Add(1)
}

// closeSocket closes a connection's socket, unless a handover is sending
// the descriptors (see Connections).
func (s *Server) closeSocket(nc *net.UnixConn) {
	s.keepMu.Lock()
	if s.keep != nil {
		s.keep = append(s.keep, nc)
		s.keepMu.Unlock()
		return
	}
	s.keepMu.Unlock()
	nc.Close()
}

// admin tells whether peer is an admin, its groups looked up (a peer's
// groups are otherwise read once its connection is served).
func (s *Server) admin(peer agent.Peer) bool {
	peer.Groups, _ = s.groups.groups(peer.UID)
	return s.Agent.IsAdmin(peer)
}

// connFD is the socket's file descriptor, or -1, and its raw
// connection, or nil.
func connFD(nc *net.UnixConn) (int32, syscall.RawConn) {
	fd := int32(-1)
	rc, err := nc.SyscallConn()
	if err != nil {
		return fd, nil
	}
	rc.Control(func(d uintptr) { fd = int32(d) })
	return fd, rc
}

// refuse answers a connection beyond a cap with an error line and closes
// it, rather than leave it waiting in the backlog.
func (s *Server) refuse(nc *net.UnixConn, p agent.Peer, perUID bool) {
	msg, limit := "too many connections", s.MaxConns
	if perUID {
		msg, limit = fmt.Sprintf("too many connections for uid %d", p.UID), s.MaxConnsPerUID
	}
	s.PeerLog.Log(s.Logger, hclog.Warn, p.UID, "connection refused: "+msg, "pid", p.PID, "uid", p.UID, "max", limit)
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(refuseLinger))
	if _, err := nc.Write(encodeError(nil, wire.CodeLimitExceeded, msg, nil)); err != nil {
		return
	}
	// Closed with the client's first request unread, the socket would
	// fail the client's write of it, and a client whose write fails may
	// never read the reason (asyncio drops what it has not read). So the
	// reason is followed by the end of the output, and what the client
	// sends meanwhile is read and dropped, until it closes or for
	// refuseLinger at most.
	nc.CloseWrite()
	io.Copy(io.Discard, nc)
}

// refuseLinger bounds the life of a refused connection.
const refuseLinger = 100 * time.Millisecond
