package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockagent/lockagent/backend/memory"
	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit/agenttest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testAgent is an agent and its server on a real Unix socket, in the
// test's process.
type testAgent struct {
	path    string
	backend *memory.Backend
	stop    func() // stops the agent and waits for every goroutine
}

type options = agenttest.Options

func startAgent(t testing.TB, opts ...func(*options)) *testAgent {
	t.Helper()
	a := agenttest.Start(t, opts...)
	return &testAgent{path: a.Path, backend: a.Backend, stop: a.Stop}
}

// lease is the part of an acquire's answer the tests read from Call.
type lease struct {
	Acquired bool   `json:"acquired"`
	Lease    string `json:"lease"`
	Name     string `json:"name"`
	Token    uint64 `json:"token"`
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

// waitQueued waits until n waiters queue for name.
func waitQueued(t *testing.T, c *client.Client, name string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		in, err := c.Inspect(context.Background(), name)
		require.NoError(t, err)
		return in.Queued == n
	}, 5*time.Second, time.Millisecond, "%d waiters queued for %s", n, name)
}
