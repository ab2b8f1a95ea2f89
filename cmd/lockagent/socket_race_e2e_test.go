package main

// Agents started together on one socket path: exactly one may serve it.

import (
	"context"
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

	"github.com/lockagent/lockagent/internal/testkit"
)

// raceRounds is how many rounds each case of TestRacingStartsServeOnce
// runs, and raceAgents how many agents start together in each.
const (
	raceRounds = 50
	raceAgents = 3
)

// TestRacingStartsServeOnce starts agents together on one socket path,
// round after round, with and without a stale socket file left at the
// path, with a state directory each and with one they share. In every
// round exactly one agent serves the path, every other one is refused as
// the socket's or the state directory's second agent, and the path still
// leads to the one that serves once the others are gone.
func TestRacingStartsServeOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		stale, shared bool
	}{
		{"separate state dirs", false, false},
		{"separate state dirs, stale socket", true, false},
		{"shared state dir", false, true},
		{"shared state dir, stale socket", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testkit.SkipShort(t, "the lockagent binary")
			dir, err := os.MkdirTemp("", "la")
			require.NoError(t, err)
			t.Cleanup(func() { os.RemoveAll(dir) })
			socket := filepath.Join(dir, "s")
			configs := make([]string, raceAgents)
			for i := range configs {
				state := filepath.Join(dir, "state")
				if !tc.shared {
					state = fmt.Sprintf("%s%d", state, i)
				}
				configs[i] = filepath.Join(dir, fmt.Sprintf("agent%d.hcl", i))
				require.NoError(t, os.WriteFile(configs[i], fmt.Appendf(nil, "state_dir = %q\n", state), 0o600))
			}
			bad, refused := 0, map[string]int{}
			for round := range raceRounds {
				if tc.stale {
					leaveStaleSocket(t, socket)
				}
				if problem := raceRound(t, socket, configs, refused); problem != "" {
					bad++
					t.Errorf("round %d: %s", round, problem)
				}
			}
			t.Logf("%d of %d rounds of %d racing agents went wrong; refusals: %v", bad, raceRounds, raceAgents, refused)
		})
	}
}

// leaveStaleSocket leaves at path the socket file of an agent killed with
// SIGKILL: bound, and served by nobody.
func leaveStaleSocket(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		require.ErrorIs(t, err, os.ErrNotExist)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
}

// racer is one agent of a round.
type racer struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{} // closed once it has exited
}

func (r *racer) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// raceRound starts an agent per config on socket, all at once, and says
// what went wrong, if anything; it counts the refusals by their reason.
// No agent is left running.
func raceRound(t *testing.T, socket string, configs []string, refused map[string]int) string {
	t.Helper()
	racers := make([]*racer, len(configs))
	for i, cfg := range configs {
		r := &racer{stderr: new(syncBuffer), done: make(chan struct{})}
		r.cmd = exec.Command(lockagentBin, "agent", "-config", cfg, "-socket", socket)
		r.cmd.Env = baseEnv()
		r.cmd.Stderr = r.stderr
		r.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		require.NoError(t, r.cmd.Start())
		go func() { r.cmd.Wait(); close(r.done) }()
		racers[i] = r
	}
	defer func() {
		for _, r := range racers {
			if !r.exited() {
				r.cmd.Process.Kill()
				<-r.done
			}
			if strings.Contains(r.stderr.String(), "WARNING: DATA RACE") {
				t.Errorf("agent %d reported a data race:\n%s", r.cmd.Process.Pid, r.stderr)
			}
		}
	}()
	report := func(format string, args ...any) string {
		var b strings.Builder
		fmt.Fprintf(&b, format, args...)
		for _, r := range racers {
			fmt.Fprintf(&b, "\n--- agent %d:\n%s", r.cmd.Process.Pid, r.stderr)
		}
		return b.String()
	}

	// Each agent either serves or is refused, and says so.
	eventually(t, exitTimeout, "every agent serves or is refused", func() bool {
		for _, r := range racers {
			if !r.exited() && !strings.Contains(r.stderr.String(), "agent started") {
				return false
			}
		}
		return true
	})
	var serving []*racer
	for _, r := range racers {
		if !r.exited() {
			serving = append(serving, r)
			continue
		}
		if code := r.cmd.ProcessState.ExitCode(); code != 1 {
			return report("agent %d exited with status %d", r.cmd.Process.Pid, code)
		}
		switch msg := r.stderr.String(); {
		case strings.Contains(msg, "socket in use by a live agent"):
			refused["socket"]++
		case strings.Contains(msg, "is in use by another agent"):
			refused["state_dir"]++
		default:
			return report("agent %d was refused for another reason", r.cmd.Process.Pid)
		}
	}
	var problem string
	if len(serving) != 1 {
		problem = fmt.Sprintf("%d agents serve %s", len(serving), socket)
	}

	// The path leads to one of them; the others stop, as an operator
	// would stop an agent nobody can reach, and the path must still lead
	// to the one that serves it.
	pid, err := socketServer(socket)
	if err != nil {
		return report("%s; nobody answers on the path: %v", problem, err)
	}
	var survivor *racer
	for _, r := range serving {
		if r.cmd.Process.Pid == pid {
			survivor = r
		}
	}
	if survivor == nil {
		return report("%s; the path leads to pid %d, which is none of the agents that serve", problem, pid)
	}
	for _, r := range serving {
		if r != survivor {
			r.cmd.Process.Signal(syscall.SIGTERM)
			<-r.done
		}
	}
	if after, err := socketServer(socket); err != nil || after != pid {
		problem = fmt.Sprintf("%s; once the others stopped, the path no longer leads to agent %d (pid %d, %v)", problem, pid, after, err)
	}
	survivor.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-survivor.done:
	case <-time.After(exitTimeout):
		return report("%s; agent %d did not stop on SIGTERM", problem, pid)
	}
	if code := survivor.cmd.ProcessState.ExitCode(); code != 0 {
		return report("%s; agent %d exited with status %d after SIGTERM", problem, pid, code)
	}
	if problem != "" {
		return report("%s", problem)
	}
	return ""
}

// socketServer pings the agent at socket and returns the pid of the
// process that listens there (SO_PEERCRED of a client's end).
func socketServer(socket string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	raw, err := nc.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, credErr
	}
	if err := pingOnce(socket); err != nil {
		return 0, err
	}
	return int(cred.Pid), nil
}

// TestSecondAgentSameStateDir: an agent on another socket but the state
// directory of a running one is refused, says which directory and who
// holds it, and leaves both that agent and the directory's fencing epoch
// alone.
func TestSecondAgentSameStateDir(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	first := e.start(t)
	app := dialAgent(t, e.socket, "e2e-app")
	l := mustAcquire(t, app, "statedir/x", nil)
	epoch := filepath.Join(e.stateDir, "epoch")
	before, err := os.ReadFile(epoch)
	require.NoError(t, err)

	other := &agentEnv{dir: e.dir, socket: filepath.Join(e.dir, "s2"), stateDir: e.stateDir, config: e.config}
	second := other.spawn(t)
	eventually(t, exitTimeout, "the second agent exits or serves", func() bool {
		return second.exited() || pingOnce(other.socket) == nil
	})
	require.True(t, second.exited(), "a second agent serves on the state directory")
	require.Equal(t, 1, second.wait(t, exitTimeout), "the second agent's exit status")
	require.Contains(t, second.stderr.String(), fmt.Sprintf("state_dir %s is in use by another agent: %s is held by pid %d",
		e.stateDir, filepath.Join(e.stateDir, "agent.lock"), first.cmd.Process.Pid))
	_, err = os.Lstat(other.socket)
	require.ErrorIs(t, err, os.ErrNotExist, "the refused agent left its socket")
	after, err := os.ReadFile(epoch)
	require.NoError(t, err)
	require.Equal(t, string(before), string(after), "the refused agent moved the fencing epoch")

	require.False(t, first.exited(), "the first agent is still running")
	require.Greater(t, mustAcquire(t, app, "statedir/y", nil).Token, l.Token)

	// Once the first agent is gone, its state directory is free.
	stopAgent(t, first)
	other.start(t)
}
