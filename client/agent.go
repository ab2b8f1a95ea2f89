package client

import (
	"context"
	"time"

	"github.com/lockagent/lockagent/internal/wire"
)

// The typed ops of the agent as a whole and of the session: list, status,
// ping and bye.

// SessionInfo is a session, as List describes it.
type SessionInfo struct {
	ID        string
	PID       int32 // the process of the session's latest connection
	UID       uint32
	Client    string // the name given in Hello
	Attached  bool   // false while the session waits to be resumed
	Leases    []ListedLease
	Waiting   []Waiting
	Campaigns []CampaignInfo
}

// ListedLease is a lease in a list.
type ListedLease struct {
	LeaseInfo
	Meta      string
	HeldFor   time.Duration // since the grant
	ExpiresIn time.Duration // until the agent gives it up as lost, if no renewal succeeds
}

// Waiting is a waiting acquire in a list (a contending campaign's too).
type Waiting struct {
	Name   string
	Mode   string
	Waited time.Duration
}

// CampaignInfo is a campaign in a list.
type CampaignInfo struct {
	ID     string
	Name   string
	Leader bool   // it holds a term
	Lease  string // the term's lease, while leader
}

// ListOptions are the arguments of List.
type ListOptions struct {
	// All lists every session (admins only: ErrPermissionDenied for
	// others), not only those of the caller's uid.
	All bool
}

// listPage is how many sessions List asks for at a time: each answer is
// small, whatever the number of sessions.
const listPage = 100

// List describes the sessions of the caller's uid, or every session, by
// id. It asks for them a page at a time; sessions that open or end
// meanwhile may or may not be there.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]SessionInfo, error) {
	out := []SessionInfo{}
	args := map[string]any{"all": opts.All, "limit": listPage}
	for {
		var page wire.ListResult
		if err := c.Call(ctx, "list", args, &page); err != nil {
			return nil, err
		}
		for _, s := range page.Sessions {
			out = append(out, sessionInfo(s))
		}
		if page.Next == nil {
			return out, nil
		}
		args["after"] = *page.Next
	}
}

func sessionInfo(s wire.Session) SessionInfo {
	si := SessionInfo{ID: s.Session, PID: s.PID, UID: s.UID, Client: s.Client, Attached: s.Attached}
	for _, l := range s.Leases {
		si.Leases = append(si.Leases, ListedLease{LeaseInfo: leaseInfo(l.Lease), Meta: l.Meta,
			HeldFor: msDuration(l.HeldForMs), ExpiresIn: msDuration(l.ExpiresInMs)})
	}
	for _, w := range s.Waiting {
		si.Waiting = append(si.Waiting, Waiting{Name: w.Name, Mode: w.Mode, Waited: msDuration(w.WaitedMs)})
	}
	for _, cp := range s.Campaigns {
		si.Campaigns = append(si.Campaigns, CampaignInfo{ID: cp.Campaign, Name: cp.Name, Leader: cp.Leader, Lease: cp.Lease})
	}
	return si
}

// Status is what the agent says of itself.
type Status struct {
	Version string
	PID     int           // the agent's process, which an upgrade changes
	Uptime  time.Duration // since the agent first started, upgrades aside
	// The upgrade that handed the agent over to its process, if one did,
	// UpgradedAgo ago; and how long its clients waited for it.
	UpgradedAgo  time.Duration
	UpgradeWait  time.Duration
	Backend      string // memory or redis
	BackendState string // ok, or degraded while renewals fail
	// BackendError is the last backend call that could not reach it, if
	// none has since, BackendErrorAgo ago.
	BackendError    string
	BackendErrorAgo time.Duration
	Sessions        int
	Leases          int
	Waiters         int
}

// Status reports the agent's version, uptime and backend, and its counts
// of sessions, leases and waiters.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var r wire.StatusResult
	if err := c.Call(ctx, "status", nil, &r); err != nil {
		return nil, err
	}
	return &Status{Version: r.Version, PID: r.PID, Uptime: msDuration(r.UptimeMs),
		UpgradedAgo: msDuration(r.UpgradedAgoMs), UpgradeWait: msDuration(r.UpgradeMs), Backend: r.Backend, BackendState: r.BackendState,
		BackendError: r.BackendError, BackendErrorAgo: msDuration(r.BackendErrorAgoMs),
		Sessions: r.Sessions, Leases: r.Leases, Waiters: r.Waiters}, nil
}

// Ping asks the agent to answer; it keeps a heartbeat alive.
func (c *Client) Ping(ctx context.Context) error {
	return c.Call(ctx, "ping", nil, nil)
}

// PingAgent connects to the agent at path, pings it and hangs up: nil
// when an agent serves path, within ctx.
func PingAgent(ctx context.Context, path string) error {
	c, err := Dial(ctx, path)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Ping(ctx)
}

// Upgraded is what Upgrade reports: the process that serves the agent
// now, and its version.
type Upgraded struct {
	Version string
	PID     int
}

// Upgrade asks the agent to hand itself over to a new process of its
// binary, as installed now (admins only); it returns once the new process
// serves. The connection, its session and its leases go on, like every
// other client's. If the upgrade fails, the error has Code
// "upgrade_failed" and says why, and the agent serves on as it was.
func (c *Client) Upgrade(ctx context.Context) (*Upgraded, error) {
	var r wire.UpgradeResult
	if err := c.Call(ctx, "upgrade", nil, &r); err != nil {
		return nil, err
	}
	return &Upgraded{Version: r.Version, PID: r.PID}, nil
}

// Bye ends the session: every lease it holds is released before the
// agent answers, then the agent closes the connection.
func (c *Client) Bye(ctx context.Context) error {
	return c.Call(ctx, "bye", nil, nil)
}
