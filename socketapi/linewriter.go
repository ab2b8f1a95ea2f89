package socketapi

import (
	"net"
	"os"
	"syscall"
	"time"

	"github.com/lockagent/lockagent/internal/rawsock"
)

// lineWriter writes a connection's lines, one writer at a time (drain).
//
// Setting a write deadline updates a runtime timer, which cost more than
// the write of an answer itself. About every line fits in the socket's
// buffer, so lines are first offered to the kernel without waiting, and
// only what the kernel does not take at once waits, with the deadline.
// The deadline is set anew after every write that makes progress, so that
// a client that keeps reading gets a large answer however long it takes,
// and is cut off only once a write has been blocked for the whole timeout.
// It is cleared after, so that a deadline past never fails a later write.
type lineWriter struct {
	nc      *net.UnixConn
	raw     syscall.RawConn // nc's; nil only if nc was closed: writes fail
	timeout time.Duration
	offer   func(fd uintptr) bool // w.offerLines, made once

	// What is left of the lines being written, whether offerLines waits
	// for the socket, and the outcome of its last system call.
	lines [][]byte
	wait  bool
	n     int
	err   error
	// rest is, after writeLines failed, what it did not write: the rest
	// of the line it was writing, and the lines after.
	rest [][]byte

	one [1][]byte // write's lines, without an allocation
}

func newLineWriter(nc *net.UnixConn, raw syscall.RawConn, timeout time.Duration) *lineWriter {
	w := &lineWriter{nc: nc, raw: raw, timeout: timeout}
	w.offer = w.offerLines
	return w
}

// write writes line whole, or fails.
func (w *lineWriter) write(line []byte) error {
	w.one[0] = line
	err := w.writeLines(w.one[:])
	w.one[0] = nil
	return err
}

// writeLines writes lines whole, or fails; they go in one system call when
// the socket takes them. It uses lines up: their elements are changed.
func (w *lineWriter) writeLines(lines [][]byte) error {
	if w.raw == nil {
		return net.ErrClosed
	}
	w.lines = lines
	defer func() { w.lines = nil }()
	w.rest = nil
	for {
		if err := w.raw.Write(w.offer); err != nil {
			w.rest = w.lines
			return err // closed, or blocked for the whole timeout
		}
		if w.err != nil && w.err != syscall.EAGAIN {
			w.rest = w.lines
			return os.NewSyscallError("write", w.err)
		}
		w.lines = consume(w.lines, w.n)
		if len(w.lines) == 0 {
			break
		}
		// The kernel took what it could: wait for it to take the rest,
		// for at most the timeout from now.
		w.wait = true
		w.nc.SetWriteDeadline(time.Now().Add(w.timeout))
	}
	if w.wait {
		w.wait = false
		w.nc.SetWriteDeadline(time.Time{})
	}
	return nil
}

// offerLines writes what the kernel takes of w.lines now. Unless w.wait is
// set, it never waits; if it is, it waits (returning false, for the poller
// to call it again once the socket is writable) only while the kernel
// takes nothing.
func (w *lineWriter) offerLines(fd uintptr) bool {
	var n int
	var errno syscall.Errno
	if len(w.lines) == 1 {
		n, errno = rawsock.Write(fd, w.lines[0])
	} else {
		n, errno = rawsock.Writev(fd, w.lines[:min(len(w.lines), maxIOV)])
	}
	w.n, w.err = n, nil
	if errno != 0 {
		w.err = errno
	}
	return !w.wait || errno != syscall.EAGAIN
}

// maxIOV is the most buffers one writev takes (IOV_MAX on Linux).
const maxIOV = 1024

// consume drops the first n bytes of lines.
func consume(lines [][]byte, n int) [][]byte {
	for len(lines) > 0 && n >= len(lines[0]) {
		n -= len(lines[0])
		lines[0] = nil
		lines = lines[1:]
	}
	if len(lines) > 0 {
		lines[0] = lines[0][n:]
	}
	return lines
}
