package socketpath

import (
	"os"
	"path/filepath"
	"testing"
)

func TestFor(t *testing.T) {
	tests := []struct {
		name string
		euid int
		env  map[string]string
		want string
	}{
		{"root", 0, map[string]string{"XDG_RUNTIME_DIR": "/run/user/0"}, "/run/lockagent/agent.sock"},
		{"systemd service", 1000, map[string]string{"INVOCATION_ID": "1f2e", "XDG_RUNTIME_DIR": "/run/user/1000"}, "/run/lockagent/agent.sock"},
		{"systemd notify", 1000, map[string]string{"NOTIFY_SOCKET": "/run/systemd/notify"}, "/run/lockagent/agent.sock"},
		{"user", 1000, map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000"}, "/run/user/1000/lockagent.sock"},
		{"relative runtime dir", 1000, map[string]string{"XDG_RUNTIME_DIR": "run/user"}, filepath.Join(os.TempDir(), "lockagent-1000", "agent.sock")},
		{"no runtime dir", 1000, nil, filepath.Join(os.TempDir(), "lockagent-1000", "agent.sock")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := For(tc.euid, func(k string) string { return tc.env[k] }); got != tc.want {
				t.Errorf("For(%d, %v) = %q, want %q", tc.euid, tc.env, got, tc.want)
			}
		})
	}
	if Default() != For(os.Geteuid(), os.Getenv) {
		t.Errorf("Default() = %q, not For the process", Default())
	}
}
