package main

// BenchmarkIdleSessions measures the resident memory of a real agent process
// (the binary TestMain builds, embedded memory backend) that holds 10,000
// idle sessions: 10,000 Unix-socket connections from this process, each of
// which said hello and got its answer, and then sends nothing. Target: at
// most 100 MiB of RSS.
//
//	go test ./cmd/lockagent -run '^$' -bench IdleSessions -benchtime 1x
//
// Metrics, read from /proc/<pid>/status of the agent:
//
//	rss-MiB          VmRSS with every session open
//	hwm-MiB          VmHWM, the peak RSS of the agent since it started
//	baseline-MiB     VmRSS of the ready agent before the sessions were opened
//	KiB/session      (rss - baseline) / sessions
//	open-ms          how long opening the sessions took (ns/op is not shown:
//	                 an iteration is dominated by starting and stopping)
//
// It needs an RLIMIT_NOFILE of more than 10,000 descriptors on each side
// (Go raises the soft limit to the hard one), and refuses to run under the
// race detector, whose limit of 8128 live goroutines the agent would exceed,
// and whose shadow memory would make the figures meaningless anyway.

import (
	"bufio"
	"bytes"
	"context"
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

	"github.com/lockagent/lockagent/internal/testkit/agentbin"
)

const (
	idleSessions = 10000
	idleDialers  = 8
	// idleTargetMiB is the RSS the agent should stay within.
	idleTargetMiB = 100
)

func BenchmarkIdleSessions(b *testing.B) {
	if agentbin.RaceEnabled() {
		b.Fatal("run without -race: the race detector allows 8128 goroutines and its shadow memory skews RSS")
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	if lim.Cur < idleSessions+256 {
		b.Fatalf("RLIMIT_NOFILE is %d; %d sessions need more", lim.Cur, idleSessions)
	}

	var sum idleResult
	for i := 0; i < b.N; i++ {
		r := runIdleSessions(b)
		sum.rss += r.rss
		sum.hwm += r.hwm
		sum.baseline += r.baseline
		sum.open += r.open
	}
	n := float64(b.N)
	const mib = 1 << 20
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(sum.rss)/n/mib, "rss-MiB")
	b.ReportMetric(float64(sum.hwm)/n/mib, "hwm-MiB")
	b.ReportMetric(float64(sum.baseline)/n/mib, "baseline-MiB")
	b.ReportMetric(float64(sum.rss-sum.baseline)/n/idleSessions/1024, "KiB/session")
	b.ReportMetric(float64(sum.open.Milliseconds())/n, "open-ms")
	if rss := float64(sum.rss) / n / mib; rss > idleTargetMiB {
		b.Logf("over target: %.1f MiB of RSS for %d idle sessions (target %d MiB)", rss, idleSessions, idleTargetMiB)
	}
}

// idleResult is one iteration's measurements, in bytes.
type idleResult struct {
	rss, hwm, baseline int64
	open               time.Duration
}

// runIdleSessions starts an agent, measures it, opens the idle sessions,
// measures it again, then closes everything and stops the agent cleanly.
func runIdleSessions(b *testing.B) idleResult {
	dir, err := os.MkdirTemp("", "la")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "s")
	config := filepath.Join(dir, "agent.hcl")
	cfg := fmt.Sprintf("state_dir = %q\nlog_level = \"info\"\nlimits {\n  max_sessions = %d\n}\n",
		filepath.Join(dir, "state"), idleSessions+2000)
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		b.Fatal(err)
	}

	// The agent, started as e2e_helpers_test.go's agentEnv.spawn does
	// (whose helpers take a *testing.T).
	var stdout, stderr syncBuffer
	cmd := exec.Command(lockagentBin, "agent", "-config", config, "-socket", socket)
	cmd.Env = append(baseEnv(), "LOCKAGENT_SOCKET="+filepath.Join(dir, "decoy"))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	pid := cmd.Process.Pid
	defer func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			<-done
		}
		if b.Failed() {
			b.Logf("agent stderr:\n%s", stderr.String())
		}
	}()

	deadline := time.Now().Add(exitTimeout)
	for pingOnce(socket) != nil {
		select {
		case <-done:
			b.Fatalf("the agent exited before it was ready; stderr:\n%s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("the agent did not answer within %s; stderr:\n%s", exitTimeout, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // let the ping's session go
	before := procStatus(b, pid)

	start := time.Now()
	conns, err := openIdleSessions(socket, idleSessions)
	open := time.Since(start)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	if err != nil {
		b.Fatalf("opening %d sessions (%d open): %v", idleSessions, len(conns), err)
	}
	// Let the goroutines park and a GC cycle or two run, as in an agent
	// that has been idle for a moment; VmHWM keeps the peak anyway.
	time.Sleep(time.Second)
	after := procStatus(b, pid)
	select {
	case <-done:
		b.Fatalf("the agent exited; stderr:\n%s", stderr.String())
	default:
	}
	b.Logf("%d sessions in %s; agent before: %s; after: %s", len(conns), open.Round(time.Millisecond), before, after)

	for _, c := range conns {
		c.Close()
	}
	conns = nil
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.Fatal(err)
	}
	select {
	case <-done:
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			b.Fatalf("the agent's exit status after SIGTERM is %d; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(exitTimeout):
		b.Fatalf("the agent did not exit within %s of SIGTERM", exitTimeout)
	}
	return idleResult{rss: after.kib("VmRSS") << 10, hwm: after.kib("VmHWM") << 10, baseline: before.kib("VmRSS") << 10, open: open}
}

// openIdleSessions opens n connections to the agent with several dialers;
// each says hello and reads its answer, which must grant a session. It
// returns the connections open so far, also on error.
func openIdleSessions(socket string, n int) ([]*net.UnixConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conns := make([]*net.UnixConn, n)
	errs := make([]error, idleDialers)
	var wg sync.WaitGroup
	for d := 0; d < idleDialers; d++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			addr := &net.UnixAddr{Name: socket, Net: "unix"}
			hello := []byte(`{"id":1,"op":"hello","client":"idle"}` + "\n")
			var buf [1024]byte
			for i := d; i < n; i += idleDialers {
				if ctx.Err() != nil {
					errs[d] = ctx.Err()
					return
				}
				c, err := net.DialUnix("unix", nil, addr)
				if err != nil {
					errs[d] = fmt.Errorf("session %d: %w", i, err)
					return
				}
				conns[i] = c
				c.SetDeadline(time.Now().Add(callTimeout))
				if _, err := c.Write(hello); err != nil {
					errs[d] = fmt.Errorf("session %d: %w", i, err)
					return
				}
				k := 0
				for !bytes.Contains(buf[:k], []byte{'\n'}) {
					if k == len(buf) {
						errs[d] = fmt.Errorf("session %d: hello response longer than %d bytes", i, len(buf))
						return
					}
					m, err := c.Read(buf[k:])
					k += m
					if err != nil && m == 0 {
						errs[d] = fmt.Errorf("session %d: reading hello response: %w", i, err)
						return
					}
				}
				line := buf[:bytes.IndexByte(buf[:k], '\n')]
				if !bytes.Contains(line, []byte(`"ok":true`)) || !bytes.Contains(line, []byte(`"session":"s_`)) {
					errs[d] = fmt.Errorf("session %d: hello answered %s", i, line)
					return
				}
				c.SetDeadline(time.Time{})
			}
		}()
	}
	wg.Wait()
	open := conns[:0]
	for _, c := range conns {
		if c != nil {
			open = append(open, c)
		}
	}
	for _, err := range errs {
		if err != nil {
			return open, err
		}
	}
	return open, nil
}

// procStatusT is the fields of /proc/<pid>/status.
type procStatusT map[string]string

// procStatus reads /proc/<pid>/status.
func procStatus(b *testing.B, pid int) procStatusT {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	st := procStatusT{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			st[k] = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	if _, ok := st["VmRSS"]; !ok {
		b.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	return st
}

// kib is a "NNN kB" field in KiB, 0 if absent.
func (st procStatusT) kib(key string) int64 {
	v, _ := strconv.ParseInt(strings.TrimSuffix(st[key], " kB"), 10, 64)
	return v
}

func (st procStatusT) String() string {
	return fmt.Sprintf("VmRSS %d KiB (anon %d, file %d), VmHWM %d KiB, %s threads",
		st.kib("VmRSS"), st.kib("RssAnon"), st.kib("RssFile"), st.kib("VmHWM"), st["Threads"])
}
