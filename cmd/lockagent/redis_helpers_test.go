package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockagent/lockagent/internal/faultproxy"
	"github.com/lockagent/lockagent/internal/redistest"
	"github.com/lockagent/lockagent/socketapi"
)

// fleet is several agent processes sharing one real redis-server, each
// through its own fault proxy, as the hosts of a fleet would.
type fleet struct {
	redis  *redistest.Server
	agents []*fleetAgent
}

// fleetAgent is one agent of a fleet.
type fleetAgent struct {
	env   *agentEnv
	proxy *faultproxy.Proxy
	proc  *proc
}

// startFleet starts redis-server with opts and n agents on it. extraHCL is
// added to every agent's config.
func startFleet(t *testing.T, n int, opts redistest.Options, extraHCL string) *fleet {
	t.Helper()
	f := &fleet{redis: redistest.Start(t, opts)}
	for i := 0; i < n; i++ {
		f.agents = append(f.agents, f.addAgent(t, extraHCL))
	}
	return f
}

// addAgent starts one more agent on the fleet's Redis.
func (f *fleet) addAgent(t *testing.T, extraHCL string) *fleetAgent {
	t.Helper()
	a := &fleetAgent{env: newAgentEnv(t), proxy: faultproxy.New(t, f.redis.Addr())}
	a.env.writeConfig(t, fmt.Sprintf("backend \"redis\" {\n  addresses  = [%q]\n  key_prefix = \"e2e\"\n}\n%s", a.proxy.Addr(), extraHCL))
	a.start(t)
	return a
}

// client connects an application to the agent.
func (a *fleetAgent) client(t *testing.T, name string) *socketapi.Client {
	t.Helper()
	return dialAgent(t, a.env.socket, name)
}

// start starts the agent (again, after it stopped or was killed); it is
// stopped with SIGTERM at the end of the test if it still runs.
func (a *fleetAgent) start(t *testing.T) {
	t.Helper()
	p := a.env.start(t)
	a.proc = p
	t.Cleanup(func() {
		if !p.exited() {
			stopAgent(t, p)
		}
	})
}

// waitQueued waits until the agent has n acquires waiting, across its
// sessions.
func (a *fleetAgent) waitQueued(t *testing.T, n int) {
	t.Helper()
	c := a.client(t, "observer")
	eventually(t, 5*time.Second, fmt.Sprintf("%d waiting acquires", n), func() bool {
		var res struct {
			Sessions []struct {
				Waiting []struct{} `json:"waiting"`
			} `json:"sessions"`
		}
		call(t, c, "list", map[string]any{"all": true}, &res)
		got := 0
		for _, s := range res.Sessions {
			got += len(s.Waiting)
		}
		return got == n
	})
}
