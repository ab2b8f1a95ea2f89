package socketapi

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/lockagent/lockagent/agent"
)

// The ops of leader election: campaign and resign.

type campaignResult struct {
	Campaign string `json:"campaign"`
}

type resignResult struct {
	Resigned bool `json:"resigned"`
}

// campaignJSON is a campaign in a list answer.
type campaignJSON struct {
	Campaign string `json:"campaign"`
	Name     string `json:"name"`
	Leader   bool   `json:"leader"`
	Lease    string `json:"lease,omitempty"`
}

func toCampaigns(cs []agent.CampaignInfo) []campaignJSON {
	out := make([]campaignJSON, len(cs))
	for i, c := range cs {
		out[i] = campaignJSON{c.ID, c.Name, c.Leader, c.Lease}
	}
	return out
}

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
		c.out.queue(encodeOK(id, campaignResult{Campaign: campaign}))
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
	c.reply(id, resignResult{Resigned: true}, err)
	return true
}
