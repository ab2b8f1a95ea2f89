// Package rawsock reads and writes sockets without waking the Go
// runtime's monitor thread.
//
// A goroutine that makes a system call through package syscall tells the
// scheduler first (entersyscall), so that the monitor (sysmon) can take
// its processor back should the call block. When every processor has
// been idle, the monitor sleeps, and the first such call wakes it: the
// waker pays a futex wake-up, and the monitor then polls every 20 µs for a
// while before it sleeps again. An agent serving one session at a time
// goes idle between every request and every backend answer, so on a
// virtual machine, where a wake-up is dear, that came to half its context
// switches and a fifth of its CPU per acquire and release
// (docs/performance.md).
//
// A read or a write on a non-blocking socket never blocks: it returns what
// the kernel has at once, or EAGAIN, and the runtime's poller does the
// waiting, as it does for package net. Such calls can go as raw system
// calls, which leave the monitor asleep. This package makes them so, for
// the sockets of package net, with their deadlines and their poller. It
// takes every call on a request's path to keep the monitor asleep: one
// left, such as go-redis's check of a pooled connection, wakes it all the
// same, hence Conn.SyscallConn.
package rawsock

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Read reads from the socket of raw into b, waiting in the runtime's
// poller (and by the socket's read deadline) until something or the end
// is there. It returns io.EOF at the end.
func Read(raw syscall.RawConn, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	op := ops.Get().(*op)
	defer op.done()
	op.b = b
	err := raw.Read(op.read)
	n, errno := op.n, op.errno
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, os.NewSyscallError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// op is a read or a write of the socket in the runtime's poller: its
// functions, made once, are what syscall.RawConn runs, so that a call
// allocates no closure.
type op struct {
	b           []byte
	n           int
	errno       syscall.Errno
	read, write func(fd uintptr) bool
}

// ops holds the ops not in use.
var ops = sync.Pool{New: func() any {
	o := &op{}
	o.read, o.write = o.readFD, o.writeFD
	return o
}}

// done puts o back, holding nothing.
func (o *op) done() {
	o.b, o.n, o.errno = nil, 0, 0
	ops.Put(o)
}

// readFD reads into o.b once, as RawConn.Read's function: false when
// there is nothing to read yet.
func (o *op) readFD(fd uintptr) bool {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&o.b[0])), uintptr(len(o.b)))
		if e == syscall.EINTR {
			continue
		}
		o.n, o.errno = int(r), e
		return e != syscall.EAGAIN
	}
}

// writeFD writes what is left of o.b once (o.n is written already), as
// RawConn.Write's function: false when the kernel takes nothing yet.
func (o *op) writeFD(fd uintptr) bool {
	n, e := Write(fd, o.b[o.n:])
	o.n += n
	o.errno = e
	return e != syscall.EAGAIN
}

// Write writes b to fd once, without waiting: what the kernel takes now,
// or EAGAIN. It is for the functions a syscall.RawConn's Write calls.
func Write(fd uintptr, b []byte) (int, syscall.Errno) {
	for {
		var p unsafe.Pointer
		if len(b) > 0 {
			p = unsafe.Pointer(&b[0])
		}
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(p), uintptr(len(b)))
		if e != syscall.EINTR {
			if e != 0 {
				return 0, e
			}
			return int(r), 0
		}
	}
}

// Writev writes bufs to fd once, in one call, without waiting, as Write.
// bufs has at most IOV_MAX (1024) elements.
func Writev(fd uintptr, bufs [][]byte) (int, syscall.Errno) {
	iov := make([]syscall.Iovec, 0, len(bufs))
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		v := syscall.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		iov = append(iov, v)
	}
	if len(iov) == 0 {
		return 0, 0
	}
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		if e != syscall.EINTR {
			if e != 0 {
				return 0, e
			}
			return int(r), 0
		}
	}
}

// WriteAll writes b whole to the socket of raw, waiting in the runtime's
// poller (and by the socket's write deadline) while the kernel takes
// nothing.
func WriteAll(raw syscall.RawConn, b []byte) (int, error) {
	op := ops.Get().(*op)
	defer op.done()
	op.b = b
	for op.n < len(b) {
		if err := raw.Write(op.write); err != nil {
			return op.n, err
		}
		if op.errno != 0 {
			return op.n, os.NewSyscallError("write", op.errno)
		}
	}
	return op.n, nil
}

// Conn is a TCP or Unix connection whose reads and writes are raw system
// calls; the rest (deadlines, addresses, Close) is the connection's own.
type Conn struct {
	net.Conn
	raw syscall.RawConn
}

// SyscallConn offers the socket to checks that peek at it without
// waiting, such as go-redis's health check of a pooled connection before
// each command, which would otherwise make a system call of their own on
// every use. Its Read first peeks with a raw system call: when the socket
// has nothing to read, which is what such a check finds on a healthy idle
// connection, Read returns at once without calling f; when it has data,
// its end or an error, f runs on the socket and finds them. It is not for
// a function that waits for data: that one would not be called.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return peekConn{c.raw}, nil }

// peekConn is Conn's syscall.RawConn (see Conn.SyscallConn).
type peekConn struct{ syscall.RawConn }

// Read runs f on the socket if it has anything to read, and returns.
func (p peekConn) Read(f func(fd uintptr) bool) error {
	return p.RawConn.Read(func(fd uintptr) bool {
		if nothingToRead(fd) {
			return true
		}
		return f(fd)
	})
}

// nothingToRead tells whether the socket fd has no data, no end and no
// error to read now.
func nothingToRead(fd uintptr) bool {
	var b [1]byte
	for {
		_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		if e != syscall.EINTR {
			return e == syscall.EAGAIN
		}
	}
}

// Wrap returns c as a Conn if it is a socket of package net, or c itself.
func Wrap(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{Conn: c, raw: raw}
}

// Read reads from the connection, as net.Conn's Read.
func (c *Conn) Read(b []byte) (int, error) {
	n, err := Read(c.raw, b)
	if err != nil && err != io.EOF {
		return n, &net.OpError{Op: "read", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return n, err
}

// Write writes b whole to the connection, as net.Conn's Write.
func (c *Conn) Write(b []byte) (int, error) {
	n, err := WriteAll(c.raw, b)
	if err != nil {
		return n, &net.OpError{Op: "write", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return n, nil
}

// Dialer returns a dial function for go-redis's Options.Dialer: it dials
// TCP or Unix sockets within timeout, as go-redis's own, wraps them as
// Conn, and runs TLS over them with tlsConfig, if not nil (the server's
// name taken from the address unless the config names one).
func Dialer(timeout time.Duration, tlsConfig *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c = Wrap(c)
		if tlsConfig == nil {
			return c, nil
		}
		cfg := tlsConfig
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		tc := tls.Client(c, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		return tc, nil
	}
}
