// Command lockagent is the lock agent and its command-line clients: `agent`
// runs the daemon; `ctl` and `run` talk to it over its socket. main is
// wiring only: the lock logic lives in agent, the protocol in socketapi.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

// usageError is a mistake on the command line: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// exitError carries an exit status other than 0, 1 or 2 (run's).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

const usage = `usage: lockagent <command> [flags]

commands:
  agent [-config FILE] [-socket PATH] [-log-level L]   run the agent in the foreground
  ctl list [-all] [-json]                               sessions and leases of the agent
  ctl inspect NAME                                      who holds a name, its last token
  ctl break NAME                                        admin: end every lease on a name
  ctl status [-json]                                    version, pid, uptime, backend state, counts
  ctl upgrade                                           admin: hand the agent over to its binary as installed now
  run [-wait DUR] [-shared] [-ttl DUR] [-grace DUR] NAME -- CMD [ARGS...]
                                                        run a command while holding a lock
  run -elect NAME [-ttl DUR] [-grace DUR] -- CMD [ARGS...]
                                                        run a command whenever this host leads NAME
  config check [-config FILE]                           validate and print the configuration
  version                                               version, commit, Go version

Client commands find the agent through -socket, then LOCKAGENT_SOCKET, then the
default path.`

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	var ee exitError
	var ue usageError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		os.Exit(ee.code)
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, "lockagent:", err)
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "lockagent:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"no command"}
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "agent":
		return agentCmd(rest, stderr)
	case "ctl":
		return ctlCmd(rest, stdout, stderr)
	case "run":
		return runCmd(rest, stderr)
	case "config":
		return configCmd(rest, stdout, stderr)
	case "version":
		if len(rest) > 0 {
			return usageError{"version takes no arguments"}
		}
		fmt.Fprintf(stdout, "lockagent %s (commit %s, %s)\n", version, commit(), runtime.Version())
		return nil
	case "help", "-h", "-help", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	default:
		return usageError{fmt.Sprintf("unknown command %q", cmd)}
	}
}

func commit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseInterspersed parses args like parseFlags, but lets flags follow
// the arguments that are not flags, which it returns in order. After "--",
// everything is an argument.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" && !valueOf(fs, args[:n-1]) {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// valueOf tells whether the argument after args is the value of their
// last one, a flag that takes a value ("-socket --" gives -socket the
// value "--").
func valueOf(fs *flag.FlagSet, args []string) bool {
	if len(args) == 0 {
		return false
	}
	last := args[len(args)-1]
	if !strings.HasPrefix(last, "-") || strings.Contains(last, "=") {
		return false
	}
	f := fs.Lookup(strings.TrimLeft(last, "-"))
	if f == nil {
		return false
	}
	b, isBool := f.Value.(interface{ IsBoolFlag() bool })
	return !isBool || !b.IsBoolFlag()
}

// parseFlags parses args, turning flag errors into usage errors.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	return nil
}
