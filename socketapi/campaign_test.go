package socketapi_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
)

// recvEvent reads lines until an event, requiring it to be of kind.
func (r *raw) recvEvent(kind string) map[string]any {
	r.t.Helper()
	m := r.recv()
	require.Equal(r.t, kind, m["event"], "line %v", m)
	return m
}

// TestCampaignWire: the answer comes first, then elected; a second
// candidate waits; resign hands leadership on at once, with a larger token.
func TestCampaignWire(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	ca := a.ok(`{"id":1,"op":"campaign","name":"lead/1","meta":"a"}`)["campaign"].(string)
	require.NotEmpty(t, ca)
	ea := a.recvEvent("elected")
	assert.Equal(t, ca, ea["campaign"])
	assert.Equal(t, "lead/1", ea["name"])
	require.NotEmpty(t, ea["lease"])
	require.Positive(t, ea["token"])

	cb := b.ok(`{"id":1,"op":"campaign","name":"lead/1","meta":"b"}`)["campaign"].(string)
	in := b.ok(`{"id":2,"op":"inspect","name":"lead/1"}`)
	holders := in["holders"].([]any)
	require.Len(t, holders, 1)
	assert.Equal(t, "a", holders[0].(map[string]any)["meta"], "inspect shows the leader")
	assert.Equal(t, ea["token"], holders[0].(map[string]any)["token"])

	assert.Equal(t, true, a.ok(fmt.Sprintf(`{"id":2,"op":"resign","campaign":%q}`, ca))["resigned"])
	eb := b.recvEvent("elected")
	assert.Equal(t, cb, eb["campaign"])
	assert.Greater(t, eb["token"].(float64), ea["token"].(float64))

	a.fail(fmt.Sprintf(`{"id":3,"op":"resign","campaign":%q}`, ca), "not_held")
	a.fail(`{"id":4,"op":"resign","campaign":"c_nope"}`, "not_held")
	a.fail(`{"id":5,"op":"resign"}`, "not_held")
	a.fail(`{"id":6,"op":"resign","campaign":7}`, "invalid_argument")
}

// TestCampaignContendsAgain: a term that ends by release or break is
// followed by another, without the client asking.
func TestCampaignContendsAgain(t *testing.T) {
	ta := startAgent(t)
	a, admin := ta.raw(t), ta.raw(t)
	c := a.ok(`{"id":1,"op":"campaign","name":"lead/2","ttl_ms":2000}`)["campaign"]
	e1 := a.recvEvent("elected")

	a.ok(fmt.Sprintf(`{"id":2,"op":"release","lease":%q}`, e1["lease"]))
	e2 := a.recvEvent("elected")
	assert.NotEqual(t, e1["lease"], e2["lease"])
	assert.Greater(t, e2["token"].(float64), e1["token"].(float64))

	admin.ok(`{"id":1,"op":"break","name":"lead/2"}`)
	lost := a.recvEvent("lost")
	assert.Equal(t, e2["lease"], lost["lease"])
	assert.Equal(t, c, lost["campaign"], "a term's lost event names its campaign")
	assert.Equal(t, "broken", lost["reason"])
	e3 := a.recvEvent("elected")
	assert.Greater(t, e3["token"].(float64), e2["token"].(float64))

	var cs []any
	for _, s := range a.ok(`{"id":3,"op":"list"}`)["sessions"].([]any) {
		cs = append(cs, s.(map[string]any)["campaigns"].([]any)...)
	}
	require.Len(t, cs, 1)
	assert.Equal(t, c, cs[0].(map[string]any)["campaign"])
	assert.Equal(t, true, cs[0].(map[string]any)["leader"])
	assert.Equal(t, e3["lease"], cs[0].(map[string]any)["lease"])
}

func TestCampaignErrors(t *testing.T) {
	ta := startAgent(t)
	a := ta.raw(t)
	a.ok(`{"id":1,"op":"acquire","name":"held"}`)
	a.fail(`{"id":2,"op":"campaign","name":"held"}`, "already_held")
	a.ok(`{"id":3,"op":"campaign","name":"c"}`)
	a.recvEvent("elected")
	a.fail(`{"id":4,"op":"campaign","name":"c"}`, "invalid_argument")
	a.fail(`{"id":5,"op":"acquire","name":"c"}`, "already_held")
	a.fail(`{"id":6,"op":"campaign"}`, "invalid_name")
	a.fail(`{"id":7,"op":"campaign","name":"bad name"}`, "invalid_name")
	a.fail(`{"id":8,"op":"campaign","name":"t","ttl_ms":10}`, "invalid_argument")
	a.fail(`{"id":9,"op":"campaign","name":"t","ttl_ms":0}`, "invalid_argument")
	a.fail(`{"id":10,"op":"campaign","name":"t","scope":"forever"}`, "invalid_argument")
	a.fail(`{"id":11,"op":"campaign","name":"t","ttl_ms":"5"}`, "invalid_argument")

	// While another session leads, this one's campaign waits, and an
	// acquire of the name it campaigns for is refused.
	b := ta.raw(t)
	b.ok(`{"id":1,"op":"campaign","name":"c"}`)
	resp := b.fail(`{"id":2,"op":"acquire","name":"c","wait_ms":-1}`, "invalid_argument")
	assert.Contains(t, resp["error"].(map[string]any)["message"], "campaigns for", "why, not an acquire in progress")
}

// TestCampaignEndsWithItsScope: a connection's campaign ends with it and
// the next candidate is elected; a session-scoped one keeps contending
// while detached, and its events wait for the resume.
func TestCampaignEndsWithItsScope(t *testing.T) {
	ta := startAgent(t)
	a, b := ta.raw(t), ta.raw(t)
	a.ok(`{"id":1,"op":"campaign","name":"s/1"}`)
	a.recvEvent("elected")
	h := b.ok(`{"id":1,"op":"hello","session_ttl_ms":60000}`)
	cb := b.ok(`{"id":2,"op":"campaign","name":"s/1","scope":"session"}`)["campaign"]
	b.nc.Close()
	watcher := ta.raw(t)
	require.Eventually(t, func() bool {
		for _, s := range watcher.ok(`{"op":"list","all":true}`)["sessions"].([]any) {
			if s.(map[string]any)["session"] == h["session"] {
				return s.(map[string]any)["attached"] == false
			}
		}
		return false
	}, 5*time.Second, time.Millisecond)
	a.nc.Close()

	// b's campaign is elected while b has no connection.
	require.Eventually(t, func() bool {
		return len(watcher.ok(`{"op":"inspect","name":"s/1"}`)["holders"].([]any)) == 1
	}, 5*time.Second, time.Millisecond)
	b2 := ta.raw(t)
	b2.ok(fmt.Sprintf(`{"id":1,"op":"hello","resume":{"session":%q,"token":%q}}`, h["session"], h["resume_token"]))
	e := b2.recvEvent("elected")
	assert.Equal(t, cb, e["campaign"])
	assert.Equal(t, true, b2.ok(fmt.Sprintf(`{"id":2,"op":"check","lease":%q}`, e["lease"]))["held"])
}

// TestCampaignClient: the Go client's terms, their ends and resign.
func TestCampaignClient(t *testing.T) {
	ta := startAgent(t)
	ctx := context.Background()
	a := ta.client(t, map[string]any{"client": "a"})
	b := ta.client(t, map[string]any{"client": "b"})
	ca, err := a.Campaign(ctx, "cl/1", client.CampaignOptions{TTL: 2 * time.Second, Meta: "a"})
	require.NoError(t, err)
	ta1 := nextTerm(t, ca)
	cb, err := b.Campaign(ctx, "cl/1", client.CampaignOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, ca.ID(), cb.ID())
	waitQueued(t, a, "cl/1", 1)

	// A plain release ends the term; the campaign wins the next one.
	require.NoError(t, a.Call(ctx, "release", map[string]any{"lease": ta1.Lease}, nil))
	tb1 := nextTerm(t, cb)
	assert.Greater(t, tb1.Token, ta1.Token)

	// A break ends b's term with a lost event; a is elected next.
	waitQueued(t, a, "cl/1", 1)
	require.NoError(t, a.Call(ctx, "break", map[string]any{"name": "cl/1"}, nil))
	<-tb1.Done()
	assert.Equal(t, "broken", tb1.Reason())
	ta2 := nextTerm(t, ca)
	assert.Greater(t, ta2.Token, tb1.Token)
	assert.Equal(t, "released", ta1.Reason(), "a's first term ended with its release")

	waitQueued(t, a, "cl/1", 1)
	require.NoError(t, ca.Resign(ctx))
	assert.Equal(t, "resigned", ta2.Reason())
	_, open := <-ca.Elected()
	assert.False(t, open, "Elected is closed after resign")
	tb2 := nextTerm(t, cb)
	assert.Greater(t, tb2.Token, ta2.Token)

	// The connection's end ends the campaign.
	b.Close()
	assert.Equal(t, "connection closed", tb2.Reason())
	_, open = <-cb.Elected()
	assert.False(t, open)

	// Other events still reach Events.
	l := acquire(t, a, map[string]any{"name": "other"})
	require.NoError(t, a.Call(ctx, "break", map[string]any{"name": "other"}, nil))
	ev := nextEvent(t, a)
	assert.Equal(t, "lost", ev.Event)
	assert.Equal(t, l.Lease, ev.Lease)
}

func nextTerm(t *testing.T, cp *client.Campaign) *client.Term {
	t.Helper()
	select {
	case term, ok := <-cp.Elected():
		require.True(t, ok, "the campaign ended")
		return term
	case <-time.After(5 * time.Second):
		t.Fatal("not elected within 5s")
	}
	return nil
}

// waitQueued waits until n waiters queue for name.
func waitQueued(t *testing.T, c *client.Client, name string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var r struct {
			Queued int `json:"queued"`
		}
		require.NoError(t, c.Call(context.Background(), "inspect", map[string]any{"name": name}, &r))
		return r.Queued == n
	}, 5*time.Second, time.Millisecond, "%d waiters queued for %s", n, name)
}
