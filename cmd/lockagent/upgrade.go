package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/lockagent/lockagent/backend/etcd"
	"github.com/lockagent/lockagent/config"
	"github.com/lockagent/lockagent/internal/descriptor"
	"github.com/lockagent/lockagent/internal/handover"
)

// An upgrade hands the serving agent over to a new process of the binary
// at the path this one was started from (a package that replaced it takes
// effect), with this one's arguments: see internal/handover for the
// conversation. The old process goes on as if nothing had happened if the
// new one fails at any step before the commit; after it, it exits.

// startedFrom is the binary this process was started from, as its path
// was then: os.Executable, once the file is replaced, names the old one.
var startedFrom = func() string {
	exe, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return exe
}()

// Bounds of an upgrade's steps.
const (
	// helloTimeout bounds the new process's start: it reads its config
	// and opens its backend (the agent serves meanwhile).
	upgradeStartTimeout = 20 * time.Second
	// freezeTimeout bounds the wait for the requests and backend calls
	// under way to end, before the agent is frozen.
	freezeTimeout = 2 * time.Second
	// restoreTimeout bounds the new process's restore of the state (the
	// agent is frozen meanwhile), and half the time until the first
	// lease's local deadline bounds it too: then the old process thaws
	// in time to renew it.
	restoreTimeout = 10 * time.Second
)

// errAgentLost: an upgrade failed once the new process had served, which
// then ended. This process must not serve either: what it knows of the
// agent may be stale.
type errAgentLost struct{ error }

// upgrader runs the upgrades of an instance, one at a time.
type upgrader struct {
	in *instance

	mu      sync.Mutex
	running bool
	done    chan int // the new pid, once an upgrade has handed the agent over
}

func newUpgrader(in *instance) *upgrader {
	return &upgrader{in: in, done: make(chan int, 1)}
}

// start starts an upgrade, unless one runs: the upgrade op, and SIGUSR2.
func (u *upgrader) start() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.running {
		return
	}
	u.running = true
	go func() {
		pid, err := u.upgrade()
		u.mu.Lock()
		u.running = false
		u.mu.Unlock()
		var lost errAgentLost
		if errors.As(err, &lost) {
			u.in.log.Error("upgrade failed, and the agent is lost: exiting", "error", err)
			os.Exit(1)
		}
		if err != nil {
			u.in.upgrades.Failed++
			u.in.countUpgrades()
			u.in.log.Error("upgrade failed; serving on", "error", err)
			u.in.srv.UpgradeFailed(err)
			return
		}
		u.done <- pid
	}()
}

// upgrade runs one upgrade: it returns the new process's pid once that
// one serves, or why it failed, the agent serving on.
func (u *upgrader) upgrade() (int, error) {
	in := u.in
	log := in.log.Named("upgrade")
	conn, child, err := handover.Pair()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	cmd := exec.Command(startedFrom, os.Args[1:]...)
	cmd.ExtraFiles = []*os.File{child} // descriptor 3
	cmd.Env = append(childEnv(), handover.Env+"=3")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err = cmd.Start()
	child.Close()
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", startedFrom, err)
	}
	log.Info("upgrading", "binary", startedFrom, "pid", cmd.Process.Pid)
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	handed := false
	defer func() {
		if !handed {
			cmd.Process.Kill()
		}
	}()
	// The conversation ends soon after the new process exits, even if it
	// left its side to a child of its own: what it said before it exited
	// is read meanwhile.
	go func() {
		<-exited
		conn.SetDeadline(time.Now().Add(time.Second))
	}()

	conn.SetDeadline(time.Now().Add(upgradeStartTimeout))
	var hello handover.Hello
	if err := conn.Recv(&hello); err != nil {
		return 0, fmt.Errorf("the new process (%s): %w", startedFrom, endedWith(err, exited, cmd))
	}
	if hello.Failed != "" {
		return 0, fmt.Errorf("the new process (%s, version %s) cannot start: %s", startedFrom, hello.Version, hello.Failed)
	}
	format, refuse := u.accept(hello)
	if err := conn.Send(handover.Accept{Format: format, Refuse: refuse}); err != nil || refuse != "" {
		return 0, refusal(refuse, err)
	}
	var want handover.Want
	if err := conn.Recv(&want); err != nil {
		return 0, fmt.Errorf("the new process: %w", endedWith(err, exited, cmd))
	}
	if want.Failed != "" {
		return 0, fmt.Errorf("the new process cannot take the agent over: %s", want.Failed)
	}
	// The connections, while the agent serves on: the new process takes
	// them before the freeze.
	preparing := time.Now()
	ids, cfds, sentConns := in.srv.Connections()
	err = conn.Send(handover.Conns{IDs: ids})
	if err == nil {
		err = conn.SendFDs(cfds)
	}
	sentConns()
	if err != nil {
		return 0, fmt.Errorf("handing the connections over: %w", endedWith(err, exited, cmd))
	}
	var take handover.Take
	if err := conn.Recv(&take); err != nil {
		return 0, fmt.Errorf("the new process: %w", endedWith(err, exited, cmd))
	}
	if take.Failed != "" {
		return 0, fmt.Errorf("the new process cannot take the connections: %s", take.Failed)
	}

	// Frozen from here: no request is read or answered, no backend call
	// made, until the new process serves, or the agent thaws.
	began, frozen := time.Now(), handover.Now()
	ctx, cancel := context.WithTimeout(context.Background(), freezeTimeout)
	defer cancel()
	if err := in.srv.Freeze(ctx); err != nil {
		return 0, fmt.Errorf("requests under way did not end in %s: %w", freezeTimeout, err)
	}
	if err := in.a.Freeze(ctx); err != nil {
		in.srv.Thaw()
		return 0, fmt.Errorf("backend calls under way did not end in %s: %w", freezeTimeout, err)
	}
	in.srv.FreezeOutput()
	froze := time.Now()
	thaw := func() {
		in.a.Thaw()
		in.srv.Thaw()
	}
	st, fds, err := in.snapshot(hello.Settings, ids)
	if err != nil {
		thaw()
		return 0, err
	}
	st.Format, st.Frozen = format, frozen
	snapshotted := time.Now()
	limit := restoreTimeout
	if slack, ok := in.a.Slack(); ok {
		limit = min(limit, slack/2)
	}
	conn.SetDeadline(time.Now().Add(limit))
	err = conn.Send(st)
	if err == nil {
		err = conn.SendFDs(fds)
	}
	if err != nil {
		thaw()
		return 0, fmt.Errorf("handing the state over: %w", endedWith(err, exited, cmd))
	}
	sent := time.Now()
	var ready handover.Ready
	if err := conn.Recv(&ready); err != nil || ready.Failed != "" {
		thaw()
		switch {
		case err == nil:
			return 0, fmt.Errorf("the new process could not take the agent over: %s", ready.Failed)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return 0, fmt.Errorf("the new process was not ready in %s (at most %s, and half the time until the first lease's local deadline)", limit, restoreTimeout)
		}
		return 0, fmt.Errorf("the new process: %w", endedWith(err, exited, cmd))
	}
	restored := time.Now()
	// The commit. The new process says it serves before it does: until
	// then the agent is still this process's.
	var serving handover.Serving
	err = conn.Send(handover.Commit{From: os.Getpid()})
	if err == nil {
		err = conn.Recv(&serving)
	}
	if err == nil && serving.PID <= 0 {
		err = fmt.Errorf("it said it serves as pid %d", serving.PID)
	}
	if err != nil {
		// It must never serve now: killed, it cannot. If it had said it
		// serves before it ended, it may have served, and changed what
		// this process knows: the agent is lost.
		cmd.Process.Kill()
		<-exited
		conn.SetDeadline(time.Now().Add(time.Second))
		if conn.Recv(&serving) == nil {
			return 0, errAgentLost{fmt.Errorf("the new process (pid %d) ended once it served", serving.PID)}
		}
		thaw()
		return 0, fmt.Errorf("the new process ended before it served: %w", endedWith(err, exited, cmd))
	}
	handed = true
	notifyMainPID(serving.PID, log)
	log.Info("upgraded: handed the agent over", "pid", serving.PID, "version", serving.Version, "took", time.Since(began),
		"prepare", began.Sub(preparing), "freeze", froze.Sub(began), "snapshot", snapshotted.Sub(froze), "send", sent.Sub(snapshotted),
		"restore", restored.Sub(sent), "commit", time.Since(restored), "connections", len(st.Server.Conns))
	return serving.PID, nil
}

// accept checks the new process's hello: the format of the state it will
// be sent, or why the upgrade is refused.
func (u *upgrader) accept(h handover.Hello) (int, string) {
	mine := settingsOf(u.in.cfg)
	switch {
	case mine.Backend != h.Settings.Backend:
		return 0, fmt.Sprintf("the new configuration's backend (%s) is not the running one's (%s): restart the agent to change it", h.Settings.Backend, mine.Backend)
	case mine.Socket != h.Settings.Socket:
		return 0, fmt.Sprintf("the new configuration's socket (%s) is not the running one's (%s): restart the agent to change it", h.Settings.Socket, mine.Socket)
	}
	if f := handover.Pick(handover.Formats, h.Formats); f != 0 {
		return f, ""
	}
	return 0, fmt.Sprintf("the new binary (%s) reads state formats %v, and this one writes %v: upgrade through the releases between, or restart the agent", h.Version, h.Formats, handover.Formats)
}

// settingsOf are the settings a handover keeps: the backend and where it
// keeps the locks (not its credentials, TLS files or timeouts, which may
// change), and the socket.
func settingsOf(cfg config.Config) handover.Settings {
	st := handover.Settings{Socket: cfg.Socket.Path, Metrics: cfg.Metrics.Address}
	switch b := cfg.Backend; b.Kind {
	case "redis":
		r := b.Redis
		st.Backend = fmt.Sprintf("redis %s cluster=%v master=%q db=%d key_prefix=%q", strings.Join(r.Addresses, ","), r.Cluster, r.MasterName, r.DB, r.KeyPrefix)
	case "etcd":
		e := b.Etcd
		st.Backend = fmt.Sprintf("etcd %s key_prefix=%q", strings.Join(e.Endpoints, ","), e.KeyPrefix)
	default:
		st.Backend = "memory " + cfg.StateDir
	}
	return st
}

// endedWith is the error of a conversation that failed with err: the new
// process's exit, if it exited.
func endedWith(err error, exited <-chan struct{}, cmd *exec.Cmd) error {
	select {
	case <-exited:
		return fmt.Errorf("it exited (%s)", cmd.ProcessState)
	case <-time.After(100 * time.Millisecond):
	}
	return err
}

// refusal is the refusal, else err.
func refusal(refuse string, err error) error {
	if refuse != "" {
		return errors.New(refuse)
	}
	return err
}

// childEnv is this process's environment for the new one: without what
// systemd gave this process alone. The watchdog goes with the service's
// main process, which the new one becomes (see notifyMainPID).
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", handover.Env:
			continue
		}
		env = append(env, kv)
	}
	return env
}

// notifyMainPID tells systemd, if it runs the agent, that pid is the
// service's main process now.
func notifyMainPID(pid int, log interface{ Warn(string, ...any) }) {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return
	}
	if _, err := daemon.SdNotify(false, "MAINPID="+strconv.Itoa(pid)); err != nil {
		log.Warn("cannot tell systemd the new main process", "error", err)
	}
}

// snapshot takes the state of the frozen agent, for a new process whose
// settings are theirs: the agent's, its server's and its embedded
// backend's, and the descriptors that go with them.
func (in *instance) snapshot(theirs handover.Settings, sent []uint64) (handover.State, []int, error) {
	st := handover.State{StateLock: -1, Metrics: -1}
	var err error
	if st.Agent, err = in.a.Snapshot(); err != nil {
		return st, nil, err
	}
	sst, fds, err := in.srv.Snapshot(sent)
	if err != nil {
		return st, nil, err
	}
	st.Server = sst
	if in.mem != nil {
		mst, err := in.mem.Snapshot(time.Now())
		if err != nil {
			return st, nil, err
		}
		st.Memory = &mst
	}
	if eb, ok := in.b.(*etcd.Backend); ok {
		est := eb.Snapshot(time.Now())
		st.Etcd = &est
	}
	if in.stateLock != nil {
		st.StateLock = len(fds)
		fds = append(fds, int(in.stateLock.File().Fd()))
	}
	if in.mln != nil && theirs.Metrics == in.cfg.Metrics.Address {
		sc, ok := in.mln.(syscall.Conn)
		if !ok {
			return st, nil, errors.New("metrics: the listener has no descriptor")
		}
		fd, err := descriptor.Of(sc)
		if err != nil {
			return st, nil, fmt.Errorf("metrics: %w", err)
		}
		st.Metrics = len(fds)
		fds = append(fds, fd)
	}
	st.FDs = len(fds)
	st.Upgrades = in.upgrades
	st.Mono = handover.Now()
	return st, fds, nil
}
