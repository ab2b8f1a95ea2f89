package socketapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend/memory"
	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit/agenttest"
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

type options = agenttest.Options

// startAgent runs an agent on the memory backend at a short socket path
// and stops it when the test ends (see agenttest.Start).
func startAgent(t testing.TB, opts ...func(*options)) *testAgent {
	t.Helper()
	a := agenttest.Start(t, opts...)
	return &testAgent{path: a.Path, backend: a.Backend, agent: a.Agent, stop: a.Stop}
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
func (ta *testAgent) client(t testing.TB, hello map[string]any) *client.Client {
	t.Helper()
	c, err := client.Dial(context.Background(), ta.path)
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

func acquire(t testing.TB, c *client.Client, args map[string]any) lease {
	t.Helper()
	var l lease
	require.NoError(t, c.Call(context.Background(), "acquire", args, &l))
	return l
}

// nextEvent waits up to 5s for an event.
func nextEvent(t testing.TB, c *client.Client) client.Event {
	t.Helper()
	select {
	case ev, ok := <-c.Events():
		require.True(t, ok, "connection ended before an event")
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return client.Event{}
}

func code(err error) string {
	if e, ok := err.(*client.Error); ok {
		return e.Code
	}
	return ""
}
