package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend/etcd"
	"github.com/lockagent/lockagent/backend/memory"
	"github.com/lockagent/lockagent/internal/descriptor"
	"github.com/lockagent/lockagent/internal/handover"
	"github.com/lockagent/lockagent/internal/lockfile"
	"github.com/lockagent/lockagent/metrics"
	"github.com/lockagent/lockagent/socketapi"
)

// takeOver is the new process's side of an upgrade (see upgrade): it takes
// the agent over from the process that started it, through the
// conversation on descriptor fd, then serves it as its own.
func (in *instance) takeOver(ctx context.Context, fd string) error {
	n, err := strconv.Atoi(fd)
	if err != nil {
		return fmt.Errorf("%s: %q is not a descriptor", handover.Env, fd)
	}
	conn, err := handover.Open(n)
	if err != nil {
		return err
	}
	in.from = conn
	conn.SetDeadline(time.Now().Add(upgradeStartTimeout))
	if err := conn.Send(handover.Hello{Version: version, PID: os.Getpid(), Formats: handover.Formats, Settings: settingsOf(in.cfg)}); err != nil {
		return err
	}
	var accept handover.Accept
	if err := conn.Recv(&accept); err != nil {
		return err
	}
	if accept.Refuse != "" {
		return fmt.Errorf("the running agent refused the upgrade: %s", accept.Refuse)
	}
	access, err := accessOf(in.cfg)
	// A backend of the network is opened while the agent serves on; the
	// embedded one is the state itself.
	if err == nil && in.cfg.Backend.Kind != "memory" {
		in.b, err = openBackend(ctx, in.cfg, in.log.Named("backend"))
	}
	if err != nil {
		conn.Send(handover.Want{Failed: err.Error()})
		return err
	}
	if err := conn.Send(handover.Want{}); err != nil {
		return err
	}
	// The connections, while the old process serves on.
	var conns handover.Conns
	if err := conn.Recv(&conns); err != nil {
		return err
	}
	cfiles, err := conn.RecvFDs(len(conns.IDs))
	if err != nil {
		return err
	}
	in.srv = in.server()
	if err := in.srv.Prepare(conns.IDs, cfiles); err != nil {
		conn.Send(handover.Take{Failed: err.Error()})
		return err
	}
	if err := conn.Send(handover.Take{}); err != nil {
		return err
	}
	conn.SetDeadline(time.Now().Add(restoreTimeout))
	var st handover.State
	if err := conn.Recv(&st); err != nil {
		return err
	}
	files, err := conn.RecvFDs(st.FDs)
	if err != nil {
		return err
	}
	// Until the commit nothing is closed, and nothing served: the socket
	// and the state are the running agent's, and the process just exits
	// when the upgrade fails. The files are closed as soon as restore has
	// its own copies: a copy kept would hold a connection open after the
	// agent ends it, its client never told.
	err = in.restore(access, st, files)
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		conn.Send(handover.Ready{Failed: err.Error()})
		return err
	}
	if err := conn.Send(handover.Ready{}); err != nil {
		return err
	}
	var commit handover.Commit
	if err := conn.Recv(&commit); err != nil {
		// No commit: the old process goes on with the agent, and this one
		// must not touch it.
		return fmt.Errorf("no commit from the running agent: %w", err)
	}
	in.fromPID = commit.From
	// Say so before serving: the old process goes on if it does not hear
	// it, once it has killed this one. If it cannot be told, it has
	// exited: the agent is this process's.
	if err := conn.Send(handover.Serving{PID: os.Getpid(), Version: version}); err != nil {
		in.log.Warn("the process this one took over from is gone", "error", err)
	}
	in.upgraded = time.Now()
	in.srv.Upgraded, in.srv.Upgrading = in.upgraded, st.Waited()
	in.upgrades = st.Upgrades
	in.upgrades.Succeeded++
	in.countUpgrades()
	return in.run(ctx, func() {})
}

// cannotTakeOver tells the process that started this one to take the
// agent over why this one cannot start (its configuration is invalid,
// say), if it did: the upgrade's error says it.
func cannotTakeOver(err error) {
	fd, err2 := strconv.Atoi(os.Getenv(handover.Env))
	if err2 != nil {
		return
	}
	conn, err2 := handover.Open(fd)
	if err2 != nil {
		return
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	conn.Send(handover.Hello{Version: version, PID: os.Getpid(), Formats: handover.Formats, Failed: err.Error()})
}

// restore builds the agent, its server and backend from the state handed
// over, and the files that came with it: nothing is served until the
// commit (the agent stays frozen, the server does not run).
func (in *instance) restore(access agent.Access, st handover.State, files []*os.File) error {
	elapsed := st.Since()
	if !slices.Contains(handover.Formats, st.Format) {
		return fmt.Errorf("a state of format %d, and this binary reads %v", st.Format, handover.Formats)
	}
	if st.Memory != nil {
		mb, err := memory.Restore(in.cfg.StateDir, *st.Memory, elapsed)
		if err != nil {
			return err
		}
		in.b, in.mem = mb, mb
	}
	if in.b == nil {
		return errors.New("the state has no embedded backend, and the configuration names it")
	}
	if eb, ok := in.b.(*etcd.Backend); ok && st.Etcd != nil {
		if err := eb.Restore(*st.Etcd, elapsed); err != nil {
			return err
		}
	}
	if st.StateLock >= 0 {
		f, err := descriptor.Dup(files[st.StateLock])
		if err != nil {
			return err
		}
		in.stateLock = lockfile.Adopt(f)
	}
	var err error
	switch {
	case st.Metrics >= 0:
		f, err := descriptor.Dup(files[st.Metrics])
		if err != nil {
			return err
		}
		defer f.Close()
		if in.mln, err = net.FileListener(f); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		in.mt = metrics.New()
	default:
		if in.mt, in.mln, err = listenMetrics(in.cfg.Metrics.Address); err != nil {
			return err
		}
	}
	if in.ln, err = socketapi.AdoptListener(st.Server, files); err != nil {
		return err
	}
	connOf, err := in.srv.Adopt(st.Server, files)
	if err != nil {
		return err
	}
	a, pending, err := agent.Restore(in.agentConfig(access), st.Agent, elapsed, connOf)
	if err != nil {
		return err
	}
	in.a, in.srv.Agent = a, a
	in.srv.Resume(pending)
	return nil
}
