package socketapi

import (
	"bytes"
	"errors"
	"io"
)

// errLineTooLong is returned by readLine when a line exceeds the limit.
var errLineTooLong = errors.New("socketapi: line too long")

// Buffer sizes of a connection's line reader: a few bytes while idle so
// that thousands of idle sessions cost little, grown up to the line limit
// for a long line, and shrunk again after it.
const (
	idleReadBuf   = 16
	minReadBuf    = 512
	shrinkReadBuf = 16 << 10
)

// lineReader reads newline-terminated lines of at most max bytes.
type lineReader struct {
	r          io.Reader
	buf        []byte
	start, end int // buf[start:end] is read but not yet returned
	max        int
	// begun, if set, is called when a line has begun but not ended and
	// the reader is about to wait for more: once per line.
	begun     func()
	waitedFor bool // begun was called for the pending line
}

// resume makes the reader go on from input, read by another process and
// not handled (a handover).
func (lr *lineReader) resume(input []byte) {
	lr.buf = append(make([]byte, 0, max(len(input), idleReadBuf)), input...)
	lr.start, lr.end = 0, len(input)
}

// readLine returns the next line without its "\n" (nor a "\r" before it).
// The slice is valid until the next call. A line longer than max bytes is
// errLineTooLong: the reader stops at the limit and never buffers more.
func (lr *lineReader) readLine() ([]byte, error) {
	for {
		if i := bytes.IndexByte(lr.buf[lr.start:lr.end], '\n'); i >= 0 {
			line := lr.buf[lr.start : lr.start+i]
			lr.start += i + 1
			lr.waitedFor = false
			if len(line) > lr.max {
				return nil, errLineTooLong
			}
			return bytes.TrimSuffix(line, []byte{'\r'}), nil
		}
		if lr.end-lr.start > lr.max {
			return nil, errLineTooLong
		}
		if lr.end > lr.start && !lr.waitedFor && lr.begun != nil {
			lr.waitedFor = true
			lr.begun()
		}
		lr.makeRoom()
		n, err := lr.r.Read(lr.buf[lr.end:])
		lr.end += n
		if err != nil && n == 0 {
			return nil, err
		}
	}
}

// idle lets go of the buffer if nothing is pending in it, before a wait
// that may be long.
func (lr *lineReader) idle() {
	if lr.start == lr.end {
		lr.buf, lr.start, lr.end = nil, 0, 0
	}
}

// makeRoom ensures free space after end: it moves pending bytes to the
// front, grows the buffer (up to max+1 bytes of line and its newline), or
// shrinks one left large by an earlier long line.
func (lr *lineReader) makeRoom() {
	pending := lr.end - lr.start
	if lr.buf == nil {
		// What arrives first goes into a few bytes: an idle connection
		// waits on those, and the buffer grows once a line comes.
		lr.buf = make([]byte, idleReadBuf)
	}
	if len(lr.buf) > shrinkReadBuf && pending < minReadBuf {
		nb := make([]byte, minReadBuf)
		copy(nb, lr.buf[lr.start:lr.end])
		lr.buf, lr.start, lr.end = nb, 0, pending
		return
	}
	if lr.start > 0 {
		copy(lr.buf, lr.buf[lr.start:lr.end])
		lr.start, lr.end = 0, pending
	}
	if lr.end == len(lr.buf) {
		size := min(max(2*len(lr.buf), minReadBuf), lr.max+2)
		nb := make([]byte, size)
		copy(nb, lr.buf[:lr.end])
		lr.buf = nb
	}
}
