package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server process of the benchmark's own, without
// persistence, on a free port of 127.0.0.1.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
}

func startRedis(dir string) (*redisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--maxclients", "20000", "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server (is it installed?): %w", err)
	}
	s := &redisServer{addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd}
	c := s.client(1)
	defer c.Close()
	err = poll(10*time.Second, func() error { return c.Ping(context.Background()).Err() })
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("redis-server on %s: %w", s.addr, err)
	}
	return s, nil
}

// client returns a go-redis client with a pool of poolSize connections.
func (s *redisServer) client(poolSize int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: poolSize, MinIdleConns: poolSize})
}

func (s *redisServer) stop() {
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

// redisStats is what the benchmark reads of INFO: CPU seconds and
// commands processed so far.
type redisStats struct {
	cpu      float64
	commands int64
}

func (s *redisServer) stats(ctx context.Context, c *redis.Client) (redisStats, error) {
	info, err := c.Info(ctx, "cpu", "stats").Result()
	if err != nil {
		return redisStats{}, fmt.Errorf("INFO: %w", err)
	}
	var st redisStats
	for line := range strings.SplitSeq(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "used_cpu_sys", "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			st.cpu += f
		case "total_commands_processed":
			st.commands, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return st, nil
}

// commandStats returns INFO commandstats: per command, calls and server
// microseconds per call.
func (s *redisServer) commandStats(ctx context.Context, c *redis.Client) (map[string][2]float64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	out := map[string][2]float64{}
	for line := range strings.SplitSeq(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		name, isCmd := strings.CutPrefix(k, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		var calls, perCall float64
		for f := range strings.SplitSeq(v, ",") {
			fk, fv, _ := strings.Cut(f, "=")
			switch fk {
			case "calls":
				calls, _ = strconv.ParseFloat(fv, 64)
			case "usec_per_call":
				perCall, _ = strconv.ParseFloat(fv, 64)
			}
		}
		out[name] = [2]float64{calls, perCall}
	}
	return out, nil
}

// agentProc is a lockagent process.
type agentProc struct {
	socket string
	cmd    *exec.Cmd
	log    string
	pid    int // the process an upgrade handed the agent over to; 0: none
}

// startAgent runs bin with a config of the given backend block ("" for the
// embedded backend) and waits until its socket answers.
func startAgent(bin, dir, name, backendBlock string) (*agentProc, error) {
	dir = filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	socket := filepath.Join(dir, "agent.sock")
	cfg := fmt.Sprintf(`socket {
  path = %q
}
state_dir = %q
log_level = "warn"
%s
limits {
  max_sessions = 50000
  max_leases_per_session = 1000
  max_waiters = 50000
}
`, socket, dir, backendBlock)
	cfgPath := filepath.Join(dir, "agent.hcl")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "agent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "agent", "-config", cfgPath, "-socket", socket)
	cmd.Env = agentEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start agent: %w", err)
	}
	a := &agentProc{socket: socket, cmd: cmd, log: logPath}
	err = poll(10*time.Second, func() error {
		c, err := dialLine(a.socket)
		if err != nil {
			return err
		}
		defer c.close()
		_, err = c.roundTrip([]byte(`{"id":1,"op":"ping"}` + "\n"))
		return err
	})
	if err != nil {
		a.stop()
		b, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("agent %s did not answer: %w\n%s", name, err, b)
	}
	return a, nil
}

func (a *agentProc) stop() {
	if a.pid != 0 {
		stopUpgraded(a.pid)
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { a.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		a.cmd.Process.Kill()
		<-done
	}
}

// cpuSeconds is the CPU time (user and system) the process has used.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	const ticks = 100 // USER_HZ on Linux
	return (utime + stime) / ticks, nil
}

// ctxSwitches is how many times the threads of the process have been
// switched out, voluntarily or not: each is a sleep and a wake-up, or a
// preemption.
func ctxSwitches(pid int) float64 {
	dirs, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	var n float64
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue // the thread ended
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "voluntary_ctxt_switches") {
				f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
				n += f
			}
		}
	}
	return n
}

// rssMiB is the resident memory of the process.
func rssMiB(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kib, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kib / 1024, err
		}
	}
	return 0, errors.New("no VmRSS in /proc/PID/status")
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// poll calls f until it succeeds or the timeout passes.
func poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// buildAgent builds the lockagent binary of the repository at root.
func buildAgent(root, dir string) (string, error) {
	bin := filepath.Join(dir, "lockagent")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/lockagent")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/lockagent: %w\n%s", err, out)
	}
	return bin, nil
}

// agentEnv is this process's environment for an agent it starts, without
// what would point the agent at another socket (LOCKAGENT_SOCKET, which
// the README has its reader export) or at the host's systemd.
func agentEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "LOCKAGENT_SOCKET", "XDG_RUNTIME_DIR", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID",
			"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "INVOCATION_ID", "CREDENTIALS_DIRECTORY":
			continue
		}
		env = append(env, kv)
	}
	return env
}
