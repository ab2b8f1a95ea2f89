package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// agentPackage is the agent's main package, built by Build.
const agentPackage = "github.com/lockagent/lockagent/cmd/lockagent"

// Build builds the lockagent binary into dir, with the race detector when
// the calling test binary has it (raceEnabled, set by a build tag), and
// returns its path. It runs the go command of the toolchain that built the
// caller, from the current directory, which must lie inside the module (as
// a test's does).
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "lockagent")
	args := []string{"build", "-o", bin, "-ldflags", "-X main.version=chaos-test"}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command(goTool(), append(args, agentPackage)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("chaos: go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin, nil
}

// goTool is the go command of the toolchain that built the tests, else the
// one on PATH.
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
