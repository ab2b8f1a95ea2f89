package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/backend/memory"
	"github.com/lockagent/lockagent/config"
	"github.com/lockagent/lockagent/internal/handover"
	"github.com/lockagent/lockagent/internal/lockfile"
	"github.com/lockagent/lockagent/internal/peerlog"
	"github.com/lockagent/lockagent/metrics"
	"github.com/lockagent/lockagent/socketapi"
)

// loadConfig reads the config file (or the defaults) and applies the
// environment and the -socket and -log-level flags.
func loadConfig(file, socket, level string) (config.Config, error) {
	cfg, _, err := loadConfigOverrides(file, socket, level)
	return cfg, err
}

// loadConfigOverrides is loadConfig, and tells what the environment and
// the flags set, in order.
func loadConfigOverrides(file, socket, level string) (config.Config, []config.Override, error) {
	cfg := config.Default()
	if file != "" {
		var err error
		if cfg, err = config.Load(file); err != nil {
			return cfg, nil, err
		}
	}
	over := cfg.ApplyEnv(os.Getenv)
	if socket != "" {
		over = append(over, config.Override{Field: "socket.path", Source: "-socket", Was: cfg.Socket.Path})
		cfg.Socket.Path = socket
	}
	if level != "" {
		over = append(over, config.Override{Field: "log_level", Source: "-log-level", Was: cfg.LogLevel})
		cfg.LogLevel = level
	}
	return cfg, over, cfg.Validate()
}

func agentCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("agent", stdout)
	file := fs.String("config", "", "the config `FILE` (HCL)")
	socket := fs.String("socket", "", "the socket's `PATH`, over LOCKAGENT_SOCKET and the file's")
	level := fs.String("log-level", "", "the log `LEVEL`, over the file's: trace, debug, info, warn or error")
	if err := fs.parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{"agent", fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	out, journal := logOutput(stderr)
	cfg, err := loadConfig(*file, *socket, *level)
	if err != nil {
		cannotTakeOver(err)
		if journal {
			// An error to the journal, though no logger is set up yet.
			journalWriter{stderr}.LevelWrite(hclog.Error, fmt.Appendf(nil, "lockagent: %v\n", err))
			return exitError{1}
		}
		return err
	}
	log := hclog.New(&hclog.LoggerOptions{
		Name:        "lockagent",
		Level:       hclog.LevelFromString(cfg.LogLevel),
		JSONFormat:  cfg.LogFormat == "json",
		Output:      out,
		DisableTime: journal, // the journal stamps every entry
	})
	if err := serveAgent(cfg, log, *file, *level); err != nil {
		// Why the agent stops, in the log's format and at its priority.
		log.Error("agent stopped", "error", err)
		return exitError{1}
	}
	return nil
}

// serveAgent runs the agent configured by cfg until a signal stops it;
// file and level are for reloads. An upgrade that hands the agent over to
// a new process ends this one at once (see run). A process started by an upgrade takes the agent over instead
// of starting one (see takeOver).
func serveAgent(cfg config.Config, log hclog.Logger, file, level string) error {
	// Signals are ours from here on: a SIGTERM during start-up stops the
	// agent cleanly instead of killing it with the socket bound.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	in := &instance{cfg: cfg, log: log, file: file, level: level}
	if fd := os.Getenv(handover.Env); fd != "" {
		os.Unsetenv(handover.Env)
		return in.takeOver(ctx, fd)
	}
	if err := in.start(ctx); err != nil {
		if ctx.Err() != nil && errors.Is(err, errStopped) {
			return nil
		}
		return err
	}
	return in.run(ctx, stop)
}

// instance is an agent and what it serves: its backend, its socket server
// and listener, its metrics, the state directory's lock; as start opens
// them, or takeOver takes them over from another process.
type instance struct {
	cfg         config.Config
	log         hclog.Logger
	file, level string // for reloads

	b         backend.Backend
	mem       *memory.Backend // b, when it is the embedded backend
	a         *agent.Agent
	srv       *socketapi.Server
	ln        *socketapi.Listener
	stateLock *lockfile.Lock // the memory backend's state directory's
	mt        *metrics.Metrics
	mln       net.Listener

	// Set by takeOver: the process it took over from, the handover
	// conversation, which ends when that process has exited.
	from     *handover.Conn
	fromPID  int
	upgraded time.Time

	// upgrades counts the agent's upgrades, those of the processes before
	// this one too; the upgrader's, and takeOver's before it.
	upgrades handover.Upgrades
}

// countUpgrades shows the counts of upgrades in the metrics.
func (in *instance) countUpgrades() {
	if in.mt != nil {
		in.mt.SetUpgrades(in.upgrades.Succeeded, in.upgrades.Failed, in.upgraded, in.srv.Upgrading)
	}
}

// exitWait bounds how long a process that took an agent over waits for
// the old process to exit.
const exitWait = 5 * time.Second

// errStopped: a signal stopped the agent while it started.
var errStopped = errors.New("stopped during start-up")

// start opens the socket, the state directory, the metrics' endpoint and
// the backend, and makes the agent and its server.
func (in *instance) start(ctx context.Context) (err error) {
	cfg, log := in.cfg, in.log
	access, err := accessOf(cfg)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			in.close()
		}
	}()
	// The socket first: an agent refused because another one serves the
	// path must not touch that one's state. A socket handed over by
	// systemd is used as it is, without the lock Listen takes: the socket
	// unit owns the path and keeps it listening, so an agent started by
	// hand on it finds it live and is refused.
	if in.ln, err = socketapi.Activated(); err != nil {
		return err
	}
	if in.ln == nil {
		if in.ln, err = socketapi.Listen(cfg.Socket.Path, cfg.Socket.Mode, cfg.Socket.Group); err != nil {
			return err
		}
	} else {
		addr := in.ln.Addr().String()
		log.Info("serving the socket systemd handed over", "socket", addr)
		if addr != cfg.Socket.Path {
			log.Warn("the socket systemd handed over is not socket.path; clients looking there will not find the agent", "socket", addr, "socket.path", cfg.Socket.Path)
		}
	}
	// The state directory next, before the backend opens it: the memory
	// backend's fencing epoch there must have one writer, or two agents
	// could hand out the same tokens. Other backends keep nothing there.
	if cfg.Backend.Kind == "memory" {
		if in.stateLock, err = lockStateDir(cfg.StateDir); err != nil {
			return err
		}
	}
	if in.mt, in.mln, err = listenMetrics(cfg.Metrics.Address); err != nil {
		return err
	}
	if in.b, err = openBackend(ctx, cfg, log.Named("backend")); err != nil {
		if ctx.Err() != nil {
			log.Info("stopped during start-up", "error", err)
			return errStopped
		}
		return err
	}
	in.mem, _ = in.b.(*memory.Backend)
	in.a = agent.New(in.agentConfig(access))
	in.srv = in.server()
	return nil
}

// agentConfig is the agent's configuration.
func (in *instance) agentConfig(access agent.Access) agent.Config {
	cfg := in.cfg
	host, _ := os.Hostname()
	return agent.Config{
		Backend:             in.b,
		Logger:              in.log.Named("agent"),
		Host:                host,
		Version:             version,
		DefaultTTL:          cfg.Leases.DefaultTTL,
		MinTTL:              cfg.Leases.MinTTL,
		MaxTTL:              cfg.Leases.MaxTTL,
		MaxSessions:         cfg.Limits.MaxSessions,
		MaxLeasesPerSession: cfg.Limits.MaxLeasesPerSession,
		MaxWaiters:          cfg.Limits.MaxWaiters,
		MaxSessionsPerUID:   cfg.Limits.MaxSessionsPerUID,
		MaxLeasesPerUID:     cfg.Limits.MaxLeasesPerUID,
		Access:              access,
		Observer:            observer(in.mt),
		PeerLog:             peerLog,
	}
}

// peerLog rate-limits the log lines a peer causes, for the agent and its
// server alike.
var peerLog = peerlog.Default()

// server is the agent's socket server; its Agent is set by start, or
// after a takeover's restore.
func (in *instance) server() *socketapi.Server {
	cfg := in.cfg
	return &socketapi.Server{
		Agent:          in.a,
		Logger:         in.log.Named("socket"),
		MaxLineBytes:   cfg.Limits.MaxLineBytes,
		MaxConns:       cfg.Limits.MaxSessions,
		MaxConnsPerUID: cfg.Limits.MaxConnectionsPerUID,

		MaxOutputBytes:       cfg.Limits.MaxOutputBytes,
		MaxOutputBytesPerUID: cfg.Limits.MaxOutputBytesPerUID,
		PeerLog:              peerLog,
		Observer:             serverObserver(in.mt),
		// An agent allocates little once its sessions are idle, and might
		// keep a burst's stacks for minutes.
		AfterIdleBurst: debug.FreeOSMemory,
	}
}

// close closes what start or takeOver opened, when they fail.
func (in *instance) close() {
	if in.b != nil {
		in.b.Close()
	}
	if in.ln != nil {
		in.ln.Close()
	}
	closeMetrics(in.mln)
	if in.stateLock != nil {
		in.stateLock.Release()
	}
}

// run serves until ctx is done, then shuts the agent down; or until an
// upgrade has handed the agent over, when the process exits at once.
func (in *instance) run(ctx context.Context, stop context.CancelFunc) error {
	log, a := in.log, in.a
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	defer signal.Stop(usr2)

	up := newUpgrader(in)
	in.srv.Upgrade = up.start
	var wg sync.WaitGroup
	var serveErr error
	wg.Add(2)
	go func() { defer wg.Done(); a.Run(ctx) }()
	go func() {
		defer wg.Done()
		if serveErr = in.srv.Serve(ctx, in.ln); serveErr != nil {
			stop()
		}
	}()
	if in.mt != nil {
		in.mt.Watch(a)
		wg.Add(1)
		go func() { defer wg.Done(); serveMetrics(ctx, in.mt, in.mln, log) }()
	}
	if in.from != nil {
		// The old process tells systemd that this one is the service's
		// main process now, and exits: only then may this one notify.
		in.from.SetDeadline(time.Now().Add(exitWait))
		in.from.Recv(&struct{}{}) // the end of the conversation
		in.from.Close()
		log.Info("took the agent over", "from_pid", in.fromPID, "socket", in.ln.Addr().String(), "backend", in.b.Name(),
			"version", version, "clients_waited", in.srv.Upgrading)
	} else {
		log.Info("agent started", "socket", in.ln.Addr().String(), "backend", in.b.Name(), "version", version)
	}
	n := newNotifier(in.b.Name(), log.Named("systemd"))
	n.ready(a.Stats())
	if pid := supervise(ctx, n, hup, usr2, up, a.Stats, func() { reload(in.file, in.level, log, a) }); pid != 0 {
		// The sockets, the leases and the state directory are the new
		// process's: nothing may be closed, released or unlinked here, as
		// returning would, cancelling what serves them. Exit at once.
		log.Info("exiting: the agent is another process's now", "pid", pid)
		os.Exit(0)
	}
	log.Info("shutting down")
	n.stopping()
	wg.Wait()
	log.Info("stopped")
	return serveErr
}

// stateLockFile is the lock file in the state directory.
const stateLockFile = "agent.lock"

// lockStateDir makes dir, mode 0700, if it is missing, and takes its lock
// file, which keeps it this agent's until the agent ends.
func lockStateDir(dir string) (*lockfile.Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state_dir: %w", err)
	}
	lock, err := lockfile.Acquire(filepath.Join(dir, stateLockFile))
	var held *lockfile.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("state_dir %s is in use by another agent: %w", dir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("state_dir %s: %w", dir, err)
	}
	return lock, nil
}

// reload re-reads what can change without a restart: the log level and
// the acl block.
func reload(file, level string, log hclog.Logger, a *agent.Agent) {
	cfg, err := loadConfig(file, "", level)
	var access agent.Access
	if err == nil {
		access, err = accessOf(cfg)
	}
	if err != nil {
		log.Error("reload failed; keeping the running configuration", "error", err)
		return
	}
	log.SetLevel(hclog.LevelFromString(cfg.LogLevel))
	a.SetAccess(access)
	log.Info("configuration reloaded", "log_level", cfg.LogLevel, "acl_rules", len(access.Rules))
}

func configCmd(args []string, stdout io.Writer) error {
	switch {
	case len(args) == 0:
		return usageError{"config", "no subcommand: check"}
	case args[0] == "help" && len(args) > 1:
		// config help check is config check -h.
		return configCmd(append(args[1:len(args):len(args)], "-h"), stdout)
	case isHelp(args):
		printUsage(stdout, "config", nil)
		return nil
	case args[0] != "check":
		return usageError{"config", fmt.Sprintf("unknown subcommand %q", args[0])}
	}
	fs := newFlagSet("config check", stdout)
	file := fs.String("config", "", "the config `FILE` (HCL)")
	socket := fs.String("socket", "", "the socket's `PATH`, as the agent's -socket")
	level := fs.String("log-level", "", "the log `LEVEL`, as the agent's -log-level")
	if err := fs.parse(args[1:]); err != nil {
		return err
	}
	// A file given without -config would otherwise be ignored, and the
	// defaults checked in its place.
	if fs.NArg() > 0 {
		return usageError{"config check", fmt.Sprintf("unexpected argument %q (a file goes after -config)", fs.Arg(0))}
	}
	cfg, over, err := loadConfigOverrides(*file, *socket, *level)
	if err != nil {
		return err
	}
	// What the agent reads on the host when it starts: the groups of the
	// acl (the file's groups are checked with it), the backend's password
	// files, credentials and TLS files. Its refusal, in its words.
	var problems []error
	if _, err := accessOf(cfg); err != nil {
		problems = append(problems, err)
	}
	if _, err := readSecrets(cfg, os.Getenv); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("the agent would not start with this configuration here:\n%w", errors.Join(problems...))
	}
	// Say what was checked: without -config, the agent's built-in
	// defaults, which is not what the packaged agent runs with; and which
	// values are not the file's, but the environment's or a flag's.
	if *file == "" {
		fmt.Fprintln(stdout, "# No -config FILE given: the built-in defaults, as an agent started without -config runs.")
		fmt.Fprintln(stdout, "# The packaged agent reads /etc/lockagent/lockagent.hcl.")
	} else {
		fmt.Fprintf(stdout, "# The effective configuration of %s.\n", *file)
	}
	for _, o := range over {
		fmt.Fprintf(stdout, "# %s comes from %s; without it, it would be %s.\n", o.Field, o.Source, strconv.Quote(o.Was))
	}
	fmt.Fprint(stdout, cfg.Render())
	return nil
}
