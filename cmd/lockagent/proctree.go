package main

// The processes of a command, which a lost lock stops. run is the child
// subreaper of its descendants: a process whose parent ends is adopted by
// run, not by init, so everything the command starts, even a process that
// left its session (setsid) or was double-forked, stays run's descendant,
// and the parent links of /proc lead from it to run. The command keeps
// run's process group: a group of its own would break the command's own
// setsid and a terminal's job control.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// treePoll is how often run looks again, after a lost lock, for what is
// left of the command's processes.
const treePoll = 20 * time.Millisecond

// becomeSubreaper makes run adopt the orphans among its descendants.
func becomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become the subreaper of the command's processes: %w", err)
	}
	return nil
}

// descendants returns the pids of run's living descendants, and of its
// own children, ended (zombies) or not.
func descendants() (living, children []int, err error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil, fmt.Errorf("list processes: %w", err)
	}
	kids := map[int][]int{}
	ended := map[int]bool{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue // not a process
		}
		ppid, state, err := procStat(pid)
		if err != nil {
			continue // it ended since the listing
		}
		kids[ppid] = append(kids[ppid], pid)
		ended[pid] = state == 'Z' || state == 'X'
	}
	self := os.Getpid()
	// seen guards against a cycle of parent links read at different
	// times, should a pid be reused meanwhile.
	seen := map[int]bool{self: true}
	for queue := kids[self]; len(queue) > 0; queue = queue[1:] {
		pid := queue[0]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		if !ended[pid] {
			living = append(living, pid)
		}
		queue = append(queue, kids[pid]...)
	}
	return living, kids[self], nil
}

// procStat reads a process's parent pid and state from /proc/PID/stat.
// They follow its command name, in parentheses, which may itself hold
// spaces and parentheses: hence the last ')'.
func procStat(pid int) (ppid int, state byte, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:])) // state ppid …
	if i < 0 || len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return ppid, f[0][0], nil
}

// signalAll sends sig to each of pids, and returns those that run may not
// signal: another user's (what a sudo started, say). A pid listed a moment
// ago may since have ended and been reused by an unrelated process: each
// is first pinned with a pidfd, then signalled only if it still descends
// from run.
func signalAll(pids []int, sig syscall.Signal) (denied []int) {
	for _, pid := range pids {
		if errors.Is(signalDescendant(pid, sig), unix.EPERM) {
			denied = append(denied, pid)
		}
	}
	return denied
}

// signalDescendant sends sig to pid if it is a descendant of run. Without
// pidfds (Linux before 5.3, or a sandbox that refuses pidfd_open, which
// needs no permission over the process) it checks, then kills.
func signalDescendant(pid int, sig syscall.Signal) error {
	fd, err := unix.PidfdOpen(pid, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return err
	case err != nil:
		if !descends(pid) {
			return unix.ESRCH
		}
		return unix.Kill(pid, sig)
	}
	defer unix.Close(fd)
	// The pidfd names one process for good: if pid descends from run now,
	// the signal reaches that process, and no other.
	if !descends(pid) {
		return unix.ESRCH
	}
	return unix.PidfdSendSignal(fd, sig, nil, 0)
}

// descends reports whether run is an ancestor of pid, by the parent links
// of /proc. As run is its descendants' subreaper, the links of each lead
// to run for as long as it lives.
func descends(pid int) bool {
	self := os.Getpid()
	for range 4096 { // more than any real depth; a cycle read in a race ends
		ppid, _, err := procStat(pid)
		switch {
		case err != nil:
			return false
		case ppid == self: // run may be pid 1, in a container
			return true
		case ppid <= 1:
			return false
		}
		pid = ppid
	}
	return false
}

// reapOrphans reaps the processes that run adopted and that have ended:
// its children other than cmd (nil: none), which cmd's exec.Cmd reaps.
// Each is waited for by its pid: wait4(-1) could take the command's own
// status. If /proc cannot be read, the next call tries again.
func reapOrphans(cmd *command) {
	_, children, _ := descendants()
	for _, pid := range children {
		if cmd == nil || pid != cmd.p.Pid {
			unix.Wait4(pid, nil, unix.WNOHANG, nil)
		}
	}
}

// waitTree returns once run has no descendant left, after its command has
// exited on a lost lock: it waits for them to end until deadline, then
// sends SIGKILL to those left, round after round (a process may fork
// meanwhile). It reaps those that run adopted. Processes that run may not
// signal are left running, and said so.
func waitTree(deadline time.Time, stderr io.Writer) {
	for {
		reapOrphans(nil)
		living, _, err := descendants()
		if err != nil {
			fmt.Fprintf(stderr, "lockagent: %v\n", err)
			return
		}
		if len(living) == 0 {
			return
		}
		if !time.Now().Before(deadline) {
			if denied := signalAll(living, syscall.SIGKILL); len(denied) == len(living) {
				fmt.Fprintf(stderr, "lockagent: not permitted to kill processes %v; they run on without the lock\n", denied)
				return
			}
		}
		time.Sleep(treePoll)
	}
}
