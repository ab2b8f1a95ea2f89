package socketapi

import (
	"context"
	"encoding/json"
	"os"
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
		PID:          os.Getpid(),
		UptimeMs:     time.Since(a.Started()).Milliseconds(),
		Backend:      info.Backend,
		BackendState: state,
		Sessions:     st.Sessions,
		Leases:       st.Leases,
		Waiters:      st.Waiters,
	}
	if !c.srv.Upgraded.IsZero() {
		res.UpgradedAgoMs = max(time.Since(c.srv.Upgraded).Milliseconds(), 1)
		res.UpgradeMs = max(c.srv.Upgrading.Milliseconds(), 1)
	}
	if st.BackendError != "" {
		res.BackendError = st.BackendError
		res.BackendErrorAgoMs = max(time.Since(st.BackendErrorAt).Milliseconds(), 1)
	}
	c.reply(id, res, nil)
	return true
}
