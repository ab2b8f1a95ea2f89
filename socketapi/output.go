package socketapi

import (
	"errors"
	"os"
	"slices"
	"sync"
	"time"
)

// output is a connection's lines on their way to the peer: a bounded queue
// that answers and events are added to, and exactly one writer at a time
// that drains it. A peer that does not keep up is cut off: its socket is
// closed.
type output struct {
	w        *lineWriter
	maxBytes int // the bound on what waits, its longest line aside

	// closeSocket closes the connection's socket; it is called once, with
	// mu held, and must not block.
	closeSocket func()
	// warn and debug log what happens to the connection, with its peer;
	// cut, if set, counts its cut-off, for a reason of the Cut constants.
	warn, debug func(msg string, args ...any)
	cut         func(reason string)

	// budget, if set, bounds what the connections of uid, and all of
	// them, may hold unwritten. It guards charged and released.
	budget   *outputBudget
	uid      uint32
	charged  int  // the bytes of lines charged to the budget, not yet written
	released bool // charged nothing more: closed, or cut off

	mu      sync.Mutex
	lines   [][]byte
	spare   [][]byte // the other of two queues that drain swaps
	bytes   int      // the bytes of lines
	longest int      // the longest of lines
	held    [][]byte // events held back until the hello response is queued
	holding bool
	pushed  uint64  // lines ever put in lines
	wrote   uint64  // lines ever written
	flushes []flush // see written
	writing bool    // a goroutine is draining lines; it is the only writer
	closing bool    // close once lines is drained
	closed  bool
	frozen  bool // for a handover (see Server.Freeze): nothing is written

	writers sync.WaitGroup // the goroutines draining lines
}

// flush is a wait for the lines queued up to a point to be written.
type flush struct {
	upTo uint64 // output.pushed at the time, and the lines held back
	done chan struct{}
}

// send queues an event's line, or holds it back (see hold).
func (o *output) send(line []byte) {
	if !o.charge(len(line), false) {
		return
	}
	o.mu.Lock()
	if o.holding {
		o.held = append(o.held, line)
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()
	o.put(line, false)
}

// hold makes send keep events back, so that the events a resumed session
// missed come right after the hello response, in order.
func (o *output) hold() {
	o.mu.Lock()
	o.holding = true
	o.mu.Unlock()
}

// release queues the events held back, then lets send queue again.
func (o *output) release() {
	o.mu.Lock()
	held := o.held
	o.held, o.holding = nil, false
	for _, line := range held {
		o.push(line)
	}
	o.mu.Unlock()
	o.put(nil, true)
}

// close closes the connection once what is queued is written. It does not
// block.
func (o *output) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closing = true
	// Frozen for a handover, it closes once thawed, what is queued
	// written: the socket may be the new process's by then.
	if !o.writing && !o.closed && !o.frozen {
		o.closeNow()
	}
}

// closeNow closes the socket at once; o.mu is held.
func (o *output) closeNow() {
	o.closed = true
	o.closeSocket()
	o.flushed()
	if o.budget != nil {
		o.budget.release(o)
	}
}

// charge charges n bytes to the budget (see outputBudget.charge), and
// cuts off the outputs it must. It reports whether o was charged.
func (o *output) charge(n int, refusable bool) bool {
	if o.budget == nil || n <= 0 {
		return true
	}
	ok, cut := o.budget.charge(o, n, refusable)
	for _, c := range cut {
		c.o.cutOff(c.cause, c.reason, c.held)
	}
	return ok
}

// credit gives n bytes charged back to the budget.
func (o *output) credit(n int) {
	if o.budget != nil && n > 0 {
		o.budget.credit(o, n)
	}
}

// cutOff closes the socket at once: the budget had to take back what o
// held, for cause (a Cut constant), which reason says for the log.
func (o *output) cutOff(cause, reason string, held int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		o.warn("slow consumer cut off: "+reason, "held_bytes", held)
		o.counted(cause)
		o.closeNow()
	}
}

// counted counts a cut-off, if anybody counts them.
func (o *output) counted(reason string) {
	if o.cut != nil {
		o.cut(reason)
	}
}

// whileOpen runs f, which must not block, with the socket sure to stay open
// meanwhile; it reports f's result, or false if the socket is closed.
func (o *output) whileOpen(f func() bool) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.closed && f()
}

// written returns a channel closed once every line queued so far, events
// held back included, has been written, or the connection has closed.
func (o *output) written() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	upTo := o.pushed + uint64(len(o.held))
	done := make(chan struct{})
	if o.closed || o.wrote >= upTo {
		close(done)
		return done
	}
	o.flushes = append(o.flushes, flush{upTo, done})
	return done
}

// flushed ends the waits of written that the lines written so far
// satisfy, or all of them once the connection is closed. o.mu is held.
func (o *output) flushed() {
	o.flushes = slices.DeleteFunc(o.flushes, func(f flush) bool {
		if o.closed || o.wrote >= f.upTo {
			close(f.done)
			return true
		}
		return false
	})
}

// queue adds a line without writing it: the caller has the agent's lock
// and calls enqueue(nil, true) once it is released.
func (o *output) queue(line []byte) {
	if !o.charge(len(line), false) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		o.push(line)
	}
}

// push adds a line to the queue. o.mu is held.
func (o *output) push(line []byte) {
	o.pushed++
	o.lines = append(o.lines, line)
	o.bytes += len(line)
	o.longest = max(o.longest, len(line))
}

// enqueue adds a line (if not nil) to the queue and sees that it is
// written. inline lets the caller, if no writer is active, write it
// itself; the agent's calls (with its lock held) never do, and get a
// writer goroutine instead. A peer whose queue exceeds the bound is cut
// off: it is not reading.
func (o *output) enqueue(line []byte, inline bool) {
	if line != nil && !o.charge(len(line), false) {
		return
	}
	o.put(line, inline)
}

// answer enqueues an answer, as enqueue does. If the answer does not fit
// the room the budget leaves this connection, the line tooLarge makes goes
// in its place: the client is told, and keeps its connection.
func (o *output) answer(line []byte, tooLarge func(size int) []byte, inline bool) {
	if !o.charge(len(line), true) {
		line = tooLarge(len(line))
		if !o.charge(len(line), false) {
			return
		}
	}
	o.put(line, inline)
}

// put adds a line charged already (if not nil) to the queue, as enqueue.
func (o *output) put(line []byte, inline bool) {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return
	}
	// The bound is on what waits unwritten but for its longest line, so
	// that one large answer (a list of many sessions) still goes out to
	// a reader that keeps up, also with lines queued behind it.
	if o.bytes-o.longest > o.maxBytes {
		o.warn("slow consumer cut off", "queued_bytes", o.bytes)
		o.counted(CutQueue)
		o.closeNow()
		o.mu.Unlock()
		return
	}
	if line != nil {
		o.push(line)
	}
	if o.writing || o.frozen || len(o.lines) == 0 {
		o.mu.Unlock()
		return
	}
	o.writing = true
	o.writers.Add(1)
	o.mu.Unlock()
	if inline {
		o.drain()
	} else {
		go o.drain()
	}
}

// drain writes the queue until it is empty; only one drain runs at a time.
func (o *output) drain() {
	defer o.writers.Done()
	for {
		o.mu.Lock()
		if len(o.lines) == 0 || o.closed || o.frozen {
			o.writing = false
			if o.closing && !o.closed && !o.frozen {
				o.closeNow()
			}
			o.mu.Unlock()
			return
		}
		batch, size := o.lines, o.bytes
		o.lines, o.spare, o.bytes, o.longest = o.spare, nil, 0, 0
		o.mu.Unlock()

		var err error
		if len(batch) == 1 {
			err = o.w.write(batch[0])
		} else {
			err = o.w.writeLines(batch)
		}
		o.mu.Lock()
		written := len(batch)
		if err != nil && o.frozen && errors.Is(err, os.ErrDeadlineExceeded) {
			// Stopped for a handover (see freeze): what was not written
			// goes back at the head of the queue, a line's rest included.
			rest := slices.Clone(o.w.rest)
			o.wrote += uint64(written - len(rest))
			o.lines = append(rest, o.lines...)
			o.bytes, o.longest = 0, 0
			for _, l := range o.lines {
				o.bytes += len(l)
				o.longest = max(o.longest, len(l))
			}
			o.writing = false
			o.mu.Unlock()
			o.credit(size - sum(rest))
			return
		}
		if cap(batch) <= 64 { // keep a small queue for reuse, not a burst's
			clear(batch)
			o.spare = batch[:0]
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				o.warn("slow consumer cut off", "blocked_for", o.w.timeout)
				o.counted(CutWriteTimeout)
			} else {
				o.debug("write failed; connection closed", "error", err)
			}
			if !o.closed { // cut off meanwhile (enqueue)
				o.closeNow()
			}
			o.lines, o.bytes, o.longest = nil, 0, 0
			o.writing = false
			o.mu.Unlock()
			return
		}
		o.wrote += uint64(written)
		if len(o.flushes) > 0 {
			o.flushed()
		}
		o.mu.Unlock()
		o.credit(size)
	}
}

// freeze stops the writer for a handover: a write under way is cut short,
// and what it had not written goes back to the queue (see drain). Once
// freeze returns, nothing more is written until thaw.
func (o *output) freeze() {
	o.mu.Lock()
	o.frozen = true
	if o.writing {
		o.w.nc.SetWriteDeadline(time.Unix(1, 0))
	}
	o.mu.Unlock()
	o.writers.Wait()
}

// thaw lets the writer go on with what is queued.
func (o *output) thaw() {
	o.w.nc.SetWriteDeadline(time.Time{})
	o.mu.Lock()
	o.frozen = false
	if o.closing && !o.closed && !o.writing && len(o.lines) == 0 {
		o.closeNow() // closed while frozen (see close)
	}
	o.mu.Unlock()
	o.put(nil, false)
}

// isClosed tells whether the socket is closed.
func (o *output) isClosed() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.closed
}

// queued is what the queue holds, for a handover.
func (o *output) queued() [][]byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.lines)
}

func sum(lines [][]byte) int {
	n := 0
	for _, l := range lines {
		n += len(l)
	}
	return n
}

// answerBuf is an answer built a piece at a time, charged to the budget
// as it grows: a large answer takes no more memory than its connection has
// room for, also while it is built (its buffer's spare capacity aside).
type answerBuf struct {
	o *output
	b []byte
}

// add appends p, or reports false if the budget refuses the room for it:
// the answer is then given up (see drop).
func (a *answerBuf) add(p ...[]byte) bool {
	n := 0
	for _, q := range p {
		n += len(q)
	}
	if !a.o.charge(n, true) {
		return false
	}
	for _, q := range p {
		a.b = append(a.b, q...)
	}
	return true
}

// drop gives the answer up, and its charge back.
func (a *answerBuf) drop() {
	a.o.credit(len(a.b))
	a.b = nil
}
