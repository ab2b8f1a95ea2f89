package socketapi

import (
	"net"
	"os"
	"syscall"
	"time"
)

// lineWriter writes a connection's lines, one writer at a time (drain).
//
// Setting a write deadline updates a runtime timer, which cost more than
// the write of an answer itself. About every line fits in the socket's
// buffer, so a line is first offered to the kernel without waiting, and
// only a line the kernel does not take whole gets the deadline, for its
// rest. The deadline is cleared after such a write, so that a deadline
// past never fails a later write: a write is cut off only once it has
// been blocked for the whole timeout, as before.
type lineWriter struct {
	nc      *net.UnixConn
	raw     syscall.RawConn // nc's; nil: every write is given the deadline
	timeout time.Duration
	offer   func(fd uintptr) bool // w.offerLine, made once

	// The line being offered, and what the kernel took of it.
	line []byte
	n    int
	err  error
}

func newLineWriter(nc *net.UnixConn, raw syscall.RawConn, timeout time.Duration) *lineWriter {
	w := &lineWriter{nc: nc, raw: raw, timeout: timeout}
	w.offer = w.offerLine
	return w
}

// write writes line whole, or fails.
func (w *lineWriter) write(line []byte) error {
	if w.raw != nil {
		w.line = line
		err := w.raw.Write(w.offer)
		n, werr := w.n, w.err
		w.line, w.n, w.err = nil, 0, nil
		switch {
		case err != nil:
			return err // closed
		case werr != nil && werr != syscall.EAGAIN:
			return os.NewSyscallError("write", werr)
		case n == len(line):
			return nil
		}
		line = line[n:]
	}
	return w.waiting(func() error { _, err := w.nc.Write(line); return err })
}

// writeLines writes lines whole, or fails: they go in one system call
// when they can, with the deadline.
func (w *lineWriter) writeLines(lines [][]byte) error {
	return w.waiting(func() error {
		bufs := net.Buffers(lines)
		_, err := bufs.WriteTo(w.nc)
		return err
	})
}

// waiting runs write with the write deadline set, and clears it after.
func (w *lineWriter) waiting(write func() error) error {
	w.nc.SetWriteDeadline(time.Now().Add(w.timeout))
	if err := write(); err != nil {
		return err
	}
	w.nc.SetWriteDeadline(time.Time{})
	return nil
}

// offerLine writes what the kernel takes of w.line now, without waiting.
func (w *lineWriter) offerLine(fd uintptr) bool {
	n, err := syscall.Write(int(fd), w.line)
	for err == syscall.EINTR {
		n, err = syscall.Write(int(fd), w.line)
	}
	w.n, w.err = max(n, 0), err
	return true
}
