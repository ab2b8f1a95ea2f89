package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/config"
	"github.com/lockagent/lockagent/internal/lockfile"
	"github.com/lockagent/lockagent/internal/peerlog"
	"github.com/lockagent/lockagent/socketapi"
)

// loadConfig reads the config file (or the defaults) and applies the
// environment and the -socket and -log-level flags.
func loadConfig(file, socket, level string) (config.Config, error) {
	cfg := config.Default()
	if file != "" {
		var err error
		if cfg, err = config.Load(file); err != nil {
			return cfg, err
		}
	}
	cfg.ApplyEnv(os.Getenv)
	if socket != "" {
		cfg.Socket.Path = socket
	}
	if level != "" {
		cfg.LogLevel = level
	}
	return cfg, cfg.Validate()
}

func agentCmd(args []string, stderr io.Writer) error {
	fs := newFlagSet("agent", stderr)
	file := fs.String("config", "", "config file (HCL)")
	socket := fs.String("socket", "", "socket path")
	level := fs.String("log-level", "", "trace, debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{"agent takes no arguments"}
	}
	out, journal := logOutput(stderr)
	cfg, err := loadConfig(*file, *socket, *level)
	if err != nil {
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
// file and level are for reloads.
func serveAgent(cfg config.Config, log hclog.Logger, file, level string) error {
	access, err := accessOf(cfg)
	if err != nil {
		return err
	}
	// Signals are ours from here on: a SIGTERM during start-up stops the
	// agent cleanly instead of killing it with the socket bound.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	// The socket first: an agent refused because another one serves the
	// path must not touch that one's state. A socket handed over by
	// systemd is used as it is, without the lock Listen takes: the socket
	// unit owns the path and keeps it listening, so an agent started by
	// hand on it finds it live and is refused.
	ln, err := socketapi.Activated()
	if err != nil {
		return err
	}
	if ln == nil {
		if ln, err = socketapi.Listen(cfg.Socket.Path, cfg.Socket.Mode, cfg.Socket.Group); err != nil {
			return err
		}
	} else {
		addr := ln.Addr().String()
		log.Info("serving the socket systemd handed over", "socket", addr)
		if addr != cfg.Socket.Path {
			log.Warn("the socket systemd handed over is not socket.path; clients looking there will not find the agent", "socket", addr, "socket.path", cfg.Socket.Path)
		}
	}
	// The state directory next, before the backend opens it: the memory
	// backend's fencing epoch there must have one writer, or two agents
	// could hand out the same tokens. Other backends keep nothing there.
	if cfg.Backend.Kind == "memory" {
		lock, err := lockStateDir(cfg.StateDir)
		if err != nil {
			ln.Close()
			return err
		}
		defer lock.Release()
	}
	mt, mln, err := listenMetrics(cfg.Metrics.Address)
	if err != nil {
		ln.Close()
		return err
	}
	b, err := openBackend(ctx, cfg, log.Named("backend"))
	if err != nil {
		ln.Close()
		closeMetrics(mln)
		if ctx.Err() != nil {
			// Stopped while the backend was opening: a clean stop.
			log.Info("stopped during start-up", "error", err)
			return nil
		}
		return err
	}
	defer b.Close()
	host, _ := os.Hostname()
	peerLog := peerlog.Default()
	a := agent.New(agent.Config{
		Backend:             b,
		Logger:              log.Named("agent"),
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
		Observer:            observer(mt),
		PeerLog:             peerLog,
	})
	srv := &socketapi.Server{
		Agent:          a,
		Logger:         log.Named("socket"),
		MaxLineBytes:   cfg.Limits.MaxLineBytes,
		MaxConns:       cfg.Limits.MaxSessions,
		MaxConnsPerUID: cfg.Limits.MaxConnectionsPerUID,

		MaxOutputBytes:       cfg.Limits.MaxOutputBytes,
		MaxOutputBytesPerUID: cfg.Limits.MaxOutputBytesPerUID,
		PeerLog:              peerLog,
		Observer:             serverObserver(mt),
		// An agent allocates little once its sessions are idle, and might
		// keep a burst's stacks for minutes.
		AfterIdleBurst: debug.FreeOSMemory,
	}

	var wg sync.WaitGroup
	var serveErr error
	wg.Add(2)
	go func() { defer wg.Done(); a.Run(ctx) }()
	go func() {
		defer wg.Done()
		if serveErr = srv.Serve(ctx, ln); serveErr != nil {
			stop()
		}
	}()
	if mt != nil {
		mt.Watch(a)
		wg.Add(1)
		go func() { defer wg.Done(); serveMetrics(ctx, mt, mln, log) }()
	}
	log.Info("agent started", "socket", ln.Addr().String(), "backend", b.Name(), "version", version)
	n := newNotifier(b.Name(), log.Named("systemd"))
	n.ready(a.Stats())
	supervise(ctx, n, hup, a.Stats, func() { reload(file, level, log, a) })
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

func configCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "check" {
		return usageError{"usage: lockagent config check [-config FILE]"}
	}
	fs := newFlagSet("config check", stderr)
	file := fs.String("config", "", "config file (HCL)")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	// A file given without -config would otherwise be ignored, and the
	// defaults checked in its place.
	if fs.NArg() > 0 {
		return usageError{"usage: lockagent config check [-config FILE]"}
	}
	cfg, err := loadConfig(*file, "", "")
	if err != nil {
		return err
	}
	// Groups the agent could not resolve make the configuration invalid.
	if _, err := accessOf(cfg); err != nil {
		return err
	}
	// Say what was checked: without -config, the agent's built-in
	// defaults, which is not what the packaged agent runs with.
	if *file == "" {
		fmt.Fprintln(stdout, "# No -config FILE given: the built-in defaults, as an agent started without -config runs.")
		fmt.Fprintln(stdout, "# The packaged agent reads /etc/lockagent/lockagent.hcl.")
	} else {
		fmt.Fprintf(stdout, "# The effective configuration of %s.\n", *file)
	}
	fmt.Fprint(stdout, cfg.Render())
	return nil
}
