// Package agentbin builds the lockagent binary for tests that run it as a
// process (the end-to-end tests and the chaos suite), the way the test
// binary itself was built.
package agentbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
)

// agentPackage is the agent's main package.
const agentPackage = "github.com/lockagent/lockagent/cmd/lockagent"

// Build builds the lockagent binary into dir with version stamped in, with
// the race detector when the calling test binary has it, and returns its
// path. It runs the go command of the toolchain that built the caller,
// from the current directory, which must lie inside the module (as a
// test's does).
func Build(dir, version string) (string, error) {
	return build(dir, version, RaceEnabled())
}

// BuildWithoutRace builds the binary as Build does, without the race
// detector: for tests that measure the memory the agent takes, which the
// race detector's own would swamp.
func BuildWithoutRace(dir, version string) (string, error) {
	return build(dir, version, false)
}

func build(dir, version string, race bool) (string, error) {
	bin := filepath.Join(dir, "lockagent")
	args := []string{"build", "-o", bin, "-ldflags", "-X main.version=" + version}
	if race {
		args = append(args, "-race")
	}
	args = append(args, agentPackage)
	out, err := exec.Command(goTool(), args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("agentbin: go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return bin, nil
}

// RaceEnabled tells whether the running binary was built with the race
// detector.
func RaceEnabled() bool {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" {
				return s.Value == "true"
			}
		}
	}
	return false
}

// goTool is the go command of the toolchain that built the caller, else
// the one on PATH.
func goTool() string {
	if root := runtime.GOROOT(); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go"
}

// Env is the test's environment for a lockagent process it starts (an
// agent or a client command), with extra added: without what would lead
// the process to another agent (LOCKAGENT_SOCKET overrides an agent's
// config, and the README has its reader export it), to the host's systemd
// or to the user's directories. Every LOCKAGENT_ variable goes; HOME and
// XDG_RUNTIME_DIR become home, a directory of the test's, and
// XDG_STATE_HOME goes, so that a default socket or state directory the
// process derives lies there. A race-enabled process exits without the
// detector's second of sleep. Tests never depend on the shell they run in.
func Env(home string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "LOCKAGENT_"):
		case k == "GORACE", k == "HOME", k == "XDG_RUNTIME_DIR", k == "XDG_STATE_HOME",
			k == "NOTIFY_SOCKET", k == "WATCHDOG_USEC", k == "WATCHDOG_PID", k == "LISTEN_FDS", k == "LISTEN_PID",
			k == "LISTEN_FDNAMES", k == "INVOCATION_ID", k == "JOURNAL_STREAM", k == "CREDENTIALS_DIRECTORY":
		default:
			env = append(env, kv)
		}
	}
	gorace := os.Getenv("GORACE")
	if !strings.Contains(gorace, "atexit_sleep_ms") {
		gorace = strings.TrimSpace(gorace + " atexit_sleep_ms=0")
	}
	env = append(env, "HOME="+home, "XDG_RUNTIME_DIR="+home, "GORACE="+gorace)
	return append(env, extra...)
}
