package socketapi

import (
	"context"
	"sync"
)

// gate is the server's side of a handover (see Server.Freeze): the
// goroutines that take requests in, the accept loop and each connection's
// read loop, pass it, and while it is frozen they wait at a line's end.
// It counts those that run.
type gate struct {
	mu      sync.Mutex
	cond    *sync.Cond // broadcast when running falls to 0, and when thawed
	closed  bool       // frozen
	running int
}

func (g *gate) init() {
	if g.cond == nil {
		g.cond = sync.NewCond(&g.mu)
	}
}

// enter waits while the gate is frozen, then counts the caller in.
func (g *gate) enter() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	for g.closed {
		g.cond.Wait()
	}
	g.running++
}

// exit counts the caller out.
func (g *gate) exit() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	if g.running--; g.running == 0 {
		g.cond.Broadcast()
	}
}

// pause counts the caller out while the gate is frozen.
func (g *gate) pause() {
	g.exit()
	g.enter()
}

// frozen tells whether the gate is frozen.
func (g *gate) frozen() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// freeze closes the gate; interrupt is called to wake those that wait for
// input, and freeze returns once none runs, or with ctx's error, the gate
// open again.
func (g *gate) freeze(ctx context.Context, interrupt func()) error {
	g.mu.Lock()
	g.init()
	g.closed = true
	g.mu.Unlock()
	interrupt()
	stop := context.AfterFunc(ctx, func() {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	defer stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.running > 0 && ctx.Err() == nil {
		g.cond.Wait()
	}
	if err := ctx.Err(); err != nil {
		g.closed = false
		g.cond.Broadcast()
		return err
	}
	return nil
}

// thaw calls before, then opens the gate; before sees what those that
// wait at the gate did before they stopped.
func (g *gate) thaw(before func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	before()
	g.closed = false
	g.cond.Broadcast()
}
