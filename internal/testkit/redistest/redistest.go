// Package redistest is test support that starts real redis-server processes:
// single servers (optionally under faketime or with an append-only file),
// clusters and a sentinel setup, each owned by a test and torn down at its
// cleanup. Nothing in the agent imports it.
//
// It needs redis-server and redis-cli on PATH, and faketime for
// Options.Faketime. Functions taking a testing.TB must be called from the
// test's goroutine, as they may call tb.Fatal.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockagent/lockagent/internal/testkit"
)

// Time limits: generous, since CI machines are small and tests run in
// parallel; every wait polls and returns as soon as its condition holds.
const (
	readyTimeout = 10 * time.Second // from exec to the first PONG
	stopTimeout  = 10 * time.Second // SIGTERM to exit, before SIGKILL
	pollInterval = 10 * time.Millisecond
	startTries   = 3 // fresh ports tried when a free port was taken meanwhile
)

// Options configures a redis-server started by Start.
type Options struct {
	// Args are extra redis-server arguments, appended after the ones
	// redistest sets (so they override them), e.g. {"--maxmemory-policy",
	// "allkeys-lru"}.
	Args []string
	// Faketime, if set, runs redis-server under `faketime -f Faketime`;
	// "+0 x5" makes its clock run five times fast, so TTLs expire in a
	// fifth of the wall time. The clock starts again from the real time on
	// each (re)start.
	Faketime string
	// Persistence turns on the append-only file with appendfsync always,
	// so that every acknowledged write survives Kill and Restart. Without
	// it the server persists nothing (--save "" --appendonly no). RDB
	// snapshots are off in both cases.
	Persistence bool
}

// Server is a redis-server process owned by a test. Its port and directory
// stay the same across Restart. Its methods are safe for concurrent use.
type Server struct {
	opts    Options
	conf    string   // config file put before the options (sentinel), or ""
	extra   []string // arguments after opts.Args that redistest owns
	cluster bool     // pick a cluster bus port too
	dir     string
	logPath string

	mu      sync.Mutex // guards the fields below
	port    int
	busPort int      // cluster bus port, 0 unless cluster
	proc    *process // the running process; nil once killed or stopped
}

// process is one run of redis-server.
type process struct {
	cmd *exec.Cmd
	// pid is redis-server's own pid: with Faketime, the child of the
	// faketime wrapper, which forks and does not forward signals.
	pid  int
	done chan struct{} // closed when the process (and its wrapper) exited
}

// Start starts a redis-server on a free loopback port in a fresh temporary
// directory, waits until it answers PING, and registers a cleanup that
// kills it, logs its output if the test failed, and removes the directory.
func Start(tb testing.TB, opts Options) *Server {
	tb.Helper()
	testkit.SkipShort(tb, "redis-server")
	s := newServer(tb, opts)
	s.startFresh(tb)
	return s
}

// newServer makes the directory and registers the cleanup; it starts nothing.
func newServer(tb testing.TB, opts Options) *Server {
	tb.Helper()
	// A short directory: sockets and paths in it stay well under limits.
	dir, err := os.MkdirTemp("", "rd")
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	s := &Server{opts: opts, dir: dir, logPath: filepath.Join(dir, "out.log")}
	tb.Cleanup(func() {
		s.Kill()
		if tb.Failed() {
			tb.Logf("redistest: output of redis-server %s:\n%s", s.Addr(), s.output(0))
		}
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("redistest: %v", err)
		}
	})
	return s
}

// startFresh starts the server on new free ports, trying others if a port
// was taken between choosing it and binding it.
func (s *Server) startFresh(tb testing.TB) {
	tb.Helper()
	var err error
	for range startTries {
		n := 1
		if s.cluster {
			n = 2
		}
		ports := freePorts(tb, n)
		s.mu.Lock()
		s.port = ports[0]
		if s.cluster {
			s.busPort = ports[1]
		}
		s.mu.Unlock()
		var out string
		out, err = s.launch()
		if err == nil {
			return
		}
		if !strings.Contains(out, "Address already in use") {
			tb.Fatalf("redistest: %v (its output is logged at cleanup)", err)
		}
	}
	tb.Fatalf("redistest: no free port after %d tries: %v", startTries, err)
}

// freePorts returns n distinct loopback TCP ports that were free a moment
// ago (held together, so they cannot coincide).
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// Addr returns the server's host:port.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Dir returns the server's working directory (AOF, nodes.conf, output log).
func (s *Server) Dir() string { return s.dir }

// PID returns the redis-server process id, or 0 if it is not running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.pid
}

// Client returns a go-redis client for the server, closed at the test's
// cleanup (before the server is killed). It honours context deadlines
// (ContextTimeoutEnabled), so a test bounds a call with its context.
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// args returns redis-server's arguments for the current ports.
func (s *Server) args() []string {
	var a []string
	if s.conf != "" {
		a = append(a, s.conf)
	}
	a = append(a,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--daemonize", "no",
		"--enable-debug-command", "local",
		"--save", "",
	)
	if s.opts.Persistence {
		a = append(a, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		a = append(a, "--appendonly", "no")
	}
	if s.cluster {
		a = append(a, "--cluster-port", strconv.Itoa(s.busPort))
	}
	a = append(a, s.extra...)
	return append(a, s.opts.Args...)
}

// launch runs redis-server on the current ports and waits for its PONG.
// On failure the process is gone and out holds what it printed.
func (s *Server) launch() (out string, err error) {
	s.mu.Lock()
	args := s.args()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	s.mu.Unlock()

	var cmd *exec.Cmd
	if s.opts.Faketime != "" {
		preload, err := glibcMalloc()
		if err != nil {
			return "", err
		}
		cmd = exec.Command("faketime", append([]string{"-f", s.opts.Faketime, "redis-server"}, args...)...)
		// faketime adds libfaketime to LD_PRELOAD after this one.
		cmd.Env = append(os.Environ(), "LD_PRELOAD="+preload)
	} else {
		cmd = exec.Command("redis-server", args...)
	}
	// A file, not a pipe: no copying goroutine, and nothing for Wait to
	// block on if a child outlives its faketime wrapper.
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return "", err
	}
	defer logf.Close()
	var offset int64
	if fi, err := logf.Stat(); err == nil {
		offset = fi.Size()
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies without running cleanups, take the server
	// (or, under faketime, the wrapper) with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &process{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	if s.opts.Faketime != "" {
		p.pid, err = childPID(cmd.Process.Pid, p.done)
		if err != nil {
			_ = cmd.Process.Kill()
			<-p.done
			return s.output(offset), err
		}
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()

	if err := waitReady(addr, p.done); err != nil {
		s.Kill()
		return s.output(offset), fmt.Errorf("redis-server %s: %w", addr, err)
	}
	return "", nil
}

// glibcMalloc returns the path of glibc's libc_malloc_debug.so.0.
//
// Debian links redis-server against libjemalloc, and libfaketime cannot
// start a jemalloc program: its initialization allocates, jemalloc's
// initialization reads the clock, and the process hangs (libfaketime issues
// #130 and #327, unresolved). Preloading this glibc library, which exports
// malloc, calloc, realloc, free and malloc_usable_size as thin wrappers of
// glibc's allocator, routes every allocation to glibc; jemalloc is then only
// asked for statistics (mallctl), after libfaketime is ready. So under
// Faketime, Redis's allocator statistics (INFO memory, MEMORY commands) are
// meaningless, and nothing else changes.
func glibcMalloc() (string, error) {
	for _, pattern := range []string{
		"/lib/*-linux-gnu*/libc_malloc_debug.so.0",
		"/usr/lib/*-linux-gnu*/libc_malloc_debug.so.0",
		"/lib64/libc_malloc_debug.so.0",
		"/usr/lib64/libc_malloc_debug.so.0",
	} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return m[0], nil
		}
	}
	return "", errors.New("libc_malloc_debug.so.0 (glibc >= 2.34) not found: " +
		"faketime cannot run a jemalloc-linked redis-server without it")
}

// childPID waits for the faketime wrapper's child (redis-server) to appear.
func childPID(wrapper int, done <-chan struct{}) (int, error) {
	path := fmt.Sprintf("/proc/%d/task/%d/children", wrapper, wrapper)
	deadline := time.Now().Add(readyTimeout)
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			if f := strings.Fields(string(b)); len(f) > 0 {
				return strconv.Atoi(f[0])
			}
		}
		select {
		case <-done:
			return 0, errors.New("faketime exited before starting redis-server")
		case <-time.After(pollInterval):
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no child of faketime (pid %d) after %v", wrapper, readyTimeout)
		}
	}
}

// waitReady polls PING until the server answers PONG, exits, or the
// deadline passes. It speaks raw RESP so that it needs no client state and
// sees -LOADING replies for what they are.
func waitReady(addr string, done <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	var last error
	for {
		if last = ping(addr); last == nil {
			return nil
		}
		select {
		case <-done:
			return errors.New("exited before answering PING")
		case <-time.After(pollInterval):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG after %v: %w", readyTimeout, last)
		}
	}
}

// ping sends one inline PING and expects +PONG, or the refusal of a server
// that requires a password: either way, it answers.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" && !strings.HasPrefix(line, "-NOAUTH ") {
		return fmt.Errorf("PING: %q", strings.TrimSpace(line))
	}
	return nil
}

// output returns what the server printed from offset on.
func (s *Server) output(offset int64) string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no output: %v)", err)
	}
	if offset > int64(len(b)) {
		offset = 0
	}
	return string(b[offset:])
}

// take detaches the running process, so that exactly one caller ends it.
func (s *Server) take() *process {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	s.proc = nil
	return p
}

// running returns the running process, or nil.
func (s *Server) running() *process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// signal sends sig to redis-server unless it already exited.
func (p *process) signal(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	if p.pid == p.cmd.Process.Pid {
		_ = p.cmd.Process.Signal(sig) // pidfd-based: safe after exit
		return
	}
	// The faketime child: its wrapper reaps it and only then exits, so
	// while done is open the pid is still redis-server's.
	_ = syscall.Kill(p.pid, sig)
}

// Kill sends SIGKILL and waits for the process to exit. It does nothing if
// the server is not running.
func (s *Server) Kill() {
	if p := s.take(); p != nil {
		p.signal(syscall.SIGKILL)
		<-p.done
	}
}

// Stop sends SIGTERM (and SIGCONT, in case it is paused) and waits for a
// clean shutdown; after 10 s it kills the process. It does nothing if the
// server is not running.
func (s *Server) Stop() {
	p := s.take()
	if p == nil {
		return
	}
	p.signal(syscall.SIGTERM)
	p.signal(syscall.SIGCONT)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		p.signal(syscall.SIGKILL)
		<-p.done
	}
}

// Pause freezes the process with SIGSTOP: connections stay open and
// nothing is answered, and keys do not expire while it is paused.
func (s *Server) Pause() {
	if p := s.running(); p != nil {
		p.signal(syscall.SIGSTOP)
	}
}

// Resume continues a paused process with SIGCONT.
func (s *Server) Resume() {
	if p := s.running(); p != nil {
		p.signal(syscall.SIGCONT)
	}
}

// Restart starts the server again on the same port and directory with the
// same options, killing it first if it is still running, and waits until it
// answers PING. With Persistence it reloads its append-only file.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Kill()
	if _, err := s.launch(); err != nil {
		tb.Fatalf("redistest: restart: %v (its output is logged at cleanup)", err)
	}
}
