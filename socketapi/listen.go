package socketapi

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// ErrInUse is returned by Listen when another process is serving the path.
var ErrInUse = errors.New("socketapi: socket in use by a live agent")

// Listen binds the agent's Unix socket at path, defensively: a live agent's
// socket is never replaced (ErrInUse), a path that is not a socket is never
// removed, and a stale socket left by a dead agent is. The socket gets mode
// and, when group is set (a name or a number), that group.
func Listen(path string, mode os.FileMode, group string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("listen %s: exists and is not a socket; not removing it", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("listen %s: %w", path, ErrInUse)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("listen %s: cannot tell whether the socket is live: %w", path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen %s: removing the stale socket: %w", path, err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := setOwnership(path, mode, group); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return ln, nil
}

func setOwnership(path string, mode os.FileMode, group string) error {
	if group != "" {
		gid, err := strconv.Atoi(group)
		if err != nil {
			g, lerr := user.LookupGroup(group)
			if lerr != nil {
				return fmt.Errorf("group %q: %w", group, lerr)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
		if err := os.Chown(path, -1, gid); err != nil {
			return err
		}
	}
	return os.Chmod(path, mode)
}
