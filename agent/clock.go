package agent

import (
	"time"

	"golang.org/x/sys/unix"
)

// Go's monotonic clock (CLOCK_MONOTONIC) stops while the host is
// suspended, but Redis's expiries do not: after a resume, a lease would
// look valid for as long as the host slept. CLOCK_BOOTTIME keeps counting
// through a suspend, so the difference between the two over an interval
// is the time the host was suspended in it.

// stamp is an instant on both clocks.
type stamp struct {
	mono time.Time     // with its monotonic reading
	boot time.Duration // CLOCK_BOOTTIME
}

// suspendedSince is how long the host was suspended between earlier and s.
func (s stamp) suspendedSince(earlier stamp) time.Duration {
	return (s.boot - earlier.boot) - s.mono.Sub(earlier.mono)
}

// bootTime reads CLOCK_BOOTTIME.
func bootTime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0 // no boot clock: no suspend is ever seen
	}
	return time.Duration(ts.Nano())
}

// suspendThreshold is the gap between the two clocks taken for a suspend;
// they are slewed alike, so any real gap is a suspend.
const suspendThreshold = 20 * time.Millisecond

// suspendCheck bounds how long the scheduler sleeps while leases are
// held, so that a resume is noticed soon on the monotonic clock.
const suspendCheck = time.Second

// now reads both clocks.
func (a *Agent) now() stamp {
	return stamp{mono: time.Now(), boot: a.cfg.BootClock()}
}

// sleptDuring is how long the host was suspended between start and end,
// both read with time.Now, judged by the wall clock, which keeps counting
// through a suspend. It costs no system call, so it serves for every
// backend round trip; a step of the wall clock forward reads as a suspend
// (the lease is shortened: the safe side), and the scheduler's look at
// CLOCK_BOOTTIME catches what a step backwards would hide.
func sleptDuring(start, end time.Time) time.Duration {
	return end.Round(0).Sub(start.Round(0)) - end.Sub(start)
}
