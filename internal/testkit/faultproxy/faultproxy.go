// Package faultproxy is a TCP proxy for fault injection between agents and
// Redis, owned by the tests: a test points an agent at Proxy.Addr instead of
// Redis and switches the proxy between passing, black-holing, delaying and
// refusing traffic, or resets every connection, at any moment. Nothing in
// the agent imports it.
//
// It stands in for tc netem, which these machines lack. Faults act on whole
// chunks as read from a socket, so they model a slow or partitioned network
// path, not lost packets: TCP never loses data in the middle of a stream.
package faultproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

const (
	dialTimeout = 5 * time.Second
	bufSize     = 32 << 10
)

// mode is what the proxy does with traffic.
type mode int

const (
	modePass mode = iota
	modeBlackhole
	modeDelay
	modeRefuse
)

// Proxy forwards TCP connections from its loopback address to a target. It
// owns every goroutine it starts and waits for them at the test's cleanup.
// Its methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup // the accept loop and every connection's goroutines

	mu        sync.Mutex // guards the fields below
	mode      mode
	delay     time.Duration      // with modeDelay
	changed   chan struct{}      // closed and replaced at every mode change, to wake held chunks
	links     map[*link]struct{} // open connections
	accepted  int
	closed    bool
	acceptErr error // why the accept loop ended early, reported at cleanup
}

// link is one proxied connection: the client's side and, once dialed, the
// target's. Its goroutines are serve (client to target) and one more
// (target to client).
type link struct {
	client net.Conn
	done   chan struct{} // closed when the link is torn down

	// Guarded by Proxy.mu.
	upstream   net.Conn           // nil until dialed
	cancelDial context.CancelFunc // non-nil while dialing
	closed     bool
}

// New starts a proxy on 127.0.0.1 (a free port) that forwards every
// connection to target, in pass mode. At the test's cleanup it stops
// listening, resets every connection and waits for all its goroutines.
func New(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("faultproxy: %v", err)
	}
	p := &Proxy{
		target:  target,
		ln:      ln,
		changed: make(chan struct{}),
		links:   make(map[*link]struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(func() {
		p.close()
		p.mu.Lock()
		err := p.acceptErr
		p.mu.Unlock()
		if err != nil {
			tb.Errorf("faultproxy: accept: %v", err)
		}
	})
	return p
}

// Addr returns the proxy's host:port, to give clients instead of the
// target's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Conns returns how many connections the proxy has accepted so far,
// including the ones it refused.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Pass forwards traffic as it comes, including what Blackhole held and
// what Delay is still holding.
func (p *Proxy) Pass() { p.setMode(modePass, 0) }

// Blackhole stops forwarding in both directions on every connection,
// existing and new: data is held, unread beyond one chunk per direction, so
// TCP's flow control stalls the senders, and clients see timeouts, never
// resets. New connections are accepted but not dialed to the target until
// the black hole ends. When it ends, held data goes through, late, as it
// would after a real partition heals: a command sent into the black hole
// may still be applied.
func (p *Proxy) Blackhole() { p.setMode(modeBlackhole, 0) }

// Delay forwards each chunk d after it was read, in order, in both
// directions, so a request/response round trip takes at least 2*d longer.
// Data that arrives while a chunk waits is read after it, so under
// pipelining the added latency can reach 2*d per direction.
func (p *Proxy) Delay(d time.Duration) { p.setMode(modeDelay, d) }

// Refuse resets every existing connection and, until the mode changes,
// resets new ones as soon as they are accepted.
func (p *Proxy) Refuse() { p.setMode(modeRefuse, 0) }

// ResetAll resets every current connection (RST to the client and the
// target) now; the mode is unchanged and new connections are served as it
// says.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	links := p.openLinks()
	p.mu.Unlock()
	for _, l := range links {
		p.reset(l)
	}
}

func (p *Proxy) setMode(m mode, d time.Duration) {
	p.mu.Lock()
	p.mode, p.delay = m, d
	close(p.changed)
	p.changed = make(chan struct{})
	var links []*link
	if m == modeRefuse {
		links = p.openLinks()
	}
	p.mu.Unlock()
	for _, l := range links {
		p.reset(l)
	}
}

// openLinks returns the open links. p.mu must be held.
func (p *Proxy) openLinks() []*link {
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	return links
}

// close stops the proxy: no new connections, every link reset, every
// goroutine finished.
func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	links := p.openLinks()
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, l := range links {
		p.reset(l)
	}
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			p.mu.Lock()
			if !p.closed {
				p.acceptErr = err
			}
			p.mu.Unlock()
			return
		}
		p.mu.Lock()
		p.accepted++
		if p.closed || p.mode == modeRefuse {
			p.mu.Unlock()
			resetConn(c)
			continue
		}
		l := &link{client: c, done: make(chan struct{})}
		p.links[l] = struct{}{}
		// Added under p.mu while !p.closed, so close's Wait sees it.
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(l)
	}
}

// serve dials the target for l and forwards client to target, while a
// second goroutine forwards target to client; it returns when both are done.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	defer p.drop(l)

	// Hold a new connection while black-holed: dialing a target that is
	// down would reset it, and a black hole answers nothing.
	if !p.gate(l, time.Time{}) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	p.mu.Lock()
	if l.closed {
		p.mu.Unlock()
		return
	}
	l.cancelDial = cancel
	p.mu.Unlock()
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp", p.target)
	p.mu.Lock()
	l.cancelDial = nil
	if err == nil && l.closed {
		_ = up.Close()
		err = net.ErrClosed
	}
	if err == nil {
		l.upstream = up
	}
	p.mu.Unlock()
	if err != nil {
		// The target is down (or the link was reset): tell the client the
		// way a refused connection would.
		p.reset(l)
		return
	}

	back := make(chan struct{})
	p.wg.Add(1) // serve's own count keeps close's Wait from returning first
	go func() {
		defer p.wg.Done()
		defer close(back)
		p.pump(l, up, l.client)
	}()
	p.pump(l, l.client, up)
	<-back
}

// pump copies src to dst chunk by chunk, each chunk passing the gate first.
// A clean EOF is passed on as a half-close; any error resets the link.
func (p *Proxy) pump(l *link, src, dst net.Conn) {
	buf := make([]byte, bufSize)
	for {
		n, err := src.Read(buf)
		readAt := time.Now()
		if n > 0 {
			if !p.gate(l, readAt) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				p.reset(l)
				return
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			// A FIN is traffic too: a black hole holds it.
			if p.gate(l, readAt) {
				if cw, ok := dst.(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite()
				}
			}
			return
		default:
			p.reset(l)
			return
		}
	}
}

// gate waits until the mode lets a chunk read at readAt through, and
// reports whether it may be forwarded (false: the link was torn down). It
// re-evaluates at every mode change, so switching modes affects chunks
// already held.
func (p *Proxy) gate(l *link, readAt time.Time) bool {
	for {
		p.mu.Lock()
		m, d, changed := p.mode, p.delay, p.changed
		p.mu.Unlock()

		var timer *time.Timer
		var expired <-chan time.Time // nil: wait for a mode change
		switch m {
		case modePass:
			return !isClosed(l.done)
		case modeDelay:
			left := time.Until(readAt.Add(d))
			if left <= 0 {
				return !isClosed(l.done)
			}
			timer = time.NewTimer(left)
			expired = timer.C
		case modeBlackhole, modeRefuse:
			// Refuse resets every link, so l.done closes shortly.
		}
		select {
		case <-expired:
			return !isClosed(l.done)
		case <-changed:
		case <-l.done:
		}
		if timer != nil {
			timer.Stop()
		}
		if isClosed(l.done) {
			return false
		}
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// reset tears l down with RSTs on both sides. It may be called any number
// of times, from any goroutine.
func (p *Proxy) reset(l *link) {
	p.mu.Lock()
	if l.closed {
		p.mu.Unlock()
		return
	}
	l.closed = true
	close(l.done)
	if l.cancelDial != nil {
		l.cancelDial()
	}
	up := l.upstream
	p.mu.Unlock()
	resetConn(l.client)
	if up != nil {
		resetConn(up)
	}
}

// drop forgets l once its goroutines are done, closing both sides (a no-op
// if reset already did).
func (p *Proxy) drop(l *link) {
	p.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.done)
	}
	delete(p.links, l)
	up := l.upstream
	p.mu.Unlock()
	_ = l.client.Close()
	if up != nil {
		_ = up.Close()
	}
}

// resetConn closes c with an RST instead of a FIN.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
