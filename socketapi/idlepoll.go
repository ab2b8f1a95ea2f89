package socketapi

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"
)

// idlePoller waits for the server's idle connections with one goroutine.
// A connection that has waited Server.IdleHandoff for a request ends its
// read loop and is parked here, in an epoll set of the server's own; a
// fresh read loop starts when the peer sends a byte or hangs up, or when
// the connection is closed. A parked connection keeps no goroutine, hence
// no stack: with ten thousand idle sessions, the stacks were the largest
// part of the agent's memory, and they count again in the heap's goal.
//
// The socket stays in Go's own poller as well; the read loop that starts
// reads it as any other.
//
// The goroutines that end when their connections park leave their stacks
// free in the heap: after a burst of requests on many connections, tens
// of megabytes (a request's stack grows to 8 KiB), which the runtime
// returns to the system only after its next collection, and an agent that
// allocates little may run that only two minutes later. So once
// freeAfterParks connections have parked, and then none for freeDelay,
// the poller calls free (Server.AfterIdleBurst), at most once every
// freeEvery: once a burst is over, not at every lull of a busy agent.
type idlePoller struct {
	epfd     int
	stopPipe [2]int // a pipe whose read end, when readable, stops run
	done     chan struct{}
	free     func() // called after a burst of parks; nil: never

	mu        sync.Mutex
	parked    map[int32]func() // each parked socket's read function, by descriptor
	closed    bool
	parks     int         // since free last ran
	lastFree  time.Time   // when free last ran
	freeTimer *time.Timer // runs free once parking pauses
	freeing   sync.WaitGroup
}

// A burst of parks after which free runs, the pause after it, and the
// least time between two runs.
const (
	freeAfterParks = 1000
	freeDelay      = time.Second
	freeEvery      = time.Minute
)

// newIdlePoller creates the epoll set and starts its goroutine; free, if
// not nil, is called after a burst of parks.
func newIdlePoller(free func()) (*idlePoller, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	p := &idlePoller{epfd: epfd, done: make(chan struct{}), free: free, parked: make(map[int32]func())}
	if err := syscall.Pipe2(p.stopPipe[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		syscall.Close(epfd)
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(p.stopPipe[0])}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, p.stopPipe[0], &ev); err != nil {
		p.closeFDs()
		return nil, fmt.Errorf("epoll_ctl: %w", err)
	}
	go p.run()
	return p, nil
}

// park watches the open socket fd until it is readable (bytes or a
// hang-up), or unpark: then it runs read in a new goroutine. False if the
// poller cannot take it: the caller reads on.
func (p *idlePoller) park(fd int32, read func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	// One-shot: the socket is watched until its first readiness, which
	// epoll reports at once if bytes or a hang-up are already there.
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: fd}
	if err := syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev); err != nil {
		return false
	}
	p.parked[fd] = read
	if p.free == nil {
		return true
	}
	if p.parks++; p.parks >= freeAfterParks {
		delay := max(freeDelay, time.Until(p.lastFree.Add(freeEvery)))
		if p.freeTimer == nil {
			p.freeTimer = time.AfterFunc(delay, p.freeMemory)
		} else if p.freeTimer.Reset(delay) {
			return true
		}
		p.freeing.Add(1) // a new run of freeMemory is due
	}
	return true
}

// freeMemory runs free after a burst of parks.
func (p *idlePoller) freeMemory() {
	defer p.freeing.Done()
	p.mu.Lock()
	p.parks, p.lastFree = 0, time.Now()
	closed := p.closed
	p.mu.Unlock()
	if !closed {
		p.free()
	}
}

// unpark takes fd out, if it is parked, and runs its read function, which
// finds the socket closed or what there is to read. The socket must still
// be open: while it is, no other socket has its descriptor, and once it
// is closed, another may.
func (p *idlePoller) unpark(fd int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wake(fd)
}

// wake takes fd out of the map and the epoll set, if it is there, and
// runs its read function; p.mu is held.
func (p *idlePoller) wake(fd int32) {
	read, ok := p.parked[fd]
	if !ok {
		return
	}
	delete(p.parked, fd)
	syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
	go read()
}

// run starts the read loop of each connection whose socket becomes
// readable, until close.
func (p *idlePoller) run() {
	defer close(p.done)
	events := make([]syscall.EpollEvent, 128)
	for {
		n, err := syscall.EpollWait(p.epfd, events, -1)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			// Not expected of a valid epoll set; the connections parked
			// go back to reading in goroutines of their own.
			p.stop()
			return
		}
		p.mu.Lock()
		for _, ev := range events[:n] {
			if ev.Fd == int32(p.stopPipe[0]) {
				p.mu.Unlock()
				return
			}
			// An event of a socket already unparked (and its descriptor
			// perhaps given to another since) at worst starts a read
			// loop that waits as usual.
			p.wake(ev.Fd)
		}
		p.mu.Unlock()
	}
}

// stop stops parking and unparks every connection parked.
func (p *idlePoller) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for fd := range p.parked {
		p.wake(fd)
	}
}

// close stops the poller once no connection is parked (Serve's
// connections have all finished) and releases its descriptors.
func (p *idlePoller) close() {
	p.stop()
	p.mu.Lock()
	if p.freeTimer != nil && p.freeTimer.Stop() {
		p.freeing.Done() // the run due will not happen
	}
	p.mu.Unlock()
	p.freeing.Wait()
	syscall.Write(p.stopPipe[1], []byte{0})
	<-p.done
	p.closeFDs()
}

func (p *idlePoller) closeFDs() {
	syscall.Close(p.stopPipe[0])
	syscall.Close(p.stopPipe[1])
	syscall.Close(p.epfd)
}
