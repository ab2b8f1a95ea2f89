package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/lockagent/lockagent/client"
)

// errAgentGone: the connection to the agent ended, so leadership can no
// longer be known.
var errAgentGone = errors.New("the connection to the agent ended")

// runElected is `run -elect`: it campaigns for name and runs argv whenever
// this host leads. Each term starts the command, with the term's lease and
// token in its environment; when the term ends (lost, broken) the command
// and every process it started get SIGTERM, then SIGKILL after grace, and
// the agent contends again on its own. The command of a new term starts
// only once the last one and its processes have ended. If the command
// exits on its own while leader, run resigns, so that another host takes
// over, and exits with its status. A signal to run goes to the command;
// run then resigns and exits when it has ended. chld tells of a child of
// run that ended.
func runElected(ctx context.Context, cancel context.CancelFunc, c *client.Client, name string, argv []string,
	ttl, grace time.Duration, sigs, chld <-chan os.Signal, stderr io.Writer) error {
	var cp *client.Campaign
	err := untilSignal(cancel, sigs, func() (err error) {
		cp, err = c.Campaign(ctx, name, client.CampaignOptions{TTL: ttl, Meta: fmt.Sprintf("lockagent run -elect, pid %d", os.Getpid())})
		return err
	})
	var exit exitError
	switch {
	case errors.As(err, &exit):
		return err
	case badArgument(err):
		return usageError{"run", fmt.Sprintf("%s: %v", name, err)}
	case errors.Is(err, client.ErrPermissionDenied):
		fmt.Fprintf(stderr, "lockagent: %s: %v\n", name, err)
		return exitError{exitNoPerm}
	case err != nil:
		return fmt.Errorf("%s: %w", name, err)
	}
	resign := func() {
		rctx, cancel := context.WithTimeout(ctx, byeTimeout)
		defer cancel()
		cp.Resign(rctx) // if the agent is gone, so is the campaign
	}
	var (
		cmd      *command
		exited   <-chan error
		term     *client.Term // the term the command runs for
		next     *client.Term // won while the last term's command still stops
		stopping bool         // the command was told to stop: its term ended
		kill     <-chan time.Time
		deadline time.Time // when what is left of a stopped command gets SIGKILL
		signaled bool      // run was told to stop
	)
	start := func(t *client.Term) error {
		fmt.Fprintf(stderr, "lockagent: elected leader of %s (token %d); starting the command\n", name, t.Token)
		var err error
		cmd, err = startCommand(argv, name, t.Lease, t.Token, stderr)
		if err != nil {
			return err
		}
		exited, term, stopping = cmd.exited, t, false
		return nil
	}
	elected := cp.Elected()
	for {
		var termDone <-chan struct{}
		if cmd != nil && !stopping {
			termDone = term.Done()
		}
		select {
		case t, ok := <-elected:
			switch {
			case !ok:
				elected = nil
				if cmd == nil {
					return errAgentGone
				}
			case cmd != nil:
				next = t
			default:
				if err := start(t); err != nil {
					resign()
					return err
				}
			}
		case <-termDone:
			fmt.Fprintf(stderr, "lockagent: leadership of %s lost (%s); stopping the command\n", name, term.Reason())
			cmd.stop(syscall.SIGTERM, stderr)
			stopping, deadline, kill = true, time.Now().Add(grace), time.After(grace)
		case <-kill:
			cmd.stop(syscall.SIGKILL, stderr)
			kill = nil
		case <-chld:
			reapOrphans(cmd)
		case sig := <-sigs:
			if cmd == nil {
				resign()
				return exitError{128 + int(sig.(syscall.Signal))}
			}
			signaled = true
			cmd.relay(sig)
		case err := <-exited:
			ended := false
			select {
			case <-term.Done():
				ended = true
			default:
			}
			if ended {
				// What the command started must not work on after its
				// term either, nor beside the next term's command.
				if !stopping { // it exited as the term ended
					cmd.stop(syscall.SIGTERM, stderr)
					deadline = time.Now().Add(grace)
				}
				waitTree(deadline, stderr)
			}
			cmd, exited, kill = nil, nil, nil
			switch {
			case signaled:
				resign()
				return exitStatus(err)
			case !ended:
				// It ended on its own while this host leads.
				fmt.Fprintf(stderr, "lockagent: the command ended while leader of %s; resigning\n", name)
				resign()
				return exitStatus(err)
			case elected == nil:
				return errAgentGone
			case next != nil:
				t := next
				next = nil
				select {
				case <-t.Done(): // that term is over too: wait for the next
				default:
					if err := start(t); err != nil {
						resign()
						return err
					}
				}
			}
		}
	}
}
