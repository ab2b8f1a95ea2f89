// Package agenttest runs a real agent in a test's own process: the
// embedded backend, the agent and its wire protocol server on a Unix
// socket at a short path. It serves the tests of the server (socketapi)
// and of the Go client (client); the end-to-end tests run the binary
// instead.
package agenttest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend/memory"
	"github.com/lockagent/lockagent/socketapi"
)

// Options are what Start runs. Agent.Backend is the memory backend when
// the options are applied (an option may wrap it); Start sets
// Server.Agent.
type Options struct {
	Agent  agent.Config
	Server socketapi.Server
	// SocketMode is the socket's mode (default 0600); a wider one opens
	// the socket's directory to everybody too.
	SocketMode  os.FileMode
	SocketGroup string
}

// Agent is an agent that Start runs.
type Agent struct {
	Path    string // its socket
	Backend *memory.Backend
	Agent   *agent.Agent
	stop    func()
}

// Stop stops the agent and its server, and waits for every goroutine they
// started. The end of the test does it too; more calls do nothing.
func (a *Agent) Stop() { a.stop() }

// Start runs an agent on the memory backend at a short socket path: the
// version "test", the host "testhost", the test's uid an admin, debug logs
// when the tests are verbose; opts change that. It stops when tb ends.
func Start(tb testing.TB, opts ...func(*Options)) *Agent {
	tb.Helper()
	dir, err := os.MkdirTemp("", "la")
	require.NoError(tb, err)
	tb.Cleanup(func() { os.RemoveAll(dir) })
	b, err := memory.Open(filepath.Join(dir, "state"))
	require.NoError(tb, err)

	o := Options{SocketMode: 0o600}
	o.Agent.Backend = b
	o.Agent.Version = "test"
	o.Agent.Host = "testhost"
	o.Agent.Access.AdminUIDs = []uint32{uint32(os.Getuid())}
	if testing.Verbose() {
		o.Agent.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Debug})
	}
	for _, f := range opts {
		f(&o)
	}
	a := agent.New(o.Agent)
	path := filepath.Join(dir, "s")
	if o.SocketMode&0o077 != 0 {
		require.NoError(tb, os.Chmod(dir, 0o755))
	}
	ln, err := socketapi.Listen(path, o.SocketMode, o.SocketGroup)
	require.NoError(tb, err)
	srv := &o.Server
	srv.Agent = a
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { a.Run(ctx); done <- struct{}{} }()
	go func() { srv.Serve(ctx, ln); done <- struct{}{} }()
	ta := &Agent{Path: path, Backend: b, Agent: a}
	stopped := false
	ta.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
		<-done
	}
	tb.Cleanup(func() { ta.Stop(); b.Close() })
	return ta
}
