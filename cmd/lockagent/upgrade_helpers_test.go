package main

import (
	"context"
	"fmt"
	"io"
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

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/handover"
	"github.com/lockagent/lockagent/internal/testkit/agentbin"
)

// nextVersion is the version of the binary the upgrade tests upgrade to.
const nextVersion = "e2e-next"

var (
	nextOnce sync.Once
	nextBin  string // the binary stamped nextVersion, built by nextBinary
	nextErr  error
)

// nextBinary builds, once, the binary of another version than the one
// under test.
func nextBinary(t *testing.T) string {
	t.Helper()
	nextOnce.Do(func() {
		dir := filepath.Join(binDir, nextVersion)
		if nextErr = os.Mkdir(dir, 0o755); nextErr == nil {
			nextBin, nextErr = agentbin.Build(dir, nextVersion)
		}
	})
	require.NoError(t, nextErr, "building the binary of version %s", nextVersion)
	return nextBin
}

// upgradable is an agent run from a binary of its own, in its home's bin/,
// as a package installs it, so that a test can replace it and upgrade.
// Its output goes to a file: the processes it hands the agent over to
// inherit it, and write on once the first one has exited.
type upgradable struct {
	env    *agentEnv
	bin    string // the path the agent was started from
	log    string // the agent's output, across its processes
	first  *exec.Cmd
	exited chan struct{} // closed once the first process has exited
	exit   error         // how, then
}

// startUpgradable starts an agent from env's bin/lockagent, a copy of
// from, and waits until it answers.
func startUpgradable(t *testing.T, env *agentEnv, from string) *upgradable {
	t.Helper()
	u := &upgradable{env: env, bin: filepath.Join(env.dir, "bin", "lockagent"), log: filepath.Join(env.dir, "agent.log"), exited: make(chan struct{})}
	require.NoError(t, os.MkdirAll(filepath.Dir(u.bin), 0o755))
	u.install(t, from)
	out, err := os.OpenFile(u.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(t, err)
	defer out.Close()
	u.first = exec.Command(u.bin, "agent", "-config", env.config, "-socket", env.socket)
	u.first.Env = append(baseEnv(), "LOCKAGENT_SOCKET="+filepath.Join(env.dir, "decoy"))
	u.first.Stdout, u.first.Stderr = out, out
	u.first.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	require.NoError(t, u.first.Start())
	go func() {
		u.exit = u.first.Wait()
		close(u.exited)
	}()
	t.Cleanup(func() { u.stop(t) })
	eventually(t, exitTimeout, "the agent answers", func() bool { return pingOnce(env.socket) == nil })
	return u
}

// install puts the binary from at the agent's path as a package manager
// does: a new file renamed over the old one, which a running process
// keeps.
func (u *upgradable) install(t *testing.T, from string) {
	t.Helper()
	src, err := os.Open(from)
	require.NoError(t, err)
	defer src.Close()
	tmp := u.bin + ".new"
	dst, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	require.NoError(t, err)
	require.NoError(t, dst.Close())
	require.NoError(t, os.Rename(tmp, u.bin))
}

// installScript puts a shell script at the agent's path.
func (u *upgradable) installScript(t *testing.T, script string) {
	t.Helper()
	tmp := u.bin + ".new"
	require.NoError(t, os.WriteFile(tmp, []byte("#!/bin/sh\n"+script+"\n"), 0o755))
	require.NoError(t, os.Rename(tmp, u.bin))
}

// status asks the agent for its status.
func (u *upgradable) status(t *testing.T) *client.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	c, err := client.Dial(ctx, u.env.socket)
	require.NoError(t, err)
	defer c.Close()
	st, err := c.Status(ctx)
	require.NoError(t, err)
	return st
}

// upgrade runs `lockagent ctl upgrade` and returns its result.
func (u *upgradable) upgrade(t *testing.T) cliResult {
	t.Helper()
	return lockagent(t, u.env.clientEnv(), "ctl", "upgrade")
}

// output is what the agent's processes wrote.
func (u *upgradable) output(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(u.log)
	require.NoError(t, err)
	return string(b)
}

// stop stops the process that serves the agent now, and every process
// the agent ran, and reports a data race any of them found.
func (u *upgradable) stop(t *testing.T) {
	if st, err := statusOnce(u.env.socket); err == nil && st.PID > 0 {
		syscall.Kill(st.PID, syscall.SIGTERM)
		deadline := time.Now().Add(exitTimeout)
		for alive(st.PID) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if alive(st.PID) {
			t.Errorf("the agent (pid %d) did not exit within %s of SIGTERM", st.PID, exitTimeout)
			syscall.Kill(st.PID, syscall.SIGKILL)
		}
	}
	// The session of the first process holds every process it started.
	syscall.Kill(-u.first.Process.Pid, syscall.SIGKILL)
	select {
	case <-u.exited:
	case <-time.After(exitTimeout):
		t.Errorf("the first agent process (pid %d) did not exit", u.first.Process.Pid)
	}
	out, _ := os.ReadFile(u.log)
	if strings.Contains(string(out), "WARNING: DATA RACE") {
		t.Errorf("an agent process reported a data race")
	}
	if t.Failed() {
		t.Logf("the agent's output:\n%s", out)
	}
}

// statusOnce asks the agent at socket for its status.
func statusOnce(socket string) (*client.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := client.Dial(ctx, socket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Status(ctx)
}

// alive tells whether the process pid runs: neither gone nor a zombie
// that nobody has reaped (an agent's orphan, once its parent exited).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// firstExited waits for the first process to exit, and requires status 0.
func (u *upgradable) firstExited(t *testing.T) {
	t.Helper()
	select {
	case <-u.exited:
		require.NoError(t, u.exit, "the first agent process's exit")
	case <-time.After(exitTimeout):
		t.Fatalf("the first agent process (pid %d) did not exit within %s of the upgrade", u.first.Process.Pid, exitTimeout)
	}
}

// requireServing checks that the agent serves as pid, of version.
func (u *upgradable) requireServing(t *testing.T, pid int, version string) {
	t.Helper()
	st := u.status(t)
	require.Equal(t, pid, st.PID, "the agent's pid")
	require.Equal(t, version, st.Version, "the agent's version")
	require.True(t, alive(pid), "pid %d runs", pid)
}

func (u *upgradable) String() string { return fmt.Sprintf("agent at %s", u.env.socket) }

// testBinary is the test binary, which runs the helpers.
func testBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	return self
}

// handoverThenWait is a new process of an upgrade that is killed in the
// middle of it: it takes the state and its descriptors from the agent
// that started it (with args, the agent's); at stage "commit", it also
// says it is ready and takes the commit, without saying it serves. Then it
// writes its pid to mark, and waits to be killed.
func handoverThenWait(stage, mark string, args []string) error {
	fs := newFlagSet("agent", io.Discard)
	file := fs.String("config", "", "")
	socket := fs.String("socket", "", "")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	cfg, err := loadConfig(*file, *socket, "")
	if err != nil {
		return err
	}
	fd, err := strconv.Atoi(os.Getenv(handover.Env))
	if err != nil {
		return err
	}
	conn, err := handover.Open(fd)
	if err != nil {
		return err
	}
	if err := conn.Send(handover.Hello{Version: "helper", PID: os.Getpid(), Formats: handover.Formats, Settings: settingsOf(cfg)}); err != nil {
		return err
	}
	var accept handover.Accept
	if err := conn.Recv(&accept); err != nil {
		return err
	}
	if err := conn.Send(handover.Want{}); err != nil {
		return err
	}
	var conns handover.Conns
	if err := conn.Recv(&conns); err != nil {
		return err
	}
	if _, err := conn.RecvFDs(len(conns.IDs)); err != nil {
		return err
	}
	if err := conn.Send(handover.Take{}); err != nil {
		return err
	}
	var st handover.State
	if err := conn.Recv(&st); err != nil {
		return err
	}
	if _, err := conn.RecvFDs(st.FDs); err != nil {
		return err
	}
	if stage == "commit" {
		if err := conn.Send(handover.Ready{}); err != nil {
			return err
		}
		if err := conn.Recv(&handover.Commit{}); err != nil {
			return err
		}
	}
	if err := os.WriteFile(mark, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return err
	}
	time.Sleep(time.Hour)
	return nil
}
