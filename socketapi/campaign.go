package socketapi

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/internal/wire"
)

// The ops of leader election: campaign and resign.

// campaign starts a campaign and answers with its id at once; the answer
// is queued before any elected event of the campaign.
func (c *conn) campaign(_ context.Context, id json.RawMessage, req *request) bool {
	var cr agent.CampaignRequest
	var err error
	cr.Name = nameArg(req)
	if cr.Scope, err = parseScope(req.Scope); err != nil {
		c.reply(id, nil, err)
		return true
	}
	if cr.TTL, err = ttlArg(req.TTLMs); err != nil {
		c.reply(id, nil, err)
		return true
	}
	if req.Meta != nil {
		cr.Meta = *req.Meta
	}
	cr.Started = func(campaign string) {
		c.out.queue(encodeOK(id, wire.CampaignResult{Campaign: campaign}))
	}
	cr.Conn = c // refused once a resume took the session
	if _, err := c.sess.Campaign(cr); err != nil {
		c.reply(id, nil, err)
		return true
	}
	c.out.enqueue(nil, true)
	return true
}

func (c *conn) resign(ctx context.Context, id json.RawMessage, req *request) bool {
	if req.Campaign == nil {
		c.reply(id, nil, fmt.Errorf("%w: campaign is required", agent.ErrNotHeld))
		return true
	}
	err := c.sess.Resign(ctx, *req.Campaign)
	c.reply(id, wire.ResignResult{Resigned: true}, err)
	return true
}
