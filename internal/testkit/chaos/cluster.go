package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit/agentbin"
	"github.com/lockagent/lockagent/internal/testkit/etcdtest"
	"github.com/lockagent/lockagent/internal/testkit/faultproxy"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

const (
	// readyTimeout bounds an agent's start, from exec to its first pong.
	readyTimeout = 20 * time.Second
	// stopTimeout bounds an agent's exit after SIGTERM.
	stopTimeout = 10 * time.Second
)

// cluster is one redis-server, or a three-member etcd, and the agents
// sharing it, each reaching it through fault proxies of its own (one per
// etcd member).
type cluster struct {
	bin    string
	redis  *redistest.Server // nil on etcd
	etcd   *etcdtest.Cluster // nil on Redis
	agents []*agent
}

// agent is one agent process, started again after a kill in the same home:
// socket, state directory, config and log file.
type agent struct {
	idx     int
	bin     string
	dir     string // short: os.MkdirTemp("", "ch")
	socket  string
	config  string
	logPath string
	proxies []*faultproxy.Proxy // one per server the agent reaches

	mu         sync.Mutex       // guards the fields below
	proc       *os.Process      // the process that serves the agent: started, or handed the agent by an upgrade
	state      *os.ProcessState // proc's, once it has exited
	done       chan struct{}    // closed when proc has exited
	expectExit bool             // the harness killed, stopped or upgraded it
	starts     int
	unexpected []string // exits the harness did not cause
}

// startCluster starts redis-server (without persistence) and n agents on it.
func startCluster(t *testing.T, bin string, n int) *cluster {
	t.Helper()
	return startAgents(t, &cluster{bin: bin, redis: redistest.Start(t, redistest.Options{})}, n)
}

// startEtcdCluster starts a three-member etcd and n agents on it.
func startEtcdCluster(t *testing.T, bin string, n int) *cluster {
	t.Helper()
	return startAgents(t, &cluster{bin: bin, etcd: etcdtest.Start(t, etcdtest.Options{Members: 3})}, n)
}

// startAgents starts n agents on c's store.
func startAgents(t *testing.T, c *cluster, n int) *cluster {
	t.Helper()
	for i := range n {
		a := &agent{idx: i, bin: c.bin}
		var backend string
		if c.redis != nil {
			a.proxies = []*faultproxy.Proxy{faultproxy.New(t, c.redis.Addr())}
			backend = fmt.Sprintf("backend \"redis\" {\n  addresses  = [%q]\n  key_prefix = \"chaos\"\n}\n", a.proxies[0].Addr())
		} else {
			var eps []string
			for _, ep := range c.etcd.Endpoints() {
				p := faultproxy.New(t, ep)
				a.proxies = append(a.proxies, p)
				eps = append(eps, fmt.Sprintf("%q", p.Addr()))
			}
			backend = fmt.Sprintf("backend \"etcd\" {\n  endpoints  = [%s]\n  key_prefix = \"chaos\"\n}\n", strings.Join(eps, ", "))
		}
		dir, err := os.MkdirTemp("", "ch")
		if err != nil {
			t.Fatalf("chaos: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		a.dir = dir
		a.socket = filepath.Join(dir, "s")
		a.config = filepath.Join(dir, "agent.hcl")
		a.logPath = filepath.Join(dir, "agent.log")
		cfg := fmt.Sprintf("state_dir = %q\nlog_level = \"debug\"\n%s", filepath.Join(dir, "state"), backend)
		if err := os.WriteFile(a.config, []byte(cfg), 0o600); err != nil {
			t.Fatalf("chaos: %v", err)
		}
		// Cleanups run last in, first out: the agents go before their
		// proxies and the store.
		t.Cleanup(a.kill)
		if err := a.start(); err != nil {
			t.Fatalf("chaos: %v", err)
		}
		c.agents = append(c.agents, a)
	}
	return c
}

// The faults of an agent's links: every proxy at once.
func (a *agent) blackhole() {
	for _, p := range a.proxies {
		p.Blackhole()
	}
}

func (a *agent) pass() {
	for _, p := range a.proxies {
		p.Pass()
	}
}

func (a *agent) resetAll() {
	for _, p := range a.proxies {
		p.ResetAll()
	}
}

func (a *agent) delay(d time.Duration) {
	for _, p := range a.proxies {
		p.Delay(d)
	}
}

// start starts the agent process and waits until it answers ping.
func (a *agent) start() error {
	logf, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	a.mu.Lock()
	a.starts++
	fmt.Fprintf(logf, "=== chaos: start #%d of agent %d at %s\n", a.starts, a.idx, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(a.bin, "agent", "-config", a.config, "-socket", a.socket)
	cmd.Env = agentbin.Env(a.dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies without its cleanups, the agent goes too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		a.mu.Unlock()
		return fmt.Errorf("start agent %d: %w", a.idx, err)
	}
	done := a.follow(cmd.Process)
	a.mu.Unlock()

	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-done:
			return fmt.Errorf("agent %d exited before it was ready; see %s:\n%s", a.idx, a.logPath, tail(a.logPath, 4000))
		default:
		}
		if ping(a.socket) == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent %d did not answer on %s within %v:\n%s", a.idx, a.socket, readyTimeout, tail(a.logPath, 4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// follow makes p the agent's process, and returns the channel closed when
// it has exited. a.mu is held.
func (a *agent) follow(p *os.Process) chan struct{} {
	done := make(chan struct{})
	a.proc, a.state, a.done, a.expectExit = p, nil, done, false
	go func() {
		st, err := p.Wait()
		a.mu.Lock()
		if a.proc == p {
			a.state = st
			if !a.expectExit {
				a.unexpected = append(a.unexpected, fmt.Sprintf("agent %d (pid %d) exited on its own: %v%v", a.idx, p.Pid, st, err))
			}
		}
		a.mu.Unlock()
		close(done)
	}()
	return done
}

// upgraded is an upgrade: the process it took the agent from, and the
// one it gave it to.
type upgraded struct{ from, to int }

// upgrade upgrades the agent (to the same binary: what matters is the
// handover under the load), and follows the new process. The test's
// process is its children's subreaper (see Run), so that the new process,
// the old one's child, becomes its child once the old one has exited.
func (a *agent) upgrade() (upgraded, error) {
	a.mu.Lock()
	old, done := a.proc, a.done
	a.expectExit = true
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	up, err := func() (*client.Upgraded, error) {
		c, err := client.Dial(ctx, a.socket)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return c.Upgrade(ctx)
	}()
	if err != nil {
		a.mu.Lock()
		a.expectExit = false
		a.mu.Unlock()
		return upgraded{}, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return upgraded{}, fmt.Errorf("the old process (pid %d) did not exit", old.Pid)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if code := a.state.ExitCode(); code != 0 {
		return upgraded{}, fmt.Errorf("the old process (pid %d) exited with status %d", old.Pid, code)
	}
	p, err := os.FindProcess(up.PID)
	if err != nil {
		return upgraded{}, fmt.Errorf("the new process (pid %d): %w", up.PID, err)
	}
	a.follow(p)
	return upgraded{from: old.Pid, to: up.PID}, nil
}

// ping opens a connection to socket and pings.
func ping(socket string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return client.PingAgent(ctx, socket)
}

// running reports whether the agent's process is alive (stopped counts).
func (a *agent) running() bool {
	a.mu.Lock()
	done := a.done
	a.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// signal sends sig to the agent's process, if it runs.
func (a *agent) signal(sig syscall.Signal) {
	a.mu.Lock()
	p := a.proc
	a.mu.Unlock()
	if p != nil {
		_ = p.Signal(sig)
	}
}

// pause stops the agent with SIGSTOP and waits (a second at most) until
// every one of its threads is stopped: kill(2) returns before they are,
// and a thread still running might serve a request sent meanwhile.
func (a *agent) pause() {
	a.mu.Lock()
	p := a.proc
	a.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.Signal(syscall.SIGSTOP)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if allStopped(p.Pid) {
			return
		}
	}
}

// allStopped tells whether every thread of process pid is stopped (state
// T in /proc), or the process is gone.
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return true
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			continue // the thread exited
		}
		// The state follows the command name, which is in parentheses
		// and may hold anything.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) {
			return false
		}
		if st := b[i+2]; st != 'T' && st != 't' && st != 'Z' && st != 'X' {
			return false
		}
	}
	return true
}

// kill kills the agent with SIGKILL and waits for it to be gone.
func (a *agent) kill() {
	a.mu.Lock()
	p, done := a.proc, a.done
	a.expectExit = true
	a.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.Signal(syscall.SIGKILL)
	<-done
}

// stop ends the agent with SIGTERM (after SIGCONT, in case it is stopped)
// and reports whether it exited cleanly in time; it is killed otherwise.
func (a *agent) stop() error {
	a.mu.Lock()
	p, done := a.proc, a.done
	a.expectExit = true
	a.mu.Unlock()
	if p == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	_ = p.Signal(syscall.SIGCONT)
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-done:
		a.mu.Lock()
		code := a.state.ExitCode()
		a.mu.Unlock()
		if code != 0 {
			return fmt.Errorf("agent %d exited with status %d after SIGTERM", a.idx, code)
		}
		return nil
	case <-time.After(stopTimeout):
		a.kill()
		return fmt.Errorf("agent %d did not exit within %v of SIGTERM", a.idx, stopTimeout)
	}
}

// unexpectedExits returns the exits the harness did not cause.
func (a *agent) unexpectedExits() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.unexpected...)
}

// tail returns the last n bytes of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
