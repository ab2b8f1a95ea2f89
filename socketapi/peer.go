package socketapi

import (
	"fmt"
	"net"
	"syscall"

	"github.com/lockagent/lockagent/agent"
)

// peerOf reads the credentials of the process at the other end of a Unix
// socket (SO_PEERCRED): who connected, as the kernel saw it at connect time.
func peerOf(c *net.UnixConn) (agent.Peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return agent.Peer{}, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *syscall.Ucred
	var credErr error
	err = raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	if err == nil {
		err = credErr
	}
	if err != nil {
		return agent.Peer{}, fmt.Errorf("peer credentials: %w", err)
	}
	return agent.Peer{PID: cred.Pid, UID: cred.Uid, GID: cred.Gid}, nil
}
