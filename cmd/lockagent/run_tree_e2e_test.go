package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRunTree: a lost lock stops every process the command started, even
// one detached from it, and run exits only once they are gone; the
// command's own setsid still works, and what run adopts is reaped.
func TestRunTree(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.start(t)
	env := e.clientEnv()

	t.Run("lost lock stops a grandchild", func(t *testing.T) {
		dir := t.TempDir()
		pidFile := filepath.Join(dir, "pid")
		// The grandchild's name holds spaces and parentheses, as any
		// command name in /proc/PID/stat may.
		sleepPath, err := exec.LookPath("sleep")
		require.NoError(t, err)
		sleeper := filepath.Join(dir, "a) b (")
		require.NoError(t, os.Symlink(sleepPath, sleeper))
		p := startProc(t, "run", env, lockagentBin, "run", "-grace", "5s", "tree/grandchild", "--",
			"sh", "-c", fmt.Sprintf(`%q 300 & echo $! > %q; wait`, sleeper, pidFile))
		pid := readPIDFile(t, pidFile)
		start := time.Now()
		requireCode(t, 0, lockagent(t, env, "ctl", "break", "tree/grandchild"), "ctl break")
		eventually(t, exitTimeout, "the grandchild ends", func() bool { return processGone(pid) })
		require.Equal(t, 143, p.wait(t, exitTimeout), "run's exit status: the command's, killed by SIGTERM")
		require.Less(t, time.Since(start), 5*time.Second, "run waited out the grace period for processes already gone")
	})

	t.Run("lost lock kills a detached process that ignores SIGTERM", func(t *testing.T) {
		dir := t.TempDir()
		pidFile := filepath.Join(dir, "pid")
		script := filepath.Join(dir, "detached.sh")
		require.NoError(t, os.WriteFile(script, []byte(fmt.Sprintf(
			"trap '' TERM\necho $$ > %q\nwhile :; do sleep 1; done\n", pidFile)), 0o600))
		// The subshell exits at once: the process it leaves, in a session
		// of its own, is nobody's child but run's.
		p := startProc(t, "run", env, lockagentBin, "run", "-grace", "500ms", "tree/detached", "--",
			"sh", "-c", fmt.Sprintf(`(setsid sh %q &); while :; do sleep 0.05; done`, script))
		pid := readPIDFile(t, pidFile)
		sid, ok := statField(pid, 6)
		require.True(t, ok && sid == pid, "the process leads a session of its own")
		start := time.Now()
		requireCode(t, 0, lockagent(t, env, "ctl", "break", "tree/detached"), "ctl break")
		require.Equal(t, 143, p.wait(t, exitTimeout), "run's exit status: the command's, killed by SIGTERM")
		require.True(t, processGone(pid), "run exited before the detached process was gone")
		require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond, "SIGKILL came before the grace period")
	})

	t.Run("the command's own setsid", func(t *testing.T) {
		// util-linux setsid forks, and returns at once, when its caller
		// leads a process group; the command does not.
		r := lockagent(t, env, "run", "tree/setsid", "--", "setsid", "sh", "-c", "exit 5")
		requireCode(t, 5, r, "run of setsid")
	})

	t.Run("an orphan that ends is reaped", func(t *testing.T) {
		dir := t.TempDir()
		pidFile, flag := filepath.Join(dir, "pid"), filepath.Join(dir, "end")
		// The subshell exits at once, leaving an orphan that ends when
		// the test says.
		p := startProc(t, "run", env, lockagentBin, "run", "tree/orphan", "--", "sh", "-c", fmt.Sprintf(
			`(sh -c 'while [ ! -e %q ]; do sleep 0.02; done' & echo $! > %q); while :; do sleep 0.05; done`, flag, pidFile))
		pid := readPIDFile(t, pidFile)
		eventually(t, exitTimeout, "run adopts the orphan", func() bool {
			ppid, _ := statField(pid, 4)
			return ppid == p.cmd.Process.Pid
		})
		require.NoError(t, os.WriteFile(flag, nil, 0o600))
		eventually(t, exitTimeout, "the orphan is reaped, not left a zombie", func() bool {
			_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
			return os.IsNotExist(err)
		})
		require.False(t, p.exited(), "the command still runs")
		p.signal(t, syscall.SIGTERM)
		require.Equal(t, 143, p.wait(t, exitTimeout), "run's exit status")
	})
}

// TestRunElectTree: when a term is lost, `run -elect` stops every process
// the command started, and the next term's command starts only once they
// are gone.
func TestRunElectTree(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.start(t)
	p := startProc(t, "run-elect", e.clientEnv(), lockagentBin, "run", "-elect", "tree/elect", "-grace", "5s", "--",
		"sh", "-c", `sleep 300 & echo "start $!"; wait`)
	var pid int
	_, err := fmt.Sscanf(p.waitOutput(t, "start ", exitTimeout), "start %d", &pid)
	require.NoError(t, err)
	killAtCleanup(t, pid)
	requireCode(t, 0, lockagent(t, e.clientEnv(), "ctl", "break", "tree/elect"), "ctl break")
	// Alone in the race, the campaign wins the next term at once.
	eventually(t, exitTimeout, "the next term's command", func() bool {
		return strings.Count(p.stdout.String(), "start ") == 2
	})
	require.True(t, processGone(pid), "the next term's command started beside the last one's processes")
	out := p.stdout.String()
	var next int
	_, err = fmt.Sscanf(out[strings.LastIndex(out, "start "):], "start %d", &next)
	require.NoError(t, err)
	killAtCleanup(t, next) // a signal to run goes to the command alone
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 143, p.wait(t, exitTimeout), "run's exit status")
}

// TestRunKeepsIgnoredSignals: a SIGHUP or SIGINT ignored when run starts
// (nohup, a script's background job) stays ignored by run and by the
// command; the others are still passed on.
func TestRunKeepsIgnoredSignals(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.start(t)
	status := filepath.Join(t.TempDir(), "status")
	p := startProc(t, "run", e.clientEnv(), "sh", "-c", fmt.Sprintf(`trap '' HUP INT; exec %q run sig/ignored -- sh -c 'grep SigIgn /proc/self/status > %q; exec sleep 300'`,
		lockagentBin, status))
	var line []byte
	eventually(t, exitTimeout, "the command starts", func() bool {
		line, _ = os.ReadFile(status)
		return bytes.HasSuffix(line, []byte("\n"))
	})
	mask, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(string(line), "SigIgn:")), 16, 64)
	require.NoError(t, err, "SigIgn in %q", line)
	require.Equal(t, uint64(1<<(syscall.SIGHUP-1)|1<<(syscall.SIGINT-1)), mask&(1<<(syscall.SIGHUP-1)|1<<(syscall.SIGINT-1)),
		"the command inherits the ignored SIGHUP and SIGINT (SigIgn %#x)", mask)
	// run ignores the SIGHUP, and passes the SIGTERM on.
	p.signal(t, syscall.SIGHUP)
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 143, p.wait(t, exitTimeout), "run's exit status: the command's, killed by SIGTERM, not SIGHUP")
}

// readPIDFile waits for a command to write a pid into path, and kills
// that process at the end of the test if it still runs.
func readPIDFile(t *testing.T, path string) int {
	t.Helper()
	var pid int
	eventually(t, exitTimeout, "a pid in "+path, func() bool {
		b, err := os.ReadFile(path)
		if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	killAtCleanup(t, pid)
	return pid
}

// killAtCleanup kills pid at the end of the test if it still runs: a
// process that a failing test left behind.
func killAtCleanup(t *testing.T, pid int) {
	t.Cleanup(func() {
		if !processGone(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// processGone tells whether pid has ended: it is gone from /proc, or a
// zombie.
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name, in parentheses, which may
	// itself hold parentheses.
	return bytes.HasPrefix(b[bytes.LastIndexByte(b, ')')+1:], []byte(" Z"))
}

// statField returns field n (from 1, the pid) of /proc/PID/stat, a number
// after the command name: 4 is the parent pid, 6 the session. ok is false
// once the process is gone.
func statField(pid, n int) (v int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])) // from field 3
	v, err = strconv.Atoi(f[n-3])
	return v, err == nil
}
