package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/lockagent/lockagent/backend"
)

// A campaign is a session's standing bid for leadership of a name. The
// leader is the holder of an ordinary exclusive lease on the name (its
// term), so every agent sharing the backend agrees on it, inspect shows
// it, and its token fences it. The campaign waits for the lease like any
// waiting acquire; when it gets it the session is told `elected`; when the
// lease ends (lost, released, broken) the campaign contends again on its
// own, until it is resigned or its scope ends.

// CampaignRequest is the arguments of campaign.
type CampaignRequest struct {
	Name  string
	Scope Scope         // of the campaign and of each term's lease
	TTL   time.Duration // of each term's lease; 0: the default
	Meta  string        // of each term's lease, shown to inspect
	// Started, if set, is called with the campaign's id with the agent's
	// lock held, before any event of the campaign can be sent. It must
	// not block.
	Started func(id string)
	// Conn, if set, is the connection asking: as for AcquireRequest.Conn.
	Conn Conn
}

// campaign is one campaign in progress. Its mutable fields are guarded by
// Agent.mu.
type campaign struct {
	id     string
	s      *Session
	req    AcquireRequest
	cancel context.CancelFunc
	done   chan struct{} // closed when its loop has returned
	ended  chan struct{} // a value when the current term has ended
	term   *lease        // the current term's lease, nil while contending
	// reserved: the campaign has a place in its uid's count (see
	// Agent.perUID) from its start until its first attempt takes the
	// place over, so that campaigns asked for at once cannot together
	// pass max_leases_per_uid. a.mu guards it.
	reserved bool
	// resumed is the attempt a campaign handed over by another process
	// (see Restore) goes on with, keeping its place in the queue; its
	// loop takes it, once.
	resumed *waiter
}

// unreserve gives up c's place in its uid's count, if it still has it.
// a.mu is held.
func (c *campaign) unreserve() {
	if c.reserved {
		c.reserved = false
		c.s.a.uncount(c.s.uid)
	}
}

// termEnded records that l, a term of c, has ended. a.mu is held.
func (c *campaign) termEnded(l *lease) {
	if c.term != l {
		return
	}
	c.term = nil
	select {
	case c.ended <- struct{}{}:
	default:
	}
}

// campaignBackoff bounds the pause after a failed attempt (the backend
// unreachable) before the campaign contends again.
const campaignBackoff = time.Second

// Campaign starts a campaign of the session for leadership of req.Name.
// It returns the campaign's id at once; `elected` events follow each time
// the campaign wins a term. A session campaigns at most once per name, and
// not for a name it holds or is acquiring; a campaign counts against the
// session's lease limit, and needs the access rules to allow the name in
// exclusive mode.
func (s *Session) Campaign(req CampaignRequest) (string, error) {
	a := s.a
	ar := AcquireRequest{Name: req.Name, Mode: backend.Exclusive, Scope: req.Scope, TTL: req.TTL, Wait: WaitForever, Meta: req.Meta}
	if err := a.validateAcquire(&ar); err != nil {
		return "", err
	}
	if err := a.allow(s.currentPeer(), req.Name, backend.Exclusive); err != nil {
		return "", err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	busy, replaces := s.pendingFor(req.Name)
	switch {
	case a.closing:
		return "", ErrShuttingDown
	case s.ended:
		return "", ErrSessionEnded
	case req.Conn != nil && req.Conn != s.conn:
		return "", context.Canceled
	case s.campaigns[req.Name] != nil:
		return "", invalidArg("the session already campaigns for %q", req.Name)
	case s.leases[req.Name] != nil:
		return "", &AlreadyHeldError{Lease: s.leases[req.Name].public()}
	case busy:
		return "", invalidArg("an acquire of %q is already in progress in this session", req.Name)
	case s.held()-replaces >= a.cfg.MaxLeasesPerSession:
		return "", fmt.Errorf("%w: %d leases per session", ErrLimitExceeded, a.cfg.MaxLeasesPerSession)
	case a.cfg.MaxLeasesPerUID > 0 && a.perUID[s.uid]-replaces >= a.cfg.MaxLeasesPerUID:
		// No term could be granted: say so now rather than contend in vain.
		return "", fmt.Errorf("%w: %d leases per uid", ErrLimitExceeded, a.cfg.MaxLeasesPerUID)
	}
	c, ctx := a.newCampaign(s, newID("c_"), ar)
	c.reserved = true
	a.perUID[s.uid]++
	if req.Started != nil {
		req.Started(c.id)
	}
	a.log.Debug("campaign started", "name", req.Name, "campaign", c.id, "session", s.id)
	a.wg.Add(1)
	go a.runCampaign(ctx, c)
	return c.id, nil
}

// newCampaign makes the campaign id of s for ar's name, and returns its
// context, which its loop runs in, and Resign ends. a.mu is held.
func (a *Agent) newCampaign(s *Session, id string, ar AcquireRequest) (*campaign, context.Context) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &campaign{id: id, s: s, req: ar, cancel: cancel, done: make(chan struct{}), ended: make(chan struct{}, 1)}
	// The elected event goes out with the grant, under a.mu, before any
	// event of the new lease.
	c.req.Granted = func(l Lease) {
		c.term = a.leases[l.ID]
		s.send(Event{Kind: EventElected, Campaign: c.id, Name: l.Name, Lease: l.ID, Token: l.Token})
	}
	if s.campaigns == nil {
		s.campaigns = make(map[string]*campaign)
	}
	s.campaigns[ar.Name] = c
	return c, ctx
}

// runCampaign contends for c's name, term after term, until ctx is done or
// the session or the agent ends.
func (a *Agent) runCampaign(ctx context.Context, c *campaign) {
	defer a.wg.Done()
	defer close(c.done)
	defer func() {
		a.mu.Lock()
		c.unreserve()
		a.mu.Unlock()
	}()
	// A campaign handed over by another process may lead already, or
	// go on with its attempt.
	a.mu.Lock()
	leading, resumed := c.term != nil, c.resumed
	c.resumed = nil
	a.mu.Unlock()
	if leading {
		select {
		case <-ctx.Done():
			return
		case <-c.ended:
		}
	}
	failing := false // the last attempt failed: say so once a streak
	for {
		// Each term is a new grant, under the rules of the moment: a
		// campaign the rules no longer allow (reloaded) stops contending
		// until they do again.
		peer := c.s.currentPeer()
		var err error
		if resumed != nil {
			_, err = a.run(ctx, c.req.Name, resumed, nil)
			resumed = nil
		} else if err = a.allow(peer, c.req.Name, backend.Exclusive); err == nil {
			_, err = c.s.acquire(ctx, c.req, c, time.Now())
		}
		switch {
		case ctx.Err() != nil, errors.Is(err, ErrShuttingDown), errors.Is(err, ErrSessionEnded):
			return
		case err != nil:
			// The backend failed, the agent's waiters are at their limit
			// or the rules deny it: the campaign never gives up on its
			// own.
			switch {
			case errors.Is(err, ErrPermissionDenied):
				a.log.Debug("campaign not allowed by the rules; waiting", "name", c.req.Name, "campaign", c.id)
			case !failing:
				a.cfg.PeerLog.Log(a.log, hclog.Warn, peer.UID, "campaign attempt failed; contending again until one succeeds",
					"name", c.req.Name, "campaign", c.id, "uid", peer.UID, "error", err)
			default:
				a.log.Debug("campaign attempt failed again", "name", c.req.Name, "campaign", c.id, "error", err)
			}
			failing = !errors.Is(err, ErrPermissionDenied)
			t := time.NewTimer(min(c.req.TTL/3, campaignBackoff))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		failing = false
		a.cfg.PeerLog.Log(a.log, hclog.Info, peer.UID, "elected", "name", c.req.Name, "campaign", c.id, "session", c.s.id, "uid", peer.UID)
		select {
		case <-ctx.Done():
			return
		case <-c.ended:
		}
	}
}

// Resign ends a campaign of the session: it stops contending and, if it
// leads, releases its term's lease, before Resign returns.
func (s *Session) Resign(ctx context.Context, id string) error {
	a := s.a
	a.mu.Lock()
	var c *campaign
	for _, o := range s.campaigns {
		if o.id == id {
			c = o
		}
	}
	if c == nil {
		a.mu.Unlock()
		return fmt.Errorf("%w: no campaign %q in this session", ErrNotHeld, id)
	}
	term := c.stop()
	if term != nil {
		a.dropLease(term)
	}
	a.mu.Unlock()
	<-c.done
	if term != nil {
		ctx, cancel := detached(ctx)
		defer cancel()
		a.releaseBackend(ctx, term)
	}
	return nil
}

// stop ends the campaign without waiting for its loop, and returns its
// current term's lease, if any, still in the agent's books. An acquire in
// flight sees the cancelled context under a.mu and hands nothing out.
// a.mu is held.
func (c *campaign) stop() *lease {
	if c.s.campaigns[c.req.Name] == c {
		delete(c.s.campaigns, c.req.Name)
	}
	c.unreserve()
	c.cancel()
	return c.term
}

// held is what the session's lease limit counts: held leases, acquires in
// progress, and campaigns between the two. a.mu is held.
func (s *Session) held() int {
	n := len(s.leases) + s.pending.len()
	for name := range s.campaigns {
		if s.leases[name] == nil && s.pending.get(name) == nil {
			n++
		}
	}
	return n
}

// CampaignInfo describes a campaign for list.
type CampaignInfo struct {
	ID     string
	Name   string
	Leader bool   // it holds a term now
	Lease  string // the term's lease, when Leader
}
