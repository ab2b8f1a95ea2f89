package socketapi

import (
	"context"
	"encoding/json"
	"time"

	"github.com/lockagent/lockagent/internal/wire"
)

// status reports the agent's version, uptime, backend and its state, and
// its counts of sessions, leases and waiters.
func (c *conn) status(_ context.Context, id json.RawMessage, _ *request) bool {
	a := c.srv.Agent
	st, info := a.Stats(), a.Info()
	state := "ok"
	if st.Degraded {
		state = "degraded"
	}
	res := wire.StatusResult{
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
