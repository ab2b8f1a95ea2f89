package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lineConn is the leanest client of the protocol: write a line, read a
// line. Every application's client does at least this much.
type lineConn struct {
	nc net.Conn
	r  *bufio.Reader
}

func dialLine(path string) (*lineConn, error) {
	// A burst of connections can fill the listener's backlog for a moment:
	// the kernel then refuses with EAGAIN.
	deadline := time.Now().Add(10 * time.Second)
	nc, err := net.Dial("unix", path)
	for errors.Is(err, syscall.EAGAIN) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		nc, err = net.Dial("unix", path)
	}
	if err != nil {
		return nil, err
	}
	return &lineConn{nc: nc, r: bufio.NewReaderSize(nc, 4096)}, nil
}

func (c *lineConn) close() error { return c.nc.Close() }

// roundTrip writes line and returns the next line that is not an event.
func (c *lineConn) roundTrip(line []byte) ([]byte, error) {
	if _, err := c.nc.Write(line); err != nil {
		return nil, err
	}
	for {
		resp, err := c.r.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		if !bytes.HasPrefix(resp, []byte(`{"event"`)) {
			return resp, nil
		}
	}
}

var leaseKey = []byte(`"lease":"`)

// acquire sends an acquire line and returns the lease id it was granted.
func (c *lineConn) acquire(line []byte) (string, error) {
	resp, err := c.roundTrip(line)
	if err != nil {
		return "", err
	}
	i := bytes.Index(resp, leaseKey)
	if i < 0 || !bytes.Contains(resp, []byte(`"acquired":true`)) {
		return "", fmt.Errorf("not granted: %s", resp)
	}
	rest := resp[i+len(leaseKey):]
	return string(rest[:bytes.IndexByte(rest, '"')]), nil
}

// release releases a lease.
func (c *lineConn) release(lease string) error {
	resp, err := c.roundTrip(fmt.Appendf(nil, `{"id":2,"op":"release","lease":%q}`+"\n", lease))
	if err != nil {
		return err
	}
	if !bytes.Contains(resp, []byte(`"released":true`)) {
		return fmt.Errorf("not released: %s", resp)
	}
	return nil
}

// echoServer answers every line with itself: the floor of any protocol
// spoken over a Unix socket on this machine.
func echoServer(dir string) (path string, stop func(), err error) {
	path = filepath.Join(dir, "echo.sock")
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return "", nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadSlice('\n')
					if err != nil {
						return
					}
					if _, err := c.Write(line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return path, func() { ln.Close() }, nil
}
