package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockagent/lockagent/client"
)

// exitTempFail is run's status when the lock was not acquired in time
// (EX_TEMPFAIL).
const exitTempFail = 75

// exitNoPerm is run's status when the agent refuses the name to this user,
// by its access rules (EX_NOPERM): a script tells it from an agent it
// cannot reach (1) and from a name that is malformed (2).
const exitNoPerm = 77

func runCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run", stdout)
	socket := fs.String("socket", "", "the agent's socket `PATH` (else LOCKAGENT_SOCKET, else the default path)")
	wait := fs.Duration("wait", 0, "how long to wait for the lock, as `DUR` (default: without a limit)")
	shared := fs.Bool("shared", false, "take the lock shared")
	grace := fs.Duration("grace", 10*time.Second, "after SIGTERM on a lost lock, how long (`DUR`) before SIGKILL")
	elect := fs.String("elect", "", "campaign for leadership of `NAME`; run the command while leader")
	ttl := fs.Duration("ttl", 0, "the lease's TTL, as `DUR` (default: the agent's)")
	if len(args) == 0 {
		return usageError{"run", "no lock NAME and command"}
	}
	// Flags may come before or after NAME; the command follows "--".
	before, argv := args, []string(nil)
	split := fs.dashDash(args)
	if split >= 0 {
		before, argv = args[:split], args[split+1:]
	}
	names, err := fs.parseInterspersed(before)
	if err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var name string
	switch {
	case split < 0:
		return usageError{"run", "no -- before the command: lockagent run [flags] NAME -- CMD [ARGS...]"}
	case len(argv) == 0:
		return usageError{"run", "no command after --"}
	case *elect != "":
		if len(names) > 0 {
			return usageError{"run", fmt.Sprintf("-elect names the lock; %q is one name too many", names[0])}
		}
		if given["wait"] || given["shared"] {
			return usageError{"run", "-wait and -shared do not go with -elect"}
		}
		name = *elect
	case len(names) != 1:
		return usageError{"run", fmt.Sprintf("one lock NAME before --, not %d", len(names))}
	default:
		name = names[0]
	}
	switch {
	case given["wait"] && *wait < 0:
		return usageError{"run", "-wait must not be negative (leave it out to wait without a limit)"}
	case *grace < 0:
		return usageError{"run", "-grace must not be negative"}
	case *ttl < 0 || *ttl > 0 && *ttl < time.Millisecond:
		return usageError{"run", "-ttl must be at least 1ms"}
	}

	// run adopts what the command leaves behind (see proctree.go), and
	// reaps it when it ends.
	if err := becomeSubreaper(); err != nil {
		return err
	}
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	defer signal.Stop(chld)

	// Signals that would stop us go to the command instead, once it runs;
	// until then they stop run.
	sigs := make(chan os.Signal, 4)
	if relay := relayedSignals(); len(relay) > 0 {
		signal.Notify(sigs, relay...)
	}
	defer signal.Stop(sigs)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var c *client.Client
	var info client.AgentInfo
	err = untilSignal(cancel, sigs, func() (err error) {
		cctx, ccancel := context.WithTimeout(ctx, connectTimeout)
		defer ccancel()
		c, info, err = dialInfo(cctx, *socket, "lockagent run")
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if *elect != "" {
		return runElected(ctx, cancel, c, name, argv, *ttl, *grace, sigs, chld, stderr)
	}

	opts := client.AcquireOptions{Wait: client.WaitForever, TTL: *ttl}
	actx := ctx
	var allowance time.Duration
	if given["wait"] {
		opts.Wait = *wait
		// An agent that stops answering (stopped, hung) must not hold run
		// past its -wait by long. An attempt may take until the grant's
		// local deadline, about a TTL, when the backend is slow (a
		// failover): beyond that and the hello's timeout, it is stuck.
		allowance = min(cmp.Or(*ttl, info.DefaultTTL), maxAttempt) + helloTimeout
		var acancel context.CancelFunc
		actx, acancel = context.WithTimeout(ctx, *wait+allowance)
		defer acancel()
	}
	if *shared {
		opts.Mode = client.ModeShared
	}
	var lease *client.Lease
	err = untilSignal(cancel, sigs, func() (err error) {
		lease, err = c.Acquire(actx, name, opts)
		return err
	})
	var exit exitError
	var denied *client.NotAcquiredError
	switch {
	case errors.As(err, &exit):
		return err
	case badArgument(err):
		return usageError{"run", fmt.Sprintf("%s: %v", name, err)}
	case errors.Is(err, client.ErrPermissionDenied):
		fmt.Fprintf(stderr, "lockagent: %s: %v\n", name, err)
		return exitError{exitNoPerm}
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: no answer within -wait and %s more (a TTL, at most 30s, and %s): the agent, or its backend, is stuck", name, allowance, helloTimeout)
	case errors.As(err, &denied):
		fmt.Fprintf(stderr, "lockagent: %s not acquired (%s)\n", name, denied.Reason)
		return exitError{exitTempFail}
	case err != nil:
		return fmt.Errorf("%s: %w", name, err)
	}

	cmd, err := startCommand(argv, name, lease.ID, lease.Token, stderr)
	if err != nil {
		return err
	}

	var (
		kill     <-chan time.Time // set once the lock is lost
		deadline time.Time        // when what is left of the command gets SIGKILL
	)
	events, done := c.Events(), lease.Done()
	// lose stops the command once the lock is lost.
	lose := func(why string) {
		if kill == nil {
			fmt.Fprintf(stderr, "lockagent: lock %s lost (%s); stopping the command\n", name, why)
			cmd.stop(syscall.SIGTERM, stderr)
			deadline, kill = time.Now().Add(*grace), time.After(*grace)
		}
	}
	for {
		select {
		case err := <-cmd.exited:
			if kill != nil {
				// What the command started must not work on without
				// the lock either.
				waitTree(deadline, stderr)
			}
			// The lock is released before run returns, unless the
			// agent does not answer (the connection's end releases it).
			bctx, bcancel := context.WithTimeout(ctx, byeTimeout)
			c.Bye(bctx)
			bcancel()
			return exitStatus(err)
		case sig := <-sigs:
			cmd.relay(sig)
		case <-chld:
			reapOrphans(cmd)
		case <-done:
			done = nil
			lose(lostReason(lease.Reason()))
		case ev, ok := <-events:
			switch {
			case !ok:
				events = nil
			case ev.Event == "shutdown":
				lose("agent shutting down")
			}
		case <-kill:
			cmd.stop(syscall.SIGKILL, stderr)
		}
	}
}

// relayedSignals are the signals run passes on to the command: SIGTERM,
// SIGINT, SIGHUP and SIGQUIT, but for a SIGHUP or SIGINT ignored when run
// started (under nohup, or as a background job of a script), which stay
// ignored, by run and by the command, which inherits that. Go's runtime
// keeps only those two ignored; it handles the others itself.
func relayedSignals() []os.Signal {
	var relay []os.Signal
	for _, sig := range []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT} {
		if !signal.Ignored(sig) {
			relay = append(relay, sig)
		}
	}
	return relay
}

// connectTimeout bounds reaching the agent and saying hello.
const connectTimeout = 30 * time.Second

// untilSignal runs f, which waits on the agent before the command runs,
// unless a signal comes first: run then stops with 128+N, as the signal
// would have stopped it, and cancel ends what f waits for. The agent
// releases what the connection took when run exits.
func untilSignal(cancel context.CancelFunc, sigs <-chan os.Signal, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case sig := <-sigs:
		cancel()
		return exitError{128 + int(sig.(syscall.Signal))}
	}
}

// command is a command run started, under a lock or a term. A signal
// relayed to run goes to the command itself; a lost lock stops the
// processes it started too (see proctree.go).
type command struct {
	p      *os.Process
	exited <-chan error // its exit status, once it has ended
}

// startCommand starts argv with the lease in its environment.
func startCommand(argv []string, name, leaseID string, token uint64, stderr io.Writer) (*command, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, stderr
	cmd.Env = append(os.Environ(), "LOCKAGENT_TOKEN="+strconv.FormatUint(token, 10), "LOCKAGENT_LEASE="+leaseID, "LOCKAGENT_NAME="+name)
	// The command must not outlive run: a run killed (SIGKILL, the OOM
	// killer) closes its connection, the agent releases the lock, and a
	// command still running would work without it. The kernel kills it
	// when the thread that started it ends, which in Go is when the
	// process does: run locks no goroutine to its thread.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		// A shell's statuses: 127 for a command not found, 126 for one
		// that cannot be run.
		fmt.Fprintf(stderr, "lockagent: run %s: %v\n", argv[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return nil, exitError{127}
		}
		return nil, exitError{126}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return &command{p: cmd.Process, exited: exited}, nil
}

// signal sends sig to the command.
func (c *command) signal(sig syscall.Signal) { c.p.Signal(sig) }

// stop sends sig to the command and to every process it started, which
// are all of run's descendants; only to the command if /proc cannot tell
// them.
func (c *command) stop(sig syscall.Signal, stderr io.Writer) {
	living, _, err := descendants()
	if err != nil {
		fmt.Fprintf(stderr, "lockagent: %v; signalling the command only\n", err)
		c.signal(sig)
		return
	}
	signalAll(living, sig)
}

// relay passes on a signal sent to run, unless a terminal may have sent
// it: a terminal's SIGINT (Ctrl-C), SIGQUIT (Ctrl-\) and SIGHUP go to its
// whole foreground process group, which the command shares with run, and
// it must not get them twice (to many tools a second Ctrl-C means "abort
// at once"). Go does not tell who sent a signal, so while run is in the
// foreground, such a signal sent to run alone by another process is not
// passed on (README: SIGTERM always is).
func (c *command) relay(sig os.Signal) {
	if sig != syscall.SIGTERM && inTerminalForeground() {
		return
	}
	c.signal(sig.(syscall.Signal))
}

// maxAttempt caps the time run allows an attempt beyond -wait, however
// long the TTL: a stuck agent must not hold run for hours.
const maxAttempt = 30 * time.Second

// badArgument tells whether the agent refused a request for its arguments
// (the name, the TTL, a line too long for the agent's max_line_bytes): a
// mistake on the command line.
func badArgument(err error) bool {
	var se *client.Error
	return errors.As(err, &se) && (se.Code == client.CodeInvalidName || se.Code == client.CodeInvalidArgument ||
		se.Code == client.CodeLineTooLong)
}

// byeTimeout bounds how long run waits, once the command has ended, for
// the agent to release the lock.
const byeTimeout = 5 * time.Second

// inTerminalForeground tells whether run's process group is the foreground
// process group of its controlling terminal.
func inTerminalForeground() bool {
	tty, err := os.Open("/dev/tty")
	if err != nil {
		return false // no controlling terminal
	}
	defer tty.Close()
	pgrp, err := unix.IoctlGetInt(int(tty.Fd()), unix.TIOCGPGRP)
	return err == nil && pgrp == syscall.Getpgrp()
}

// lostReason says why a lease ended, from its Reason.
func lostReason(reason string) string {
	if reason == "connection closed" {
		return "connection to the agent lost"
	}
	return reason
}

// exitStatus turns the command's end into run's exit status: its own, or
// 128+N when killed by signal N.
func exitStatus(err error) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return exitError{128 + int(ws.Signal())}
		}
		return exitError{ee.ExitCode()}
	}
	return err
}
