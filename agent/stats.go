package agent

// Stats is a snapshot of what the agent holds, for the service manager's
// status line.
type Stats struct {
	Sessions int  // open sessions, attached or not
	Leases   int  // leases held across every session
	Waiters  int  // acquires waiting in a queue
	Degraded bool // renewals are failing: some lease's last renewal had an unknown outcome
}

// Stats takes a snapshot under the agent's lock. It is also how the daemon
// tells that the agent is alive: a wedged agent, its lock never released,
// never answers, while a backend outage (no backend call is made under the
// lock) does not delay it.
func (a *Agent) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Stats{Sessions: len(a.sessions), Leases: len(a.leases), Waiters: a.waiters, Degraded: a.degraded}
}
