// Package lockfile makes a path one process's for as long as it runs: an
// exclusive flock on a lock file, which the agent takes beside its socket
// and in its state directory. The kernel drops the lock when the process
// ends, however it ends, so a lock file left behind is harmless; it is
// never removed, since a process holding the lock on a file that was
// unlinked would share the path with one that creates it anew. It knows
// nothing of sockets or agents.
package lockfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// HeldError is Acquire's error when another process holds the lock.
type HeldError struct {
	Path string // the lock file
	PID  int    // the holder's, as the lock file says; 0 when it does not
}

func (e *HeldError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("%s is held by pid %d", e.Path, e.PID)
	}
	return fmt.Sprintf("%s is held by another process", e.Path)
}

// Lock is a lock file held by this process.
type Lock struct {
	f *os.File
}

// Acquire takes an exclusive lock on the file at path without waiting:
// *HeldError when another process holds it. A missing file is created with
// mode 0600. A symbolic link is never followed, and anything but a regular
// file of the effective user's is refused: a lock file that somebody else
// could hold is no lock. Once held, the file says this process's pid, for
// the HeldError of the next process that tries.
func Acquire(path string) (*Lock, error) {
	// A FIFO planted at the path does not hang an open for reading and
	// writing (on Linux); it is refused once opened.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("lock file %s is a symbolic link; not following it", path)
	}
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if err := checkOwn(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock file %s %w: remove it", path, err)
	}
	if err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &HeldError{Path: path, PID: holder(f)}
		}
		return nil, fmt.Errorf("lock file %s: %w", path, err)
	}
	// The pid is only for the messages of others: a lock file that cannot
	// say it is held all the same.
	if f.Truncate(0) == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Release releases the lock. The file stays.
func (l *Lock) Release() error {
	return l.f.Close()
}

// checkOwn requires f to be a regular file of the effective user's.
func checkOwn(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	euid := os.Geteuid()
	owner := -1
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		owner = int(st.Uid)
	}
	if !fi.Mode().IsRegular() || owner != euid {
		return fmt.Errorf("is not a regular file of uid %d's (%v, owner %d)", euid, fi.Mode(), owner)
	}
	return nil
}

// flock applies how to f, again when a signal interrupts it.
func flock(f *os.File, how int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if ferr = syscall.Flock(int(fd), how); ferr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return ferr
}

// holder is the pid the lock file f says, or 0.
func holder(f *os.File) int {
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 32))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// File is the lock's open file. The lock is the open file's, not the
// process's: another process that is handed the file, and keeps it open,
// holds the lock too (see Adopt).
func (l *Lock) File() *os.File { return l.f }

// Adopt holds a lock that another process took and handed over, by its
// file (see File), and makes the file say this process's pid.
func Adopt(f *os.File) *Lock {
	if f.Truncate(0) == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}
}
