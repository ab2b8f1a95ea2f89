package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/lockagent/lockagent/client"
)

// helloTimeout bounds the wait for the agent's answer to hello, which it
// gives at once: a socket that accepts connections and answers nothing is
// an agent that is stuck, or no agent at all.
const helloTimeout = 5 * time.Second

// dial connects to the agent at socket (the -socket flag), found as
// client.SocketPath finds it, and says hello as client. Its errors say
// what to do about them.
func dial(ctx context.Context, socket, name string) (*client.Client, error) {
	c, _, err := dialInfo(ctx, socket, name)
	return c, err
}

// dialInfo is dial, and tells what the agent said of itself.
func dialInfo(ctx context.Context, socket, name string) (*client.Client, client.AgentInfo, error) {
	path := client.SocketPath(socket)
	c, err := client.Dial(ctx, path)
	if err != nil {
		return nil, client.AgentInfo{}, reachError(path, err)
	}
	hctx, cancel := context.WithTimeout(ctx, helloTimeout)
	defer cancel()
	s, err := c.Hello(hctx, client.HelloOptions{Client: name})
	if err != nil {
		c.Close()
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, client.AgentInfo{}, fmt.Errorf("the agent at %s accepted the connection but did not answer in %s: "+
				"see its log (journalctl -u lockagent, systemctl status lockagent)", path, helloTimeout)
		}
		return nil, client.AgentInfo{}, fmt.Errorf("hello to the agent at %s: %w", path, err)
	}
	return c, s.Agent, nil
}

// reachError explains why the socket at path could not be connected to.
func reachError(path string, err error) error {
	cause := err
	var op *net.OpError
	if errors.As(err, &op) {
		cause = op.Err
	}
	var hint string
	switch {
	case errors.Is(err, syscall.ENOENT):
		hint = "is the agent running? Start it (lockagent agent, or systemctl start lockagent.socket), " +
			"or name its socket with -socket or LOCKAGENT_SOCKET"
	case errors.Is(err, syscall.ECONNREFUSED):
		hint = "the socket file is left from an agent that is gone: start the agent again"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		hint = "the socket admits its owner and the members of its group; for the packaged agent, " +
			"add the user to the lockagent group (sudo usermod -aG lockagent USER) and log in again"
	default:
		return fmt.Errorf("cannot reach the agent at %s: %w", path, cause)
	}
	return fmt.Errorf("cannot reach the agent at %s: %w (%s)", path, cause, hint)
}

func ctlCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"ctl", "no subcommand: list, inspect, break, status or upgrade"}
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "help":
		// ctl help SUBCOMMAND is ctl SUBCOMMAND -h.
		if len(rest) > 0 {
			return ctlCmd(append(rest[:len(rest):len(rest)], "-h"), stdout, stderr)
		}
		printUsage(stdout, "ctl", nil)
		return nil
	case "-h", "-help", "--help":
		printUsage(stdout, "ctl", nil)
		return nil
	case "list", "status", "upgrade", "inspect", "break":
	default:
		return usageError{"ctl", fmt.Sprintf("unknown subcommand %q", sub)}
	}
	fs := newFlagSet("ctl "+sub, stdout)
	socket := fs.String("socket", "", "the agent's socket `PATH` (else LOCKAGENT_SOCKET, else the default path)")
	var all, asJSON *bool
	if sub == "list" || sub == "status" {
		if sub == "list" {
			all = fs.Bool("all", false, "every session of the agent (admins)")
		}
		asJSON = fs.Bool("json", false, "print JSON")
	}
	// Flags may come after a lock name too: ctl inspect NAME -socket P.
	names, err := fs.parseInterspersed(rest)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	switch sub {
	case "list":
		if len(names) != 0 {
			return usageError{"ctl list", fmt.Sprintf("unexpected argument %q", names[0])}
		}
		c, err := dial(ctx, *socket, "lockagent ctl")
		if err != nil {
			return err
		}
		defer c.Close()
		if *asJSON {
			sessions, err := listRaw(ctx, c, *all)
			if err != nil {
				return fmt.Errorf("list: %w", err)
			}
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(map[string]any{"sessions": sessions})
		}
		sessions, err := c.List(ctx, client.ListOptions{All: *all})
		if err != nil {
			return fmt.Errorf("list: %w", err)
		}
		printList(stdout, sessions)
		return nil
	case "status":
		if len(names) != 0 {
			return usageError{"ctl status", fmt.Sprintf("unexpected argument %q", names[0])}
		}
		return status(ctx, *socket, *asJSON, stdout)
	case "upgrade":
		if len(names) != 0 {
			return usageError{"ctl upgrade", fmt.Sprintf("unexpected argument %q", names[0])}
		}
		return upgrade(ctx, *socket, stdout)
	default: // inspect, break
		if len(names) != 1 {
			return usageError{"ctl " + sub, fmt.Sprintf("one lock NAME, not %d", len(names))}
		}
		name := names[0]
		c, err := dial(ctx, *socket, "lockagent ctl")
		if err != nil {
			return err
		}
		defer c.Close()
		if sub == "break" {
			n, err := c.Break(ctx, name)
			if err != nil {
				return refusedName(sub, err)
			}
			fmt.Fprintf(stdout, "%s: %d lease(s) broken\n", name, n)
			return nil
		}
		in, err := c.Inspect(ctx, name)
		if err != nil {
			return refusedName(sub, err)
		}
		return printInspect(stdout, name, in)
	}
}

// refusedName is the error of ctl sub on a name: a usage error if the
// agent refused the name itself.
func refusedName(sub string, err error) error {
	if badArgument(err) {
		return usageError{"ctl " + sub, err.Error()}
	}
	return err
}

// listRaw pages through the agent's sessions (all of them, if all), in
// order, as the agent sends them: every field, and fields of later agents
// too.
func listRaw(ctx context.Context, c *client.Client, all bool) ([]json.RawMessage, error) {
	sessions := []json.RawMessage{}
	args := map[string]any{"all": all, "limit": 100}
	for {
		var page struct {
			Sessions []json.RawMessage `json:"sessions"`
			Next     *string           `json:"next"`
		}
		if err := c.Call(ctx, "list", args, &page); err != nil {
			return nil, err
		}
		sessions = append(sessions, page.Sessions...)
		if page.Next == nil {
			return sessions, nil
		}
		args["after"] = *page.Next
	}
}

// round is a duration as a table shows it, to the tenth of a second.
func round(d time.Duration) string {
	return d.Round(time.Millisecond * 100).String()
}

// printList prints one row per lease, and a row for a session without any.
func printList(w io.Writer, sessions []client.SessionInfo) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tPID\tUID\tCLIENT\tLOCK\tMODE\tSCOPE\tTOKEN\tHELD FOR\tEXPIRES IN\tWAITING")
	for _, s := range sessions {
		var waiting []string
		for _, wt := range s.Waiting {
			waiting = append(waiting, fmt.Sprintf("%s (%s, %s)", wt.Name, wt.Mode, round(wt.Waited)))
		}
		wait := strings.Join(waiting, ", ")
		if wait == "" {
			wait = "-"
		}
		who := shown(s.Client)
		if who == "" {
			who = "-"
		}
		if !s.Attached {
			who += " (detached)"
		}
		if len(s.Leases) == 0 {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t-\t-\t-\t-\t-\t-\t%s\n", s.ID, s.PID, s.UID, who, wait)
		}
		for _, l := range s.Leases {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.ID, s.PID, s.UID, who,
				l.Name, l.Mode, l.Scope, l.Token, round(l.HeldFor), round(l.ExpiresIn), wait)
		}
	}
	tw.Flush()
}

// shown is text a client chose (its client name, a lease's meta) as a
// table shows it: quoted, with escapes, if it holds a character that is
// not printable (a newline, a tab, a terminal's escape), which could
// otherwise forge rows or drive the reader's terminal.
func shown(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

func printInspect(w io.Writer, name string, in *client.Inspection) error {
	if !in.Locked {
		fmt.Fprintf(w, "%s: free (last token %d)\n", name, in.LastToken)
		return nil
	}
	fmt.Fprintf(w, "%s: held %s (last token %d)\n", name, in.Mode, in.LastToken)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODE\tTOKEN\tHOST\tEXPIRES IN\tMETA")
	for _, h := range in.Holders {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", h.Mode, h.Token, shown(h.Host), round(h.ExpiresIn), shown(h.Meta))
	}
	return tw.Flush()
}

// printResult prints an answer's result as JSON, as the agent sent it:
// every field, and fields of later agents too; not the wire's id and ok.
func printResult(stdout io.Writer, raw json.RawMessage) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return err
	}
	delete(fields, "id")
	delete(fields, "ok")
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(fields)
}

// status prints the agent's status, as lines of "key: value" or as JSON.
func status(ctx context.Context, socket string, asJSON bool, stdout io.Writer) error {
	c, err := dial(ctx, socket, "lockagent ctl")
	if err != nil {
		return err
	}
	defer c.Close()
	if asJSON {
		var raw json.RawMessage
		if err := c.Call(ctx, "status", nil, &raw); err != nil {
			return fmt.Errorf("status: %w", err)
		}
		if err := printResult(stdout, raw); err != nil {
			return fmt.Errorf("status: %w", err)
		}
		return nil
	}
	st, err := c.Status(ctx)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "version:\t%s\n", st.Version)
	fmt.Fprintf(tw, "pid:\t%d\n", st.PID)
	fmt.Fprintf(tw, "uptime:\t%s\n", st.Uptime.Round(time.Second))
	if st.UpgradedAgo > 0 {
		fmt.Fprintf(tw, "upgraded:\t%s ago (clients waited %s)\n", st.UpgradedAgo.Round(time.Second), st.UpgradeWait)
	}
	fmt.Fprintf(tw, "backend:\t%s (%s)\n", st.Backend, st.BackendState)
	if st.BackendError != "" {
		fmt.Fprintf(tw, "backend error:\t%s ago: %s\n", st.BackendErrorAgo.Round(time.Second), st.BackendError)
	}
	fmt.Fprintf(tw, "sessions:\t%d\n", st.Sessions)
	fmt.Fprintf(tw, "leases:\t%d\n", st.Leases)
	fmt.Fprintf(tw, "waiters:\t%d\n", st.Waiters)
	return tw.Flush()
}

// upgrade asks the agent to hand itself over to a new process of its
// binary, and prints the version and pid that serve once it has.
func upgrade(ctx context.Context, socket string, stdout io.Writer) error {
	c, err := dial(ctx, socket, "lockagent ctl")
	if err != nil {
		return err
	}
	defer c.Close()
	before, err := c.Status(ctx)
	if err != nil {
		return fmt.Errorf("upgrade: %w", err)
	}
	up, err := c.Upgrade(ctx)
	if err != nil {
		return fmt.Errorf("upgrade: %w", err)
	}
	fmt.Fprintf(stdout, "upgraded: version %s (pid %d), was %s (pid %d)\n", up.Version, up.PID, before.Version, before.PID)
	return nil
}
