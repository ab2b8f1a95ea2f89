package main

// The harness of the end-to-end tests: TestMain builds the real binary once;
// each test starts its own agent processes on a short socket path with its
// own state directory, and talks to them with socketapi's client and with
// the binary's own client commands. Nothing is mocked.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit"
	"github.com/lockagent/lockagent/internal/testkit/agentbin"
)

const (
	// testVersion is stamped into the binary under test with -ldflags.
	testVersion = "e2e-test"
	// helperEnv switches the test binary into a helper process (see
	// helperMain) instead of running the tests.
	helperEnv = "LOCKAGENT_E2E_HELPER"
	// callTimeout bounds every request a test makes.
	callTimeout = 5 * time.Second
	// exitTimeout bounds how long a process may take to exit when it should.
	exitTimeout = 10 * time.Second
)

var (
	// lockagentBin is the binary under test, built by TestMain.
	lockagentBin string
	// binDir is where TestMain built it, and other binaries go.
	binDir string
	// testHome is HOME and XDG_RUNTIME_DIR of the processes the tests
	// start (see baseEnv), made by TestMain.
	testHome string
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode, os.Args[1:]))
	}
	os.Exit(buildAndRun(m))
}

// buildAndRun builds the lockagent binary into a temporary directory (with
// the race detector when the tests have it), makes the processes' home
// there and runs the tests.
func buildAndRun(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run() // the tests that run the binary skip (see testkit.SkipShort)
	}
	dir, err := os.MkdirTemp("", "la-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	testHome = filepath.Join(dir, "home")
	if err := os.Mkdir(testHome, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if lockagentBin, err = agentbin.Build(dir, testVersion); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building lockagent:", err)
		return 1
	}
	return m.Run()
}

// helperMain runs the test binary as a helper process: an application that
// the tests can kill -9.
func helperMain(mode string, args []string) int {
	switch mode {
	case "hold":
		if err := holdLocks(args); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 1
		}
		return 0
	case "signal-without-pidfd":
		return signalWithoutPidfd()
	case "handover-then-wait":
		if err := handoverThenWait(args[0], args[1], args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 1
		}
		return 0
	case "list-flood":
		if err := listFlood(args); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 1
		}
		return 0
	default:
		fmt.Fprintf(os.Stderr, "helper: unknown mode %q\n", mode)
		return 2
	}
}

// holdLocks connects to the agent at LOCKAGENT_SOCKET, acquires every name,
// prints "held TOKEN..." and then holds them until the connection ends.
func holdLocks(names []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	c, err := client.Dial(ctx, os.Getenv("LOCKAGENT_SOCKET"))
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Call(ctx, "hello", map[string]any{"version": 1, "client": "e2e-hold"}, nil); err != nil {
		return err
	}
	var tokens []string
	for _, n := range names {
		var res lease
		if err := c.Call(ctx, "acquire", map[string]any{"name": n}, &res); err != nil {
			return err
		}
		if !res.Acquired {
			return fmt.Errorf("%s not acquired: %s", n, res.Reason)
		}
		tokens = append(tokens, fmt.Sprint(res.Token))
	}
	fmt.Printf("held %s\n", strings.Join(tokens, " "))
	<-c.Done()
	return errors.New("the connection to the agent ended")
}

// syncBuffer is a bytes.Buffer safe for a process's copier goroutine and
// the test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a child process with its output captured. Its stderr (and stdout)
// are logged if the test fails; it is killed at the end of the test if it
// still runs.
type proc struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{} // closed once the process has exited and its output is read
}

// baseEnv is the environment of a process the tests start (see
// agentbin.Env), which is never a helper process unless it says so.
func baseEnv() []string { return agentbin.Env(testHome) }

// startProc starts path with args and env (baseEnv plus extra).
func startProc(t *testing.T, name string, extraEnv []string, path string, args ...string) *proc {
	t.Helper()
	testkit.SkipShort(t, "the lockagent binary")
	p := &proc{name: name, stdout: new(syncBuffer), stderr: new(syncBuffer), done: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = append(baseEnv(), extraEnv...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	// Without a controlling terminal, as under CI and systemd, also when
	// the tests run from one.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// A grandchild that keeps the output open must not hang the test.
	p.cmd.WaitDelay = 2 * time.Second
	require.NoError(t, p.cmd.Start(), "start %s", name)
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
		if strings.Contains(p.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("%s reported a data race", name)
		}
		if t.Failed() {
			t.Logf("%s (pid %d) stdout:\n%s", name, p.cmd.Process.Pid, p.stdout)
			t.Logf("%s (pid %d) stderr:\n%s", name, p.cmd.Process.Pid, p.stderr)
		}
	})
	return p
}

// exited tells whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits up to timeout for the process to exit and returns its exit
// status (-1 when a signal ended it).
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s", p.name, timeout)
		return 0
	}
}

// signal sends sig to the process.
func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig), "signal %s to %s", sig, p.name)
}

// waitOutput waits until the process's stdout contains s and returns it.
func (p *proc) waitOutput(t *testing.T, s string, timeout time.Duration) string {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("%s prints %q", p.name, s), func() bool {
		return strings.Contains(p.stdout.String(), s) || p.exited()
	})
	out := p.stdout.String()
	require.Contains(t, out, s, "%s exited before printing it", p.name)
	return out
}

// cliResult is how a command of the binary ended.
type cliResult struct {
	stdout, stderr string
	code           int
}

// lockagent runs the binary with args to completion, with env (baseEnv plus
// extra).
func lockagent(t *testing.T, extraEnv []string, args ...string) cliResult {
	t.Helper()
	testkit.SkipShort(t, "the lockagent binary")
	ctx, cancel := context.WithTimeout(context.Background(), exitTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, lockagentBin, args...)
	cmd.Env = append(baseEnv(), extraEnv...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "lockagent %q did not finish in time; stderr:\n%s", args, stderr.String())
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		require.NoError(t, err, "lockagent %q", args)
	}
	return cliResult{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}

// requireCode checks a command's exit status, showing its output if wrong.
func requireCode(t *testing.T, want int, r cliResult, what string) {
	t.Helper()
	require.Equal(t, want, r.code, "%s: exit status\nstdout:\n%s\nstderr:\n%s", what, r.stdout, r.stderr)
}

// agentEnv is one agent's home: a short temporary directory holding its
// socket, its state directory and its config file. Agents started from it
// one after the other are restarts of the same agent.
type agentEnv struct {
	dir, socket, stateDir, config string
	// socketViaEnv passes the socket in LOCKAGENT_SOCKET rather than -socket.
	socketViaEnv bool
	// bin is the agent's binary; default lockagentBin.
	bin string
}

// newAgentEnv makes an agent's home. The directory comes from
// os.MkdirTemp("", "la"), not t.TempDir, to keep the socket path well under
// the 108 bytes of sun_path.
func newAgentEnv(t *testing.T) *agentEnv {
	t.Helper()
	testkit.SkipShort(t, "the lockagent binary")
	dir, err := os.MkdirTemp("", "la")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &agentEnv{
		dir:      dir,
		socket:   filepath.Join(dir, "s"),
		stateDir: filepath.Join(dir, "state"),
		config:   filepath.Join(dir, "agent.hcl"),
	}
	e.writeConfig(t, "")
	return e
}

// writeConfig writes the agent's config file: its state directory, debug
// logs, and extra HCL.
func (e *agentEnv) writeConfig(t *testing.T, extra string) {
	t.Helper()
	cfg := fmt.Sprintf("state_dir = %q\nlog_level = \"debug\"\n%s", e.stateDir, extra)
	require.NoError(t, os.WriteFile(e.config, []byte(cfg), 0o600))
}

// clientEnv is the environment for client commands of this agent.
func (e *agentEnv) clientEnv() []string {
	return []string{"LOCKAGENT_SOCKET=" + e.socket}
}

// spawn starts an agent process without waiting for it to be ready.
func (e *agentEnv) spawn(t *testing.T, extraEnv ...string) *proc {
	t.Helper()
	args := []string{"agent", "-config", e.config}
	if e.socketViaEnv {
		extraEnv = append(extraEnv, "LOCKAGENT_SOCKET="+e.socket)
	} else {
		// -socket wins over LOCKAGENT_SOCKET: an agent on the decoy would
		// never become ready.
		args = append(args, "-socket", e.socket)
		extraEnv = append(extraEnv, "LOCKAGENT_SOCKET="+filepath.Join(e.dir, "decoy"))
	}
	bin := e.bin
	if bin == "" {
		bin = lockagentBin
	}
	return startProc(t, "agent", extraEnv, bin, args...)
}

// start starts an agent and waits until it answers ping on its socket.
func (e *agentEnv) start(t *testing.T, extraEnv ...string) *proc {
	t.Helper()
	p := e.spawn(t, extraEnv...)
	deadline := time.Now().Add(exitTimeout)
	for {
		if p.exited() {
			t.Fatalf("the agent exited with status %d before it was ready; stderr:\n%s", p.cmd.ProcessState.ExitCode(), p.stderr)
		}
		if pingOnce(e.socket) == nil {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not answer on %s within %s; stderr:\n%s", e.socket, exitTimeout, p.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pingOnce opens a connection to socket and pings.
func pingOnce(socket string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return client.PingAgent(ctx, socket)
}

// stopUpgradedAtCleanup stops, when t ends, the agent that serves socket
// if it is no longer the process first: one an upgrade started, which
// no harness owns.
func stopUpgradedAtCleanup(t *testing.T, socket string, first int) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		c, err := client.Dial(ctx, socket)
		if err != nil {
			return // nothing serves
		}
		st, err := c.Status(ctx)
		c.Close()
		if err != nil || st.PID == first {
			return
		}
		if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil {
			require.ErrorIs(t, err, syscall.ESRCH, "the upgraded agent is gone or stops")
			return
		}
		eventually(t, exitTimeout, "the upgraded agent exits", func() bool { return syscall.Kill(st.PID, 0) != nil })
	})
}

// stopAgent sends SIGTERM and requires a clean exit in bounded time.
func stopAgent(t *testing.T, p *proc) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, exitTimeout), "the agent's exit status after SIGTERM")
}

// killAgent kills the agent with SIGKILL and waits for it to be gone.
func killAgent(t *testing.T, p *proc) {
	t.Helper()
	p.signal(t, syscall.SIGKILL)
	p.wait(t, exitTimeout)
}

// lease is acquire's result.
type lease struct {
	Acquired bool   `json:"acquired"`
	Lease    string `json:"lease"`
	Name     string `json:"name"`
	Mode     string `json:"mode"`
	Scope    string `json:"scope"`
	Token    uint64 `json:"token"`
	Reason   string `json:"reason"`
}

// dialAgent connects to the agent at socket and says hello as client.
func dialAgent(t *testing.T, socket, name string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	c, err := client.Dial(ctx, socket)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.Call(ctx, "hello", map[string]any{"version": 1, "client": name}, nil))
	return c
}

// call makes a request that must succeed.
func call(t *testing.T, c *client.Client, op string, args, result any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	require.NoError(t, c.Call(ctx, op, args, result), op)
}

// tryAcquire makes one attempt at name (wait_ms 0) with the extra arguments.
func tryAcquire(t *testing.T, c *client.Client, name string, extra map[string]any) lease {
	t.Helper()
	args := map[string]any{"name": name, "wait_ms": 0}
	for k, v := range extra {
		args[k] = v
	}
	var l lease
	call(t, c, "acquire", args, &l)
	return l
}

// mustAcquire acquires name at once.
func mustAcquire(t *testing.T, c *client.Client, name string, extra map[string]any) lease {
	t.Helper()
	l := tryAcquire(t, c, name, extra)
	require.True(t, l.Acquired, "acquire %s: %s", name, l.Reason)
	require.NotZero(t, l.Token)
	return l
}

// acquireSoon polls until name is acquired, within timeout.
func acquireSoon(t *testing.T, c *client.Client, name string, timeout time.Duration) lease {
	t.Helper()
	var l lease
	eventually(t, timeout, "acquire "+name, func() bool {
		l = tryAcquire(t, c, name, nil)
		return l.Acquired
	})
	return l
}

// inspectResult is inspect's result.
type inspectResult struct {
	Locked  bool    `json:"locked"`
	Mode    *string `json:"mode"`
	Holders []struct {
		Mode  string `json:"mode"`
		Token uint64 `json:"token"`
		Host  string `json:"host"`
	} `json:"holders"`
	LastToken uint64 `json:"last_token"`
}

func inspect(t *testing.T, c *client.Client, name string) inspectResult {
	t.Helper()
	var r inspectResult
	call(t, c, "inspect", map[string]any{"name": name}, &r)
	return r
}

// waitEvent waits for an event of kind on c, skipping others.
func waitEvent(t *testing.T, c *client.Client, kind string, timeout time.Duration) client.Event {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				t.Fatalf("the connection ended before a %q event", kind)
			}
			if ev.Event == kind {
				return ev
			}
		case <-timer.C:
			t.Fatalf("no %q event within %s", kind, timeout)
		}
	}
}

// waitDone waits for c's connection to end.
func waitDone(t *testing.T, c *client.Client, timeout time.Duration) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(timeout):
		t.Fatalf("the connection did not end within %s", timeout)
	}
}

// eventually polls cond every 10ms until it holds, or fails the test after
// timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// notifyListener plays systemd's end of NOTIFY_SOCKET: a datagram socket
// that records every message.
type notifyListener struct {
	path string
	mu   sync.Mutex
	msgs []string
	at   []time.Time // when each message arrived
}

func listenNotify(t *testing.T, dir string) *notifyListener {
	t.Helper()
	n := &notifyListener{path: filepath.Join(dir, "n")}
	pc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.path, Net: "unixgram"})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			k, _, err := pc.ReadFromUnix(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, string(buf[:k]))
			n.at = append(n.at, time.Now())
			n.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	return n
}

// messages returns what was received so far, in order.
func (n *notifyListener) messages() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.msgs...)
}

// index is the position of the first message with the line want, or -1.
func (n *notifyListener) index(want string) int {
	for i, m := range n.messages() {
		for _, line := range strings.Split(m, "\n") {
			if line == want {
				return i
			}
		}
	}
	return -1
}

// wait waits for a message with the line want and returns its position.
func (n *notifyListener) wait(t *testing.T, want string, timeout time.Duration) int {
	t.Helper()
	eventually(t, timeout, "sd_notify "+want, func() bool { return n.index(want) >= 0 })
	return n.index(want)
}
