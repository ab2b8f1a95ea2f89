package main

// The agent as systemd runs it: sd_notify captured on a datagram socket
// (NOTIFY_SOCKET), the watchdog's timing, a wedged agent and a backend
// outage, and sockets handed over by systemd-socket-activate and by plain
// fd passing.

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/testkit/faultproxy"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// watchdogUsec is the watchdog interval the tests give the agent (1s): it
// feeds it every 500ms.
const (
	watchdogUsec = "WATCHDOG_USEC=1000000"
	watchdog     = time.Second
)

// times is when each message with the line arrived, from the message at
// position from on.
func (n *notifyListener) times(line string, from int) []time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	var at []time.Time
	for i := from; i < len(n.msgs); i++ {
		if hasLine(n.msgs[i], line) {
			at = append(at, n.at[i])
		}
	}
	return at
}

// count is how many messages have the line.
func (n *notifyListener) count(line string) int { return len(n.times(line, 0)) }

// waitPrefix waits for a message with a line starting with prefix, and
// returns that line.
func (n *notifyListener) waitPrefix(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	var found string
	eventually(t, timeout, "sd_notify "+prefix+"…", func() bool {
		for _, m := range n.messages() {
			for l := range strings.SplitSeq(m, "\n") {
				if strings.HasPrefix(l, prefix) {
					found = l
					return true
				}
			}
		}
		return false
	})
	return found
}

// requireFedOnTime checks the watchdog's feeds: never further apart than
// the watchdog interval, and half of it apart on average.
func requireFedOnTime(t *testing.T, fed []time.Time) {
	t.Helper()
	require.GreaterOrEqual(t, len(fed), 3, "feeds")
	for i := 1; i < len(fed); i++ {
		require.Less(t, fed[i].Sub(fed[i-1]), watchdog, "a gap between feeds reaches the watchdog interval")
	}
	mean := fed[len(fed)-1].Sub(fed[0]) / time.Duration(len(fed)-1)
	require.InDelta(t, float64(watchdog/2), float64(mean), float64(watchdog/10), "mean gap %s", mean)
	t.Logf("%d feeds, %s apart on average", len(fed), mean)
}

// TestG1_NotifyLifecycle: READY=1 with a status line, a status that
// follows the sessions and leases, the watchdog fed at half its interval,
// RELOADING=1 then READY=1 around a SIGHUP reload, STOPPING=1 at SIGTERM.
func TestG1_NotifyLifecycle(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	notify := listenNotify(t, e.dir)
	a := e.start(t, "NOTIFY_SOCKET="+notify.path, watchdogUsec)
	ready := notify.wait(t, "READY=1", exitTimeout)
	// The start-up's own ping may be a session at that moment.
	require.Regexp(t, "\nSTATUS=[01] sessions, 0 leases, 0 waiting; backend memory: ok", notify.messages()[ready])

	c := dialAgent(t, e.socket, "e2e-g1")
	mustAcquire(t, c, "g1/a", nil)
	mustAcquire(t, c, "g1/b", map[string]any{"scope": "session"})
	notify.wait(t, "STATUS=1 sessions, 2 leases, 0 waiting; backend memory: ok", exitTimeout)

	eventually(t, exitTimeout, "five watchdog feeds", func() bool { return notify.count("WATCHDOG=1") >= 5 })
	requireFedOnTime(t, notify.times("WATCHDOG=1", 0))

	a.signal(t, syscall.SIGHUP)
	reloading := notify.wait(t, "RELOADING=1", exitTimeout)
	require.Regexp(t, `^RELOADING=1\nMONOTONIC_USEC=[0-9]+$`, notify.messages()[reloading])
	eventually(t, exitTimeout, "READY=1 after the reload", func() bool { return len(notify.times("READY=1", reloading)) == 1 })
	require.Contains(t, a.stderr.String(), "configuration reloaded")

	stopAgent(t, a)
	stopping := notify.wait(t, "STOPPING=1", exitTimeout)
	require.Greater(t, stopping, reloading)
}

// TestG2_WatchdogStopsWhileWedged: the agent's main loop stuck (here in a
// reload that cannot read its config file, a FIFO nobody writes) stops the
// watchdog, though the socket still answers; once the loop is free again,
// the feeds resume.
func TestG2_WatchdogStopsWhileWedged(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	notify := listenNotify(t, e.dir)
	a := e.start(t, "NOTIFY_SOCKET="+notify.path, watchdogUsec)
	eventually(t, exitTimeout, "watchdog feeds", func() bool { return notify.count("WATCHDOG=1") >= 2 })

	cfg, err := os.ReadFile(e.config)
	require.NoError(t, err)
	fifo := filepath.Join(e.dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	require.NoError(t, os.Rename(fifo, e.config))
	a.signal(t, syscall.SIGHUP)
	reloading := notify.wait(t, "RELOADING=1", exitTimeout)

	require.Never(t, func() bool { return len(notify.times("WATCHDOG=1", reloading)) > 0 },
		3*watchdog, 10*time.Millisecond, "the watchdog was fed while the agent was stuck")
	require.NoError(t, pingOnce(e.socket), "the socket is served all the while")

	w, err := os.OpenFile(e.config, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = w.Write(cfg)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	eventually(t, exitTimeout, "READY=1 after the reload", func() bool { return len(notify.times("READY=1", reloading)) == 1 })
	eventually(t, exitTimeout, "the feeds resume", func() bool { return len(notify.times("WATCHDOG=1", reloading)) >= 2 })
	stopAgent(t, a)
}

// TestG2_WatchdogThroughBackendOutage: with Redis black-holed, renewals
// fail and the status says so, but the watchdog is fed on time: restarting
// the agent would not bring Redis back.
func TestG2_WatchdogThroughBackendOutage(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t, redistest.Options{})
	proxy := faultproxy.New(t, rs.Addr())
	e := newAgentEnv(t)
	e.writeConfig(t, fmt.Sprintf("backend \"redis\" {\n  addresses  = [%q]\n  key_prefix = \"g2\"\n}\n", proxy.Addr()))
	notify := listenNotify(t, e.dir)
	a := e.start(t, "NOTIFY_SOCKET="+notify.path, watchdogUsec)
	notify.wait(t, "READY=1", exitTimeout)

	c := dialAgent(t, e.socket, "e2e-g2")
	mustAcquire(t, c, "g2/a", ttlArg(6*time.Second))
	notify.wait(t, "STATUS=1 sessions, 1 leases, 0 waiting; backend redis: ok", exitTimeout)

	proxy.Blackhole()
	degraded := notify.wait(t, "STATUS=1 sessions, 1 leases, 0 waiting; backend redis: degraded (renewals failing)", 2*exitTimeout)
	eventually(t, exitTimeout, "feeds while degraded", func() bool { return len(notify.times("WATCHDOG=1", degraded)) >= 4 })
	requireFedOnTime(t, notify.times("WATCHDOG=1", degraded))
	proxy.Pass()
	stopAgent(t, a)
}

// TestG1_ReadyOnlyOnceTheBackendAnswers: the socket listens first, but
// READY=1 waits for Redis to answer.
func TestG1_ReadyOnlyOnceTheBackendAnswers(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t, redistest.Options{})
	proxy := faultproxy.New(t, rs.Addr())
	proxy.Blackhole()
	e := newAgentEnv(t)
	e.writeConfig(t, fmt.Sprintf("backend \"redis\" {\n  addresses  = [%q]\n  key_prefix = \"g1\"\n}\n", proxy.Addr()))
	notify := listenNotify(t, e.dir)
	a := e.spawn(t, "NOTIFY_SOCKET="+notify.path)
	eventually(t, exitTimeout, "the socket listens", func() bool {
		fi, err := os.Lstat(e.socket)
		return err == nil && fi.Mode().Type() == os.ModeSocket
	})
	require.Never(t, func() bool { return notify.index("READY=1") >= 0 }, time.Second, 10*time.Millisecond,
		"READY=1 before the backend answered")
	proxy.Pass()
	notify.wait(t, "READY=1", 2*exitTimeout)
	stopAgent(t, a)
}

// TestG3_SocketActivation: under systemd-socket-activate, the agent serves
// the socket it is handed, never binds its own, and leaves the socket file
// in place when it stops, for its next start.
func TestG3_SocketActivation(t *testing.T) {
	t.Parallel()
	activate, err := exec.LookPath("systemd-socket-activate")
	require.NoError(t, err, "systemd-socket-activate (Debian's systemd package) is needed; .ci/run installs it")
	e := newAgentEnv(t)
	notify := listenNotify(t, e.dir)
	// socket.path in the config is the handed-over socket's path, so
	// that nothing is logged about a mismatch.
	e.writeConfig(t, fmt.Sprintf("socket {\n  path = %q\n}\n", e.socket))
	a := startProc(t, "agent", nil, activate, "-l", e.socket,
		"-E", "NOTIFY_SOCKET="+notify.path, "-E", "GORACE=atexit_sleep_ms=0",
		lockagentBin, "agent", "-config", e.config)
	// systemd-socket-activate starts the agent at the first connection.
	eventually(t, exitTimeout, "the agent answers", func() bool { return pingOnce(e.socket) == nil })
	notify.wait(t, "READY=1", exitTimeout)
	before, err := os.Lstat(e.socket)
	require.NoError(t, err)
	require.Contains(t, a.stderr.String(), "serving the socket systemd handed over")

	c := dialAgent(t, e.socket, "e2e-g3")
	mustAcquire(t, c, "g3/a", nil)
	// The agent takes no lock on the unit's socket; one started by hand
	// on it finds it live all the same.
	second := e.spawn(t)
	require.Equal(t, 1, second.wait(t, exitTimeout), "the second agent's exit status")
	require.Contains(t, second.stderr.String(), "socket in use by a live agent")
	call(t, c, "ping", nil, nil)
	stopAgent(t, a)
	after, err := os.Lstat(e.socket)
	require.NoError(t, err, "the agent removed the socket systemd handed over")
	require.True(t, os.SameFile(before, after), "the socket file was replaced")
	notify.wait(t, "STOPPING=1", exitTimeout)
}

// TestG3_SocketPassedByFD: the socket handed over as systemd does it,
// without systemd: fd 3, LISTEN_FDS=1 and LISTEN_PID set to the agent's pid
// by the shell that execs it. The socket lives at a path of the test's
// choosing, not socket.path.
func TestG3_SocketPassedByFD(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	path := filepath.Join(e.dir, "handed")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	f, err := ln.File()
	require.NoError(t, err)
	require.NoError(t, ln.Close())

	p := &proc{name: "agent", stdout: new(syncBuffer), stderr: new(syncBuffer), done: make(chan struct{})}
	p.cmd = exec.Command("/bin/sh", "-c", `LISTEN_PID=$$ LISTEN_FDS=1; export LISTEN_PID LISTEN_FDS; exec "$@"`,
		"sh", lockagentBin, "agent", "-config", e.config, "-socket", e.socket)
	p.cmd.Env = baseEnv()
	p.cmd.ExtraFiles = []*os.File{f}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	require.NoError(t, p.cmd.Start())
	f.Close()
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if !p.exited() {
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("agent stderr:\n%s", p.stderr)
		}
	})

	eventually(t, exitTimeout, "the agent answers on the handed-over socket", func() bool { return pingOnce(path) == nil })
	_, err = os.Lstat(e.socket)
	require.ErrorIs(t, err, os.ErrNotExist, "the agent bound socket.path as well")
	require.Contains(t, p.stderr.String(), "not socket.path")
	stopAgent(t, p)
	_, err = os.Lstat(path)
	require.NoError(t, err, "the agent removed the socket it was handed")
}

// TestG3_TwoSocketsRefused: the agent serves one socket; handed two, it
// says so and exits 1.
func TestG3_TwoSocketsRefused(t *testing.T) {
	t.Parallel()
	activate, err := exec.LookPath("systemd-socket-activate")
	require.NoError(t, err, "systemd-socket-activate (Debian's systemd package) is needed; .ci/run installs it")
	e := newAgentEnv(t)
	one, two := filepath.Join(e.dir, "one"), filepath.Join(e.dir, "two")
	a := startProc(t, "agent", nil, activate, "-l", one, "-l", two, "-E", "GORACE=atexit_sleep_ms=0",
		lockagentBin, "agent", "-config", e.config, "-socket", e.socket)
	eventually(t, exitTimeout, "the sockets listen", func() bool { _, err := os.Lstat(two); return err == nil })
	c, err := net.Dial("unix", one) // the first connection starts the agent
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, 1, a.wait(t, exitTimeout))
	require.Contains(t, a.stderr.String(), "2 sockets handed over")
	_, err = os.Lstat(e.socket)
	require.ErrorIs(t, err, os.ErrNotExist, "the agent bound socket.path instead")
}

// TestFatalErrorOnTheJournal: the error an agent stops on reaches the
// journal as an error, before its logger exists (a bad config) and after
// (a path that is not a socket), and a JSON log ends with it in JSON.
func TestFatalErrorOnTheJournal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, config string
		journal      bool
		want         string // a regexp of the last line
	}{
		{"bad config", `no_such_setting = 1`, true, `^<3>lockagent: .*no_such_setting`},
		{"not a socket", ``, true, `^<3>\[ERROR\] lockagent: agent stopped: error=".*not a socket`},
		{"not a socket, json", `log_format = "json"`, false, `^\{"@level":"error","@message":"agent stopped",.*not a socket`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newAgentEnv(t)
			e.writeConfig(t, tc.config)
			require.NoError(t, os.WriteFile(e.socket, nil, 0o600))
			stderr, err := os.Create(filepath.Join(e.dir, "stderr"))
			require.NoError(t, err)
			defer stderr.Close()
			env := baseEnv()
			if tc.journal {
				fi, err := stderr.Stat()
				require.NoError(t, err)
				st := fi.Sys().(*syscall.Stat_t)
				env = append(env, fmt.Sprintf("JOURNAL_STREAM=%d:%d", st.Dev, st.Ino))
			}
			cmd := exec.Command(lockagentBin, "agent", "-config", e.config, "-socket", e.socket)
			cmd.Env, cmd.Stderr = env, stderr
			err = cmd.Run()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee)
			require.Equal(t, 1, ee.ExitCode())
			out, err := os.ReadFile(stderr.Name())
			require.NoError(t, err)
			lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
			require.Regexp(t, tc.want, lines[len(lines)-1], "stderr:\n%s", out)
		})
	}
}
