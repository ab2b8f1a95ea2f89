// Package etcdtest is test support that starts real etcd processes: a
// cluster of one member or of several, on free loopback ports, owned by a
// test and torn down at its cleanup. A member can be killed, stopped
// (SIGTERM), paused (SIGSTOP) and restarted on its ports and data
// directory, and the cluster says which member leads. Nothing in the
// agent imports it.
//
// It needs etcd on PATH (Debian's etcd-server). The members run with a
// heartbeat of 100 ms and an election timeout of 600 ms, so that a leader
// is elected again within a second and etcd's shortest lease is 1 s (it
// is 1.5 times the election timeout, rounded up to a second): the
// backend's tests let leases of 300 ms expire. Functions taking a
// testing.TB must be called from the test's goroutine, as they may call
// tb.Fatal.
package etcdtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lockagent/lockagent/internal/testkit"
)

// Time limits: generous, since CI machines are small and tests run in
// parallel; every wait polls and returns as soon as its condition holds.
const (
	readyTimeout = 20 * time.Second // from exec to a healthy member
	stopTimeout  = 10 * time.Second // SIGTERM to exit, before SIGKILL
	pollInterval = 20 * time.Millisecond
	startTries   = 3 // fresh ports tried when a free port was taken meanwhile
)

// Options configures a cluster started by Start.
type Options struct {
	// Members is the number of members; default 1.
	Members int
	// Args are extra etcd arguments for every member, after the ones
	// etcdtest sets (so they override them).
	Args []string
}

// Cluster is a set of etcd members owned by a test. Its methods are safe
// for concurrent use.
type Cluster struct {
	members []*Member
	token   string
}

// Member is one etcd process. Its ports and data directory stay the same
// across Restart.
type Member struct {
	c       *Cluster
	idx     int
	name    string
	dir     string // the member's own: data, output log
	logPath string
	extra   []string // Options.Args

	mu         sync.Mutex // guards the fields below
	clientPort int
	peerPort   int
	selfID     uint64   // etcd's id of the member, once known
	proc       *process // nil once killed or stopped
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process exited
}

// Start starts a cluster on free loopback ports in fresh temporary
// directories, waits until every member is healthy (the cluster has a
// leader), and registers a cleanup that kills the members, logs their
// output if the test failed, and removes the directories.
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	testkit.SkipShort(tb, "etcd")
	if opts.Members == 0 {
		opts.Members = 1
	}
	c := &Cluster{token: fmt.Sprintf("etcdtest-%d-%d", os.Getpid(), time.Now().UnixNano())}
	for i := range opts.Members {
		// A short directory: paths in it stay well under limits.
		dir, err := os.MkdirTemp(tmpDir(), "et")
		if err != nil {
			tb.Fatalf("etcdtest: %v", err)
		}
		m := &Member{c: c, idx: i, name: fmt.Sprintf("m%d", i), dir: dir, logPath: filepath.Join(dir, "out.log")}
		c.members = append(c.members, m)
		tb.Cleanup(func() {
			m.Kill()
			if tb.Failed() {
				tb.Logf("etcdtest: output of member %s (%s):\n%s", m.name, m.Addr(), m.output())
			}
			if err := os.RemoveAll(dir); err != nil {
				tb.Errorf("etcdtest: %v", err)
			}
		})
	}
	var err error
	for range startTries {
		ports := freePorts(tb, 2*len(c.members))
		for i, m := range c.members {
			m.mu.Lock()
			m.clientPort, m.peerPort = ports[2*i], ports[2*i+1]
			m.mu.Unlock()
		}
		if err = c.launchAll(opts.Args); err == nil {
			return c
		}
		for _, m := range c.members {
			m.Kill()
			_ = os.RemoveAll(filepath.Join(m.dir, "data"))
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	tb.Fatalf("etcdtest: %v (the members' output is logged at cleanup)", err)
	return nil
}

// launchAll starts every member, then waits for each to be healthy: a
// member of several is healthy only once a leader is elected, which
// needs a quorum up.
func (c *Cluster) launchAll(args []string) error {
	for _, m := range c.members {
		m.extra = args
		if err := m.launch(); err != nil {
			return err
		}
	}
	for _, m := range c.members {
		if err := m.waitHealthy(); err != nil {
			return err
		}
	}
	return nil
}

// freePorts returns n distinct loopback TCP ports that were free a moment
// ago (held together, so they cannot coincide).
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("etcdtest: %v", err)
		}
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// Members returns the members, in the order of their names (m0, m1, ...).
func (c *Cluster) Members() []*Member { return c.members }

// Member returns member i.
func (c *Cluster) Member(i int) *Member { return c.members[i] }

// Endpoints returns every member's client host:port.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.Addr()
	}
	return eps
}

// Client returns a client of every member, closed at the test's cleanup.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return NewClient(tb, c.Endpoints())
}

// NewClient returns a client of endpoints (a cluster's, or fault proxies
// in front of them), closed at the test's cleanup.
func NewClient(tb testing.TB, endpoints []string) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatalf("etcdtest: client: %v", err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Leader returns the index of the member that leads, as the running
// members see it, waiting (within the ready timeout) until a running
// member does.
func (c *Cluster) Leader(tb testing.TB) int {
	tb.Helper()
	deadline := time.Now().Add(readyTimeout)
	for {
		for _, m := range c.members {
			if m.running() == nil {
				continue
			}
			if st, err := m.status(); err == nil && st.leader != 0 {
				for _, o := range c.members {
					if o.id() == st.leader && o.running() != nil {
						return o.idx
					}
				}
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("etcdtest: no leader after %v", readyTimeout)
		}
		time.Sleep(pollInterval)
	}
}

// memberStatus is what a member says of itself.
type memberStatus struct {
	self, leader uint64
}

// status asks the member for its id and its leader's.
func (m *Member) status() (memberStatus, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.Addr()}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return memberStatus{}, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := cli.Status(ctx, m.Addr())
	if err != nil {
		return memberStatus{}, err
	}
	m.mu.Lock()
	m.selfID = st.Header.MemberId
	m.mu.Unlock()
	return memberStatus{self: st.Header.MemberId, leader: st.Leader}, nil
}

// id returns the member's etcd id, once known (0 before).
func (m *Member) id() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.selfID
}

// Addr returns the member's client host:port.
func (m *Member) Addr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.clientPort))
}

// LogPath returns the file that holds what the member printed.
func (m *Member) LogPath() string { return m.logPath }

// Name returns the member's name: m0, m1, ...
func (m *Member) Name() string { return m.name }

// PID returns the process id, or 0 if the member is not running.
func (m *Member) PID() int {
	if p := m.running(); p != nil {
		return p.cmd.Process.Pid
	}
	return 0
}

func (m *Member) peerURL(port int) string {
	return "http://127.0.0.1:" + strconv.Itoa(port)
}

// args returns etcd's arguments for the current ports. A restarted
// member finds its data directory, and ignores the initial cluster.
func (m *Member) args() []string {
	m.mu.Lock()
	client, peer := m.clientPort, m.peerPort
	m.mu.Unlock()
	var initial []string
	for _, o := range m.c.members {
		o.mu.Lock()
		initial = append(initial, o.name+"="+m.peerURL(o.peerPort))
		o.mu.Unlock()
	}
	a := []string{
		"--name", m.name,
		"--data-dir", filepath.Join(m.dir, "data"),
		"--listen-client-urls", m.peerURL(client),
		"--advertise-client-urls", m.peerURL(client),
		"--listen-peer-urls", m.peerURL(peer),
		"--initial-advertise-peer-urls", m.peerURL(peer),
		"--initial-cluster", strings.Join(initial, ","),
		"--initial-cluster-token", m.c.token,
		"--initial-cluster-state", "new",
		"--heartbeat-interval", "100",
		"--election-timeout", "600",
		"--logger", "zap",
		"--log-level", "warn",
	}
	return append(a, m.extra...)
}

// launch runs etcd on the member's ports, without waiting for it.
func (m *Member) launch() error {
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== etcdtest: start of %s at %s\n", m.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command("etcd", m.args()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies without running cleanups, take etcd with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	m.mu.Lock()
	m.proc = p
	m.mu.Unlock()
	return nil
}

// waitHealthy polls the member's /health until it says so (it has a
// leader and answers), it exits, or the ready timeout passes.
func (m *Member) waitHealthy() error {
	p := m.running()
	if p == nil {
		return fmt.Errorf("member %s is not running", m.name)
	}
	deadline := time.Now().Add(readyTimeout)
	var last error
	for {
		if last = health(m.Addr()); last == nil {
			_, _ = m.status() // learn its id for Leader
			return nil
		}
		select {
		case <-p.done:
			out := m.output()
			if strings.Contains(out, "address already in use") {
				return fmt.Errorf("member %s exited: address already in use", m.name)
			}
			return fmt.Errorf("member %s exited before it was healthy", m.name)
		case <-time.After(pollInterval):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("member %s not healthy after %v: %w", m.name, readyTimeout, last)
		}
	}
}

// health asks a member's /health endpoint.
func health(addr string) error {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/health")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return err
	}
	if h.Health != "true" {
		return errors.New("unhealthy")
	}
	return nil
}

// output returns what the member printed.
func (m *Member) output() string {
	b, err := os.ReadFile(m.logPath)
	if err != nil {
		return fmt.Sprintf("(no output: %v)", err)
	}
	return string(b)
}

func (m *Member) take() *process {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.proc
	m.proc = nil
	return p
}

func (m *Member) running() *process {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc
}

func (p *process) signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig)
	}
}

// Kill sends SIGKILL and waits for the process to exit. It does nothing
// if the member is not running.
func (m *Member) Kill() {
	if p := m.take(); p != nil {
		p.signal(syscall.SIGKILL)
		<-p.done
	}
}

// Stop sends SIGTERM (and SIGCONT, in case it is paused) and waits for
// the member to exit; after 10 s it kills it.
func (m *Member) Stop() {
	p := m.take()
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

// Pause freezes the member with SIGSTOP: its connections stay open and
// nothing is answered.
func (m *Member) Pause() {
	if p := m.running(); p != nil {
		p.signal(syscall.SIGSTOP)
	}
}

// Resume continues a paused member with SIGCONT.
func (m *Member) Resume() {
	if p := m.running(); p != nil {
		p.signal(syscall.SIGCONT)
	}
}

// Restart starts the member again on its ports and data directory,
// killing it first if it still runs, and waits until it is healthy (it
// rejoined a cluster that has a leader).
func (m *Member) Restart(tb testing.TB) {
	tb.Helper()
	m.Kill()
	if err := m.launch(); err != nil {
		tb.Fatalf("etcdtest: restart %s: %v", m.name, err)
	}
	if err := m.waitHealthy(); err != nil {
		tb.Fatalf("etcdtest: restart %s: %v (its output is logged at cleanup)", m.name, err)
	}
}

// tmpDir is where the members' directories go: /dev/shm when it is a
// writable tmpfs, where a write-ahead log's fsync costs nothing (a member
// killed keeps its data all the same: the files outlive the process),
// else the temporary directory.
func tmpDir() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if f, err := os.CreateTemp("/dev/shm", "et"); err == nil {
			f.Close()
			os.Remove(f.Name())
			return "/dev/shm"
		}
	}
	return os.TempDir()
}
