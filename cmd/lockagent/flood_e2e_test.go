package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
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

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/testkit/agentbin"
)

// listFlood is the helper process of TestSlowListReaders: as a client of
// the agent at LOCKAGENT_SOCKET it opens sessions holding many leases with
// long client names and metas, then opens connections that each ask for a
// list of them and read the answer slowly, a few KiB at a time. It prints
// "flooding" once every list is asked for, and runs until it is killed.
func listFlood(args []string) error {
	if len(args) != 4 {
		return fmt.Errorf("usage: SESSIONS LEASES READERS READ_EVERY")
	}
	sessions, _ := strconv.Atoi(args[0])
	leases, _ := strconv.Atoi(args[1])
	readers, _ := strconv.Atoi(args[2])
	every, err := time.ParseDuration(args[3])
	if err != nil {
		return err
	}
	socket := os.Getenv("LOCKAGENT_SOCKET")
	long := strings.Repeat("x", 256)
	for i := range sessions {
		nc, err := net.Dial("unix", socket)
		if err != nil {
			return err
		}
		floodConns = append(floodConns, nc)
		r := bufio.NewReader(nc)
		fmt.Fprintf(nc, `{"op":"hello","client":"%s%d"}`+"\n", long[:250], i)
		for j := 0; j < leases; j += 50 {
			for k := j; k < min(j+50, leases); k++ {
				fmt.Fprintf(nc, `{"op":"acquire","name":"flood/%d/%d","meta":%q}`+"\n", i, k, long)
			}
			for k := j; k < min(j+50, leases)+boolInt(j == 0); k++ {
				line, err := r.ReadString('\n')
				if err != nil {
					return err
				}
				if !strings.Contains(line, `"ok":true`) {
					return fmt.Errorf("refused: %s", line)
				}
			}
		}
	}
	// Each reader is counted once the agent has handled its list: its
	// answer begins (answered), or a refusal comes (refused), or its
	// connection ends first; and again if its connection ends before the
	// whole answer is read (cut off).
	var mu sync.Mutex
	counts := map[string]int{}
	count := func(how string) {
		mu.Lock()
		defer mu.Unlock()
		counts[how]++
		fmt.Printf("handled %d: answered %d, refused %d; cut off %d\n",
			counts["answered"]+counts["refused"]+counts["unanswered"], counts["answered"], counts["refused"], counts["cut off"])
	}
	for range readers {
		nc, err := net.Dial("unix", socket)
		if err != nil {
			return err
		}
		floodConns = append(floodConns, nc)
		if _, err := io.WriteString(nc, `{"op":"list"}`+"\n"); err != nil {
			return err
		}
		go func() {
			b := make([]byte, 4096)
			n, err := nc.Read(b)
			switch {
			case err != nil:
				count("unanswered")
				count("cut off")
				return
			case strings.Contains(string(b[:n]), `"limit_exceeded"`):
				count("refused")
				return
			}
			count("answered")
			for !bytes.Contains(b[:n], []byte("\n")) {
				time.Sleep(every) // the slow reader
				if n, err = nc.Read(b); err != nil {
					count("cut off")
					return
				}
			}
		}()
	}
	fmt.Println("flooding")
	select {}
}

// floodConns are listFlood's connections, which must stay open while it
// runs: a variable that goes out of use would let the collector close
// them (net.Conn's finalizer), and end the sessions that hold the leases.
var floodConns []net.Conn

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// processMemory reads a process's resident memory and its peak, in bytes.
func processMemory(t *testing.T, pid int) (rss, peak int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		kib, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = kib << 10
		case "VmHWM":
			peak = kib << 10
		}
	}
	return rss, peak
}

// floodPeakBound is the agent's peak resident memory that
// TestSlowListReaders allows: what docs/protocol.md promises under a flood
// of slow readers with the default limits.
const floodPeakBound = 160 << 20

// TestSlowListReaders: a uid that is not an admin holds 12,000 leases
// with long client names and metas, which make its list answer about
// 1.9 MB, and has 120 connections ask for it and read it a few KiB at a
// time. The output budget keeps the agent's memory bounded, and the other
// clients' pings stay fast.
func TestSlowListReaders(t *testing.T) {
	const readers = 120
	// The memory measured is the agent's own, not the race detector's.
	dir, err := os.MkdirTemp("", "la-flood")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	plain, err := agentbin.BuildWithoutRace(dir, testVersion)
	require.NoError(t, err)
	e := newAgentEnv(t)
	require.NoError(t, os.Chmod(e.dir, 0o755))
	e.writeConfig(t, "socket {\n  mode = \"0666\"\n}\nmetrics {\n  address = \"127.0.0.1:0\"\n}\n")
	e.bin = plain
	a := e.start(t)
	var url string
	eventually(t, exitTimeout, "the metrics address is logged", func() bool {
		m := metricsURL.FindStringSubmatch(a.stderr.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	})
	_, base := processMemory(t, a.cmd.Process.Pid)

	// The test binary, where nobody can run it.
	bin := filepath.Join(dir, "flood")
	self, err := os.Executable()
	require.NoError(t, err)
	data, err := os.ReadFile(self)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, data, 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	flood := &proc{name: "flood", stdout: new(syncBuffer), stderr: new(syncBuffer), done: make(chan struct{})}
	startAs(t, flood, 65534, append(e.clientEnv(), helperEnv+"=list-flood"), bin, "40", "300", fmt.Sprint(readers), "1s")
	flood.waitOutput(t, "flooding", 2*time.Minute)

	var (
		slowest time.Duration
		pings   int
	)
	// Pings go on until the agent has handled every reader's list, and
	// 5 s more.
	all := fmt.Sprintf("handled %d:", readers)
	c := dialAgent(t, e.socket, "e2e-ping")
	var allHandled time.Time
	for start := time.Now(); allHandled.IsZero() || time.Since(allHandled) < 5*time.Second; {
		require.Less(t, time.Since(start), 3*time.Minute, "the agent did not handle every list: %s", lastLine(flood.stdout.String()))
		if allHandled.IsZero() && strings.Contains(flood.stdout.String(), all) {
			allHandled = time.Now()
		}
		start := time.Now()
		call(t, c, "ping", nil, nil)
		fresh := dialAgent(t, e.socket, "e2e-fresh")
		call(t, fresh, "ping", nil, nil)
		fresh.Close()
		took := time.Since(start)
		slowest, pings = max(slowest, took), pings+1
		time.Sleep(100 * time.Millisecond) // a ping every tenth of a second
	}
	require.False(t, flood.exited(), "the flood ended: %s", flood.stderr)
	rss, peak := processMemory(t, a.cmd.Process.Pid)
	t.Logf("agent memory: %d MiB before the flood, %d MiB during it, %d MiB at most; slowest of %d pings (with a fresh connection each): %v; %s",
		base>>20, rss>>20, peak>>20, pings, slowest, lastLine(flood.stdout.String()))
	require.Less(t, peak, int64(floodPeakBound), "the agent's peak resident memory")
	require.Less(t, slowest, 500*time.Millisecond, "the slowest ping")
	// 120 answers of 1.9 MB fit in no uid's share of unread output: the
	// slowest readers were cut off, or answers refused.
	m := scrape(t, url)
	t.Logf("cut off: %v for the uid's share, %v by the write timeout; answers refused: %v",
		m[`lockagent_connections_cut_off_total{reason="uid_output"}`], m[`lockagent_connections_cut_off_total{reason="write_timeout"}`],
		m["lockagent_answers_refused_total"])
	require.Positive(t, m[`lockagent_connections_cut_off_total{reason="uid_output"}`]+m["lockagent_answers_refused_total"],
		"no reader cut off for the uid's share, and no answer refused")
}

// lastLine is the last line of out.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

// startAs starts p as uid and gid, as startProc does.
func startAs(t *testing.T, p *proc, uid uint32, env []string, path string, args ...string) {
	t.Helper()
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = append(baseEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	p.cmd.WaitDelay = 2 * time.Second
	require.NoError(t, p.cmd.Start(), "start %s", p.name)
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s stderr:\n%s", p.name, p.stderr)
		}
	})
}
