package socketapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend/memory"
	"github.com/lockagent/lockagent/socketapi"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(peerEnv); mode != "" {
		os.Exit(peerMain(mode, os.Args[1:]))
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { removePeerBinary() }))
}

// testAgent is an agent and its server on a real Unix socket.
type testAgent struct {
	path    string
	backend *memory.Backend
	agent   *agent.Agent
	stop    func() // stops the agent and waits for every goroutine
}

type options struct {
	agent  agent.Config
	server socketapi.Server
	// socketMode is the socket's mode (default 0600); a wider one opens
	// the socket's directory to everybody too.
	socketMode  os.FileMode
	socketGroup string
}

// startAgent runs an agent on the memory backend at a short socket path
// and stops it when the test ends.
func startAgent(t testing.TB, opts ...func(*options)) *testAgent {
	t.Helper()
	dir, err := os.MkdirTemp("", "la")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	b, err := memory.Open(filepath.Join(dir, "state"))
	require.NoError(t, err)

	o := options{socketMode: 0o600}
	o.agent.Backend = b
	o.agent.Version = "test"
	o.agent.Host = "testhost"
	o.agent.Access.AdminUIDs = []uint32{uint32(os.Getuid())}
	if testing.Verbose() {
		o.agent.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Debug})
	}
	for _, f := range opts {
		f(&o)
	}
	a := agent.New(o.agent)
	path := filepath.Join(dir, "s")
	if o.socketMode&0o077 != 0 {
		require.NoError(t, os.Chmod(dir, 0o755))
	}
	ln, err := socketapi.Listen(path, o.socketMode, o.socketGroup)
	require.NoError(t, err)
	srv := o.server
	srv.Agent = a
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { a.Run(ctx); done <- struct{}{} }()
	go func() { srv.Serve(ctx, ln); done <- struct{}{} }()
	ta := &testAgent{path: path, backend: b, agent: a}
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
	t.Cleanup(func() { ta.stop(); b.Close() })
	return ta
}

// raw is a client that speaks the protocol line by line, for tests of the
// wire itself.
type raw struct {
	t  testing.TB
	nc net.Conn
	r  *bufio.Reader
}

func (ta *testAgent) raw(t testing.TB) *raw {
	t.Helper()
	nc, err := net.Dial("unix", ta.path)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	return &raw{t: t, nc: nc, r: bufio.NewReaderSize(nc, 1<<20)}
}

func (r *raw) send(line string) {
	r.t.Helper()
	_, err := r.nc.Write([]byte(line + "\n"))
	require.NoError(r.t, err)
}

// recv reads the next line as a JSON object, failing after 5s.
func (r *raw) recv() map[string]any {
	r.t.Helper()
	r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := r.r.ReadBytes('\n')
	require.NoError(r.t, err, "reading a line")
	var m map[string]any
	require.NoError(r.t, json.Unmarshal(line, &m), "line %q", line)
	return m
}

// call sends a request and returns the next line, which must answer it.
func (r *raw) call(line string) map[string]any {
	r.t.Helper()
	r.send(line)
	m := r.recv()
	require.NotContains(r.t, m, "event", "expected a response, got an event")
	return m
}

// ok sends a request and requires success.
func (r *raw) ok(line string) map[string]any {
	r.t.Helper()
	m := r.call(line)
	require.Equal(r.t, true, m["ok"], "response %v", m)
	return m
}

// fail sends a request and requires the error code.
func (r *raw) fail(line, code string) map[string]any {
	r.t.Helper()
	m := r.call(line)
	requireCode(r.t, m, code)
	return m
}

func requireCode(t testing.TB, m map[string]any, code string) {
	t.Helper()
	require.Equal(t, false, m["ok"], "response %v", m)
	e, _ := m["error"].(map[string]any)
	require.Equal(t, code, e["code"], "response %v", m)
	require.NotEmpty(t, e["message"])
}

// requireClosed requires the agent to close the connection.
func (r *raw) requireClosed() {
	r.t.Helper()
	r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		_, err := r.r.ReadBytes('\n')
		if err != nil {
			require.NotErrorIs(r.t, err, os.ErrDeadlineExceeded, "the connection stayed open")
			return
		}
	}
}

// client returns a Go client that has said hello.
func (ta *testAgent) client(t testing.TB, hello map[string]any) *socketapi.Client {
	t.Helper()
	c, err := socketapi.Dial(context.Background(), ta.path)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	if hello != nil {
		require.NoError(t, c.Call(context.Background(), "hello", hello, nil))
	}
	return c
}

// lease is the part of an acquire's answer the tests read.
type lease struct {
	Acquired bool   `json:"acquired"`
	Lease    string `json:"lease"`
	Name     string `json:"name"`
	Mode     string `json:"mode"`
	Scope    string `json:"scope"`
	Token    uint64 `json:"token"`
	TTLMs    int64  `json:"ttl_ms"`
	Reason   string `json:"reason"`
}

func acquire(t testing.TB, c *socketapi.Client, args map[string]any) lease {
	t.Helper()
	var l lease
	require.NoError(t, c.Call(context.Background(), "acquire", args, &l))
	return l
}

// nextEvent waits up to 5s for an event.
func nextEvent(t testing.TB, c *socketapi.Client) socketapi.Event {
	t.Helper()
	select {
	case ev, ok := <-c.Events():
		require.True(t, ok, "connection ended before an event")
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return socketapi.Event{}
}

func code(err error) string {
	if e, ok := err.(*socketapi.Error); ok {
		return e.Code
	}
	return ""
}
