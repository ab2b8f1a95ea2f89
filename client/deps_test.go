package client_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// ownPackages are the packages of this module that the client may import:
// they depend on the standard library alone, as it does.
var ownPackages = map[string]bool{
	"github.com/lockagent/lockagent/client":              true,
	"github.com/lockagent/lockagent/internal/wire":       true,
	"github.com/lockagent/lockagent/internal/socketpath": true,
}

// TestDependencies: the client, and everything it imports, is the
// standard library but for the packages above; an application that takes
// locks builds nothing of the agent, its configuration or its backends.
func TestDependencies(t *testing.T) {
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps",
		"-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "github.com/lockagent/lockagent/client").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if !ownPackages[pkg] {
			t.Errorf("the client depends on %s: it must depend on the standard library alone", pkg)
		}
	}
}
