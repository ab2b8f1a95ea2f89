package client

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/lockagent/lockagent/internal/wire"
)

// CampaignOptions are the arguments of a campaign. Zero values take the
// agent's defaults.
type CampaignOptions struct {
	Scope string        // "connection" (default) or "session"
	TTL   time.Duration // of each term's lease
	Meta  string        // shown by inspect while the campaign leads
}

// Campaign is a campaign for leadership of a name, started with
// Client.Campaign. The agent contends on its own, term after term, until
// Resign or the end of the connection. Its events go to Elected, not to
// the client's Events.
type Campaign struct {
	c       *Client
	id      string // set on the reading goroutine, under c.mu
	name    string
	elected chan *Term

	stop     chan struct{} // closed when the campaign ends: no more sends
	stopOnce sync.Once
	sendMu   sync.Mutex // held by the one sender, and to close elected
	closed   bool       // elected is closed; guarded by sendMu

	mu   sync.Mutex
	term *Term // the current term, nil between terms
}

// Term is one term of leadership: from its `elected` event until its lease
// is lost, the campaign is resigned or the connection ends.
type Term struct {
	Lease string // the term's lease id, for release or check
	Token uint64 // its fencing token: larger than every earlier leader's

	done   chan struct{}
	once   sync.Once
	reason string
}

// Done is closed when the term has ended.
func (t *Term) Done() <-chan struct{} { return t.done }

// Reason is why the term ended, once Done is closed: a lost event's reason
// (expired, taken_over, broken, backend_unavailable), "released" (a newer
// term began without a lost event: its lease was released), "resigned" or
// "connection closed".
func (t *Term) Reason() string {
	<-t.done
	return t.reason
}

func (t *Term) end(reason string) {
	t.once.Do(func() {
		t.reason = reason
		close(t.done)
	})
}

// Campaign starts a campaign for leadership of name. Read Elected: each
// term arrives there when the campaign wins it, and the client stops
// reading from the agent while a term waits to be received.
func (c *Client) Campaign(ctx context.Context, name string, opts CampaignOptions) (*Campaign, error) {
	cp := &Campaign{c: c, name: name, elected: make(chan *Term, 16), stop: make(chan struct{})}
	args := map[string]any{"name": name}
	if opts.Scope != "" {
		args["scope"] = opts.Scope
	}
	if opts.TTL != 0 {
		args["ttl_ms"] = opts.TTL.Milliseconds()
	}
	if opts.Meta != "" {
		args["meta"] = opts.Meta
	}
	// The campaign is registered before the line after its answer is
	// read: its first elected event may be that line.
	register := func(body []byte) {
		id := startedCampaign(body)
		if id == "" {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		cp.id = id
		if c.campaigns == nil {
			c.campaigns = make(map[string]*Campaign)
		}
		c.campaigns[cp.id] = cp
	}
	err := c.do(ctx, "campaign", args, nil, pendingCall{hook: register,
		// Given up before the answer: a campaign the agent started all
		// the same is resigned, or it would hold the name for as long
		// as the connection lives.
		orphan: func(body []byte) {
			if id := startedCampaign(body); id != "" {
				c.post("resign", map[string]any{"campaign": id})
			}
		}})
	if err != nil {
		// Abandoned (ctx) after the agent started it: its events go to
		// Events from now on.
		c.mu.Lock()
		if cp.id != "" && c.campaigns[cp.id] == cp {
			delete(c.campaigns, cp.id)
		}
		c.mu.Unlock()
		return nil, err
	}
	return cp, nil
}

// startedCampaign returns the id of the campaign an answer started, or "".
func startedCampaign(body []byte) string {
	var r struct {
		OK bool `json:"ok"`
		wire.CampaignResult
	}
	if json.Unmarshal(body, &r) != nil || !r.OK {
		return ""
	}
	return r.Campaign
}

// ID is the campaign's id.
func (cp *Campaign) ID() string {
	cp.c.mu.Lock()
	defer cp.c.mu.Unlock()
	return cp.id
}

// Name is the name the campaign contends for.
func (cp *Campaign) Name() string { return cp.name }

// Elected delivers each term the campaign wins, in order. It is closed
// when the campaign ends: resigned, or the connection gone.
func (cp *Campaign) Elected() <-chan *Term { return cp.elected }

// Resign stops the campaign; the agent releases the leadership lease if
// it holds one. The current term ends with reason "resigned".
func (cp *Campaign) Resign(ctx context.Context) error {
	c := cp.c
	resigned := func([]byte) {
		c.mu.Lock()
		if c.campaigns[cp.id] == cp {
			delete(c.campaigns, cp.id)
		}
		c.mu.Unlock()
		cp.finish("resigned")
	}
	// Given up before the answer, the resign is carried out all the same:
	// its answer still ends the campaign here (not the connection's end,
	// which ends it on its own).
	orphan := func(body []byte) {
		if body != nil {
			resigned(body)
		}
	}
	return c.do(ctx, "resign", map[string]any{"campaign": cp.ID()}, nil, pendingCall{hook: resigned, orphan: orphan})
}

// deliver applies one event of the campaign. It runs on the reading
// goroutine, and blocks while Elected is full, until closing is closed or
// the campaign ends.
func (cp *Campaign) deliver(ev Event, closing <-chan struct{}) {
	switch ev.Event {
	case "elected":
		t := &Term{Lease: ev.Lease, Token: ev.Token, done: make(chan struct{})}
		cp.mu.Lock()
		if cp.term != nil {
			cp.term.end("released")
		}
		cp.term = t
		cp.mu.Unlock()
		cp.sendMu.Lock()
		defer cp.sendMu.Unlock()
		if cp.closed {
			return
		}
		select {
		case cp.elected <- t:
		case <-cp.stop:
		case <-closing:
		}
	case "lost":
		cp.mu.Lock()
		defer cp.mu.Unlock()
		if cp.term != nil && cp.term.Lease == ev.Lease {
			cp.term.end(ev.Reason)
			cp.term = nil
		}
	}
}

// finish ends the campaign: its current term ends for reason, and
// Elected is closed.
func (cp *Campaign) finish(reason string) {
	cp.stopOnce.Do(func() { close(cp.stop) })
	cp.mu.Lock()
	if cp.term != nil {
		cp.term.end(reason)
		cp.term = nil
	}
	cp.mu.Unlock()
	cp.sendMu.Lock()
	defer cp.sendMu.Unlock()
	if !cp.closed {
		cp.closed = true
		close(cp.elected)
	}
}
