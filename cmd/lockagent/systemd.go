package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/lockagent/lockagent/agent"
)

// statusEvery is how often the status line is refreshed when systemd
// listens (NOTIFY_SOCKET) but runs no watchdog.
const statusEvery = 10 * time.Second

// notifier is the agent's side of sd_notify: readiness, status, reloads,
// stopping and the watchdog. Outside systemd (no NOTIFY_SOCKET) every
// message is dropped and no ticker runs.
type notifier struct {
	// send delivers one message (newline-separated KEY=VALUE lines); it
	// reports whether somebody listens.
	send     func(state string) (bool, error)
	listened bool          // NOTIFY_SOCKET is set
	watchdog time.Duration // WATCHDOG_USEC for this process; 0: no watchdog
	backend  string        // the backend's name, for the status line
	log      hclog.Logger

	status string // the last status line sent
	failed bool   // a send failed; logged once
}

// newNotifier reads the environment systemd gives a Type=notify service.
func newNotifier(backendName string, log hclog.Logger) *notifier {
	n := &notifier{
		send:     func(state string) (bool, error) { return daemon.SdNotify(false, state) },
		listened: os.Getenv("NOTIFY_SOCKET") != "",
		backend:  backendName,
		log:      log,
	}
	wd, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("ignoring the watchdog settings", "error", err)
	}
	n.watchdog = wd
	return n
}

// period is how often the supervisor checks the agent: half the watchdog
// interval, as sd_watchdog_enabled(3) advises; else statusEvery while
// systemd listens; 0 (never) outside systemd.
func (n *notifier) period() time.Duration {
	switch {
	case n.watchdog > 0:
		return n.watchdog / 2
	case n.listened:
		return statusEvery
	}
	return 0
}

// notify sends the lines as one message.
func (n *notifier) notify(lines ...string) {
	if !n.listened {
		return
	}
	if _, err := n.send(strings.Join(lines, "\n")); err != nil && !n.failed {
		n.failed = true
		n.log.Warn("cannot notify systemd", "error", err)
	}
}

// statusLine is what `systemctl status` shows of the agent.
func (n *notifier) statusLine(st agent.Stats) string {
	backend := "ok"
	switch {
	case st.Degraded:
		backend = "degraded (renewals failing)"
	case st.BackendError != "":
		backend = "unavailable (a call failed at " + st.BackendErrorAt.Format(time.TimeOnly) + ")"
	}
	return fmt.Sprintf("STATUS=%d sessions, %d leases, %d waiting; backend %s: %s", st.Sessions, st.Leases, st.Waiters, n.backend, backend)
}

// ready tells systemd that the agent serves (at start, or after a reload).
func (n *notifier) ready(st agent.Stats) {
	n.status = n.statusLine(st)
	n.notify(daemon.SdNotifyReady, n.status)
}

// alive feeds the watchdog, and sends the status line when it changed.
func (n *notifier) alive(st agent.Stats) {
	var lines []string
	if n.watchdog > 0 {
		lines = append(lines, daemon.SdNotifyWatchdog)
	}
	if s := n.statusLine(st); s != n.status {
		n.status = s
		lines = append(lines, s)
	}
	if len(lines) > 0 {
		n.notify(lines...)
	}
}

// reloading tells systemd a reload has begun; ready ends it. Newer
// systemd versions require the monotonic time with it.
func (n *notifier) reloading() {
	var ts unix.Timespec
	msg := []string{daemon.SdNotifyReloading}
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err == nil {
		msg = append(msg, "MONOTONIC_USEC="+strconv.FormatInt(ts.Nano()/1000, 10))
	}
	n.notify(msg...)
}

// stopping tells systemd the agent is shutting down.
func (n *notifier) stopping() {
	n.notify(daemon.SdNotifyStopping, "STATUS=stopping: releasing every lease")
}

// supervise is the daemon's main loop, until ctx is done. On SIGHUP it
// reloads, between RELOADING=1 and READY=1. Every period it takes the
// agent's stats and only then feeds the watchdog: the stats come from under
// the agent's lock, so a wedged agent, or this loop stuck in a reload,
// stops the watchdog and systemd restarts the agent. A backend outage does
// not: no backend call is made under that lock, and the status line says
// the backend is degraded instead.
func supervise(ctx context.Context, n *notifier, hup, usr2 <-chan os.Signal, up *upgrader, stats func() agent.Stats, reload func()) (handedTo int) {
	var tick <-chan time.Time
	if p := n.period(); p > 0 {
		t := time.NewTicker(p)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return 0
		case <-hup:
			n.reloading()
			reload()
			n.ready(stats())
		case <-usr2:
			up.start()
		case pid := <-up.done:
			return pid
		case <-tick:
			n.alive(stats())
		}
	}
}
