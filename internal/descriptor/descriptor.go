// Package descriptor handles the file descriptors that an upgrade hands
// from one agent process to the next: a socket's descriptor, and copies
// that outlive the file they come from.
package descriptor

import (
	"os"
	"syscall"
)

// Of is the descriptor of a socket (a listener or a connection), which
// stays its own.
func Of(sc syscall.Conn) (int, error) {
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	if err := rc.Control(func(d uintptr) { fd = int(d) }); err != nil {
		return -1, err
	}
	return fd, nil
}

// Dup is a copy of f, close-on-exec, which stays open once f is closed.
func Dup(f *os.File) (*os.File, error) {
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		return nil, os.NewSyscallError("dup", err)
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), f.Name()), nil
}
