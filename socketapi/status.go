package socketapi

import (
	"context"
	"encoding/json"
	"time"
)

// statusResult is the answer of status: the agent as a whole, for any peer.
type statusResult struct {
	Version      string `json:"version"`
	UptimeMs     int64  `json:"uptime_ms"`
	Backend      string `json:"backend"`
	BackendState string `json:"backend_state"` // ok or degraded
	// The last backend call that could not reach it, while none has since.
	BackendError      string `json:"backend_error,omitempty"`
	BackendErrorAgoMs int64  `json:"backend_error_ago_ms,omitempty"`
	Sessions          int    `json:"sessions"`
	Leases            int    `json:"leases"`
	Waiters           int    `json:"waiters"`
}

// status reports the agent's version, uptime, backend and its state, and
// its counts of sessions, leases and waiters.
func (c *conn) status(_ context.Context, id json.RawMessage, _ *request) bool {
	a := c.srv.Agent
	st, info := a.Stats(), a.Info()
	state := "ok"
	if st.Degraded {
		state = "degraded"
	}
	res := statusResult{
		Version:      info.Version,
		UptimeMs:     time.Since(a.Started()).Milliseconds(),
		Backend:      info.Backend,
		BackendState: state,
		Sessions:     st.Sessions,
		Leases:       st.Leases,
		Waiters:      st.Waiters,
	}
	if st.BackendError != "" {
		res.BackendError = st.BackendError
		res.BackendErrorAgoMs = max(time.Since(st.BackendErrorAt).Milliseconds(), 1)
	}
	c.reply(id, res, nil)
	return true
}
