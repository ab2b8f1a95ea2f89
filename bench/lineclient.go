package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
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

// echoServer serves a Unix-socket echo in this process: a line back for
// every line, the least any server of a line protocol does.
func echoServer(dir string) (path string, stop func(), err error) {
	path = filepath.Join(dir, "echo.sock")
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return "", nil, err
	}
	go serveEcho(ln)
	return path, func() { ln.Close() }, nil
}

// echoEnv makes the bench binary an echo server at the socket it names.
const echoEnv = "LOCKAGENT_BENCH_ECHO"

// echoProcess serves the same echo from another process (this binary
// again, with echoEnv set): a round trip to it wakes another process, as
// one to the agent does, where one to echoServer may stay in the
// runtime's own scheduler.
func echoProcess(dir string) (path string, pid int, stop func(), err error) {
	exe, err := os.Executable()
	if err != nil {
		return "", 0, nil, err
	}
	path = filepath.Join(dir, "echo-process.sock")
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), echoEnv+"="+path)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", 0, nil, fmt.Errorf("start echo process: %w", err)
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait() }
	err = poll(10*time.Second, func() error {
		c, err := dialLine(path)
		if err == nil {
			c.close()
		}
		return err
	})
	if err != nil {
		stop()
		return "", 0, nil, fmt.Errorf("echo process: %w", err)
	}
	return path, cmd.Process.Pid, stop, nil
}

// runEcho is the echo process's main: it serves until killed.
func runEcho(path string) error {
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	serveEcho(ln)
	return nil
}

// serveEcho echoes every connection of ln until ln is closed.
func serveEcho(ln net.Listener) {
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
}
