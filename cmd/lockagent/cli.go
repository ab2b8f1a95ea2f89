package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// The command line's shape: every command's usage, -h and help at every
// level, and flags whose mistakes are usage errors of one line.

// usageError is a mistake on the command line: main prints it on one
// line, with a pointer to the usage of the command it is a mistake of,
// and exits 2.
type usageError struct {
	cmd string // "ctl list"; "" for lockagent itself
	msg string
}

func (e usageError) Error() string { return e.msg }

// line is the error as main prints it.
func (e usageError) line() string {
	where := strings.TrimSpace("lockagent " + e.cmd)
	return fmt.Sprintf("%s: %s (see '%s -h')", where, e.msg, where)
}

// errHelped: a command printed its usage, as -h or help asked; the
// process exits 0.
var errHelped = errors.New("the usage was printed")

// usage is what a command's -h prints, before its flags: its synopsis,
// one line per form, and what it does.
type usage struct {
	synopsis []string
	text     string
}

// usages are the usages of every command, by its path.
var usages = map[string]usage{
	"": {[]string{"<command> [flags]"}, `commands:
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
  config check [-config FILE] [-socket PATH] [-log-level L]
                                                        validate and print the configuration
  version                                               version, commit, Go version
  help [COMMAND]                                        this, or a command's usage

Client commands find the agent through -socket, then LOCKAGENT_SOCKET, then the
default path. 'lockagent COMMAND -h' prints a command's usage.`},

	"agent": {[]string{"agent [-config FILE] [-socket PATH] [-log-level L]"},
		`Runs the agent in the foreground until SIGTERM or SIGINT. Without -config it
runs with the built-in defaults. LOCKAGENT_SOCKET, then -socket, override the
file's socket.path.`},

	"ctl": {[]string{"ctl SUBCOMMAND [flags]"}, `subcommands:
  list [-all] [-json]   sessions and leases of the agent
  inspect NAME          who holds a name, its last token
  break NAME            admin: end every lease on a name
  status [-json]        version, pid, uptime, backend state, counts
  upgrade               admin: hand the agent over to its binary as installed now

Every subcommand takes -socket PATH; flags may come before or after NAME.
'lockagent ctl SUBCOMMAND -h' prints a subcommand's usage.`},
	"ctl list": {[]string{"ctl list [-all] [-json] [-socket PATH]"},
		`Lists your sessions (every session with -all, for admins), their locks and
what they wait for.`},
	"ctl inspect": {[]string{"ctl inspect [-socket PATH] NAME"},
		`Shows who holds the lock NAME and its last fencing token. A lock named
"help" is 'ctl inspect -- help'.`},
	"ctl break": {[]string{"ctl break [-socket PATH] NAME"},
		`Ends every lease on the lock NAME (admins only); each holder gets a lost
event. A lock named "help" is 'ctl break -- help'.`},
	"ctl status": {[]string{"ctl status [-json] [-socket PATH]"},
		`Shows the agent's version, pid, uptime and last upgrade, its backend and
the backend's state, and how many sessions, leases and waiters it has.`},
	"ctl upgrade": {[]string{"ctl upgrade [-socket PATH]"},
		`Hands the agent over to its binary as installed now, in a new process,
keeping every lock (admins only). Exits 1 if the upgrade failed.`},

	"run": {[]string{
		"run [-wait DUR] [-shared] [-ttl DUR] [-grace DUR] [-socket PATH] NAME -- CMD [ARGS...]",
		"run -elect NAME [-ttl DUR] [-grace DUR] [-socket PATH] -- CMD [ARGS...]",
	}, `Takes the lock NAME, runs CMD while holding it and releases it when CMD
ends. With -elect, campaigns for leadership of NAME and runs CMD whenever
this host leads. Flags may come before or after NAME; CMD follows --. If the
lock is lost, CMD and every process it started get SIGTERM, then SIGKILL
after -grace.

exit status: CMD's own; 75 when the lock was not acquired within -wait;
77 when the agent refuses NAME to this user (permission_denied); 128+N when
CMD was killed by signal N; 127 when CMD is not found, 126 when it cannot be
run; 1 when the agent cannot be reached or does not answer; 2 for a usage
error, a name or -ttl the agent refuses included.`},

	"config": {[]string{"config SUBCOMMAND [flags]"},
		`subcommands:
  check [-config FILE] [-socket PATH] [-log-level L]
          validate the configuration, as the agent would at start, and print it

'lockagent config check -h' prints its usage.`},
	"config check": {[]string{"config check [-config FILE] [-socket PATH] [-log-level L]"},
		`Checks the configuration an agent started with the same flags would run
with (the built-in defaults without -config; LOCKAGENT_SOCKET, then the
flags, over the file), and what the agent reads on the host when it starts
(groups, password files, credentials, TLS files), as the user who runs it,
in this environment. Prints it, every value spelled out, saying which values
come from the environment or a flag; or every problem, in the agent's
words, and exits 1.`},

	"version": {[]string{"version"}, `Prints the version, the commit and the Go version.`},
}

// printUsage prints the usage of the command cmd, with the flags of fs
// (nil: none).
func printUsage(w io.Writer, cmd string, fs *flag.FlagSet) {
	u := usages[cmd]
	for i, s := range u.synopsis {
		lead := "usage: "
		if i > 0 {
			lead = "       "
		}
		fmt.Fprintf(w, "%slockagent %s\n", lead, s)
	}
	fmt.Fprintf(w, "\n%s\n", u.text)
	if fs == nil {
		return
	}
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// isHelp tells whether args ask for the usage: -h, -help, --help or help,
// alone.
func isHelp(args []string) bool {
	if len(args) != 1 {
		return false
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// flagSet is the flags of the command cmd; -h prints its usage to stdout.
type flagSet struct {
	*flag.FlagSet
	cmd    string
	stdout io.Writer
}

// newFlagSet returns the flags of the command cmd, which report errors
// instead of exiting, and print nothing of their own.
func newFlagSet(cmd string, stdout io.Writer) *flagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	// The flag package prints its error, then the usage; main prints the
	// error on one line, and the usage is for -h alone.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{fs, cmd, stdout}
}

// parse parses args, turning flag errors into usage errors. -h (and help
// alone) prints the usage and returns errHelped.
func (fs *flagSet) parse(args []string) error {
	if len(args) == 1 && args[0] == "help" {
		return fs.help()
	}
	return fs.parseFlags(args)
}

// parseFlags is parse, without help as an argument.
func (fs *flagSet) parseFlags(args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return fs.help()
		}
		return usageError{fs.cmd, err.Error()}
	}
	return nil
}

// help prints the usage and returns errHelped.
func (fs *flagSet) help() error {
	printUsage(fs.stdout, fs.cmd, fs.FlagSet)
	return errHelped
}

// parseInterspersed parses args like parse, but lets flags follow the
// arguments that are not flags, which it returns in order. After "--",
// everything is an argument.
func (fs *flagSet) parseInterspersed(args []string) ([]string, error) {
	if len(args) == 1 && args[0] == "help" {
		return nil, fs.help()
	}
	var pos []string
	for {
		if err := fs.parseFlags(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" && !fs.valueOf(args[:n-1]) {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// dashDash is the index of the "--" in args that ends the flags and the
// arguments before it, or -1: the first "--" that is not a flag's value.
func (fs *flagSet) dashDash(args []string) int {
	for i, a := range args {
		if a == "--" && !fs.valueOf(args[:i]) {
			return i
		}
	}
	return -1
}

// valueOf tells whether the argument after args is the value of their
// last one, a flag that takes a value ("-socket --" gives -socket the
// value "--").
func (fs *flagSet) valueOf(args []string) bool {
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
