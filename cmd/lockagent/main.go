// Command lockagent is the lock agent and its command-line clients: `agent`
// runs the daemon; `ctl` and `run` talk to it over its socket. main is
// wiring only: the lock logic lives in agent, the protocol in socketapi.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

// exitError carries an exit status other than 0, 1 or 2 (run's).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	var ee exitError
	var ue usageError
	switch {
	case err == nil, errors.Is(err, errHelped):
	case errors.As(err, &ee):
		os.Exit(ee.code)
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, ue.line())
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "lockagent:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"", "no command"}
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "agent":
		return agentCmd(rest, stdout, stderr)
	case "ctl":
		return ctlCmd(rest, stdout, stderr)
	case "run":
		return runCmd(rest, stdout, stderr)
	case "config":
		return configCmd(rest, stdout)
	case "version":
		if isHelp(rest) {
			printUsage(stdout, "version", nil)
			return nil
		}
		if len(rest) > 0 {
			return usageError{"version", fmt.Sprintf("unexpected argument %q", rest[0])}
		}
		fmt.Fprintf(stdout, "lockagent %s (commit %s, %s)\n", version, commit(), runtime.Version())
		return nil
	case "help":
		// help COMMAND... is COMMAND... -h.
		if len(rest) > 0 {
			return run(append(rest[:len(rest):len(rest)], "-h"), stdout, stderr)
		}
		printUsage(stdout, "", nil)
		return nil
	case "-h", "-help", "--help":
		printUsage(stdout, "", nil)
		return nil
	default:
		return usageError{"", fmt.Sprintf("unknown command %q", cmd)}
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
