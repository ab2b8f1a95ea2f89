package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockagent/lockagent/socketapi"
)

// exitTempFail is run's status when the lock was not acquired in time
// (EX_TEMPFAIL).
const exitTempFail = 75

func runCmd(args []string, stderr io.Writer) error {
	fs := newFlagSet("run", stderr)
	socket := fs.String("socket", "", "agent socket path")
	wait := fs.Duration("wait", -1, "how long to wait for the lock (default: without limit)")
	shared := fs.Bool("shared", false, "take the lock shared")
	grace := fs.Duration("grace", 10*time.Second, "after SIGTERM on a lost lock, how long before SIGKILL")
	elect := fs.String("elect", "", "campaign for leadership of `NAME`; run the command while leader")
	ttl := fs.Duration("ttl", 0, "with -elect: the leadership lease's TTL (default: the agent's)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rest := fs.Args()
	var name string
	var argv []string
	switch {
	case *elect != "":
		// The flag parser consumed the "--" that ends the flags.
		if len(rest) == 0 || len(args) <= len(rest) || args[len(args)-len(rest)-1] != "--" {
			return usageError{"usage: lockagent run -elect NAME [-ttl DUR] [-grace DUR] -- CMD [ARGS...]"}
		}
		name, argv = *elect, rest
	case len(rest) < 3 || rest[1] != "--":
		return usageError{"usage: lockagent run [-wait DUR] [-shared] NAME -- CMD [ARGS...]"}
	default:
		name, argv = rest[0], rest[2:]
	}

	// Signals that would stop us go to the command instead, once it runs.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := dial(ctx, *socket, "lockagent run")
	if err != nil {
		return err
	}
	defer c.Close()
	if *elect != "" {
		return runElected(ctx, c, name, argv, *ttl, *grace, sigs, stderr)
	}

	req := map[string]any{"name": name, "wait_ms": -1}
	if *wait >= 0 {
		req["wait_ms"] = wait.Milliseconds()
	}
	if *shared {
		req["mode"] = "shared"
	}
	var res struct {
		Acquired bool   `json:"acquired"`
		Lease    string `json:"lease"`
		Token    uint64 `json:"token"`
		Reason   string `json:"reason"`
	}
	acquired := make(chan error, 1)
	go func() { acquired <- c.Call(ctx, "acquire", req, &res) }()
	select {
	case err = <-acquired:
	case sig := <-sigs:
		return exitError{128 + int(sig.(syscall.Signal))}
	}
	if err != nil {
		return fmt.Errorf("acquire %s: %w", name, err)
	}
	if !res.Acquired {
		fmt.Fprintf(stderr, "lockagent: %s not acquired (%s)\n", name, res.Reason)
		return exitError{exitTempFail}
	}

	cmd, exited, err := startCommand(argv, name, res.Lease, res.Token, stderr)
	if err != nil {
		return err
	}

	var kill <-chan time.Time
	events := c.Events()
	for {
		select {
		case err := <-exited:
			// The lock is released before run returns, unless the
			// agent does not answer (the connection's end releases it).
			bctx, bcancel := context.WithTimeout(ctx, byeTimeout)
			c.Call(bctx, "bye", nil, nil)
			bcancel()
			return exitStatus(err)
		case sig := <-sigs:
			relay(cmd.Process, sig)
		case ev, ok := <-events:
			lost := !ok || (ev.Event == "lost" && ev.Lease == res.Lease) || ev.Event == "shutdown"
			if !ok {
				events = nil
			}
			if lost && kill == nil {
				fmt.Fprintf(stderr, "lockagent: lock %s lost (%s); stopping the command\n", name, lostReason(ev, ok))
				cmd.Process.Signal(syscall.SIGTERM)
				kill = time.After(*grace)
			}
		case <-kill:
			cmd.Process.Kill()
		}
	}
}

// startCommand starts argv with the lease in its environment; its exit
// status comes on the channel.
func startCommand(argv []string, name, leaseID string, token uint64, stderr io.Writer) (*exec.Cmd, <-chan error, error) {
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
		return nil, nil, fmt.Errorf("run %s: %w", argv[0], err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return cmd, exited, nil
}

// byeTimeout bounds how long run waits, once the command has ended, for
// the agent to release the lock.
const byeTimeout = 5 * time.Second

// relay passes sig on to the command, unless a terminal sent it: a
// terminal's SIGINT (Ctrl-C) and SIGHUP go to its whole foreground process
// group, which the command shares with run, and it must not get them
// twice (to many tools a second Ctrl-C means "abort at once").
func relay(p *os.Process, sig os.Signal) {
	if sig != syscall.SIGTERM && inTerminalForeground() {
		return
	}
	p.Signal(sig)
}

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

func lostReason(ev socketapi.Event, ok bool) string {
	switch {
	case !ok:
		return "connection to the agent lost"
	case ev.Event == "shutdown":
		return "agent shutting down"
	}
	return ev.Reason
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
