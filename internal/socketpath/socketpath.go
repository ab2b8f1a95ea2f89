// Package socketpath is where the agent's socket is by default, and the
// check that makes the private directory of a user without a runtime
// directory safe to use. The agent (through config) and the Go client
// compute the path the same way, here.
//
// It depends on the standard library alone, as the client does.
package socketpath

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Default is the socket path used when neither a flag, the
// LOCKAGENT_SOCKET variable nor the config names one:
// /run/lockagent/agent.sock for root and systemd services, else
// $XDG_RUNTIME_DIR/lockagent.sock, else agent.sock in PrivateDir.
func Default() string {
	return For(os.Geteuid(), os.Getenv)
}

// For is Default for effective uid euid and the environment getenv reads.
func For(euid int, getenv func(string) string) string {
	if euid == 0 || getenv("INVOCATION_ID") != "" || getenv("NOTIFY_SOCKET") != "" {
		return "/run/lockagent/agent.sock"
	}
	// The XDG spec says to ignore relative paths in its variables.
	if dir := getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(dir) {
		return filepath.Join(dir, "lockagent.sock")
	}
	return filepath.Join(privateDir(euid), "agent.sock")
}

// PrivateDir is the directory of the default socket of a user without a
// runtime directory: lockagent-UID in the temporary directory, UID being
// the effective uid. The temporary directory is everybody's, so the agent
// makes it accessible to its user only, and neither the agent nor a
// client uses it unless CheckPrivate says it is the user's own and
// private.
func PrivateDir() string {
	return privateDir(os.Geteuid())
}

func privateDir(euid int) string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("lockagent-%d", euid))
}

// CheckPrivate tells whether dir is a directory (not a link to one) of the
// effective user's, which nobody else may enter.
func CheckPrivate(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	euid := os.Geteuid()
	owner := -1
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		owner = int(st.Uid)
	}
	if !fi.IsDir() || owner != euid || fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s is not a directory private to uid %d (%v, owner %d): remove it, or give the socket another path", dir, euid, fi.Mode(), owner)
	}
	return nil
}
