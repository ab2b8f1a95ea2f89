package socketapi

import (
	"errors"
	"fmt"
	"net"
	"os/user"
	"strconv"
	"sync"
	"syscall"
	"time"

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

// GroupsOfUID returns the groups of a uid from the system's user and group
// databases (the user's primary group and every group that lists the
// user's name): what an ACL rule's groups are matched against, besides the
// peer's own primary gid. A uid without a user entry has no groups.
func GroupsOfUID(uid uint32) ([]uint32, error) {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if errors.As(err, new(user.UnknownUserIdError)) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("groups of uid %d: %w", uid, err)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("groups of uid %d: %w", uid, err)
	}
	gids := make([]uint32, 0, len(ids))
	for _, id := range ids {
		if n, err := strconv.ParseUint(id, 10, 32); err == nil {
			gids = append(gids, uint32(n))
		}
	}
	return gids, nil
}

// groupCache keeps the groups of recent uids for a while, so that a flood
// of connections does not read the group database for each one.
type groupCache struct {
	lookup func(uid uint32) ([]uint32, error)
	ttl    time.Duration

	mu      sync.Mutex
	entries map[uint32]groupEntry
}

type groupEntry struct {
	gids    []uint32
	expires time.Time
}

// maxGroupEntries bounds the cache; when it is full it starts over.
const maxGroupEntries = 4096

func (gc *groupCache) groups(uid uint32) ([]uint32, error) {
	now := time.Now()
	gc.mu.Lock()
	e, ok := gc.entries[uid]
	gc.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.gids, nil
	}
	gids, err := gc.lookup(uid)
	if err != nil {
		return nil, err
	}
	gc.mu.Lock()
	if gc.entries == nil || len(gc.entries) >= maxGroupEntries {
		gc.entries = make(map[uint32]groupEntry)
	}
	gc.entries[uid] = groupEntry{gids, now.Add(gc.ttl)}
	gc.mu.Unlock()
	return gids, nil
}
