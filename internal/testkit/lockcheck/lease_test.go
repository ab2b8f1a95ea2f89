package lockcheck

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func acq(name string, client, lease int) LeaseInput {
	return LeaseInput{Kind: LeaseAcquire, Name: name, Client: client, Lease: lease}
}

func rel(name string, client, lease int) LeaseInput {
	return LeaseInput{Kind: LeaseRelease, Name: name, Client: client, Lease: lease}
}

func end(name string, client, lease int) LeaseInput {
	return LeaseInput{Kind: LeaseEnd, Name: name, Client: client, Lease: lease}
}

func TestLeaseAcceptsEndedLeases(t *testing.T) {
	var h LeaseHistory
	h.Add(0, 1, acq("a", 0, 1), LeaseOutput{true, 10})
	h.Add(3, 4, end("a", 0, 1), LeaseOutput{})            // lost event received
	h.Add(2, 6, acq("a", 1, 2), LeaseOutput{true, 11})    // granted around it
	h.Add(7, 8, rel("a", 0, 1), LeaseOutput{OK: false})   // the lost lease is not held
	h.Add(9, 10, rel("a", 1, 2), LeaseOutput{OK: true})   // the new one is
	h.Add(11, 12, acq("a", 2, 3), LeaseOutput{true, 12})  // then another client
	h.Add(12, Infinity, end("a", 2, 3), LeaseOutput{})    // whose agent was killed
	h.Add(20, 21, acq("a", 3, 4), LeaseOutput{true, 13})  // so the name is free again
	h.Add(1, 2, acq("a", 5, 5), LeaseOutput{OK: false})   // a denial is always possible
	h.Add(30, 31, acq("b", 4, 6), LeaseOutput{true, 100}) // another name
	r, err := CheckLease(&h, t.TempDir())
	require.NoError(t, err)
	assert.True(t, r.OK)
	assert.Equal(t, 10, r.Operations)
	assert.Empty(t, r.BadNames)
}

// The lease model still has the strict model's teeth: without an End or a
// release of the first lease, a second grant is a violation.
func TestLeaseRejectsViolations(t *testing.T) {
	for name, ops := range map[string][]struct {
		call, ret int64
		in        LeaseInput
		out       LeaseOutput
	}{
		"two holders": {
			{0, 1, acq("a", 0, 1), LeaseOutput{true, 10}},
			{2, 3, acq("a", 1, 2), LeaseOutput{true, 11}},
		},
		"end after the next grant": {
			{0, 1, acq("a", 0, 1), LeaseOutput{true, 10}},
			{2, 3, acq("a", 1, 2), LeaseOutput{true, 11}},
			{4, 5, end("a", 0, 1), LeaseOutput{}},
		},
		"token back": {
			{0, 1, acq("a", 0, 1), LeaseOutput{true, 10}},
			{2, 3, end("a", 0, 1), LeaseOutput{}},
			{4, 5, acq("a", 1, 2), LeaseOutput{true, 9}},
		},
		"release after the end": {
			{0, 1, acq("a", 0, 1), LeaseOutput{true, 10}},
			{2, 3, end("a", 0, 1), LeaseOutput{}},
			{4, 5, rel("a", 0, 1), LeaseOutput{OK: true}},
		},
		"held lease reported not held": {
			{0, 1, acq("a", 0, 1), LeaseOutput{true, 10}},
			{2, 3, rel("a", 0, 1), LeaseOutput{OK: false}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var h LeaseHistory
			for _, o := range ops {
				h.Add(o.call, o.ret, o.in, o.out)
			}
			h.Add(0, 1, acq("other", 9, 99), LeaseOutput{true, 1})
			h.Annotate("faults", 0, 1, 2, "a fault")
			r, err := CheckLease(&h, t.TempDir())
			require.NoError(t, err)
			assert.False(t, r.OK)
			assert.Equal(t, []string{"a"}, r.BadNames)
			assert.FileExists(t, r.Visualization)
		})
	}
}

func TestLeaseHistoryJSON(t *testing.T) {
	var h LeaseHistory
	h.Add(0, 1, acq("a", 0, 1), LeaseOutput{true, 10})
	h.Add(1, Infinity, end("a", 0, 1), LeaseOutput{})
	h.Add(2, 3, acq("a", 1, 2), LeaseOutput{true, 9})
	path := filepath.Join(t.TempDir(), "h.jsonl")
	require.NoError(t, h.WriteJSON(path))
	back, err := ReadLeaseHistory(path)
	require.NoError(t, err)
	assert.Equal(t, h.ops, back.ops)
	r, err := CheckLease(back, t.TempDir())
	require.NoError(t, err)
	assert.False(t, r.OK)
	require.Len(t, r.Why, 1)
	assert.Contains(t, r.Why[0], "acquire(a) #2 -> token 9")
}

func TestVisualizeLease(t *testing.T) {
	var h LeaseHistory
	h.Add(0, 1, acq("a", 0, 1), LeaseOutput{true, 10})
	h.Add(1, Infinity, end("a", 0, 1), LeaseOutput{})
	path, err := VisualizeLease(&h, t.TempDir())
	require.NoError(t, err)
	assert.FileExists(t, path)
}

func TestCheckTokens(t *testing.T) {
	ok := []Grant{
		{Name: "a", Lease: 1, Token: 10, Call: 0, Return: 5},
		{Name: "a", Lease: 2, Token: 9, Call: 1, Return: 6}, // concurrent with #1: either order
		{Name: "a", Lease: 3, Token: 11, Call: 7, Return: 8},
		{Name: "b", Lease: 4, Token: 1, Call: 9, Return: 10}, // names are independent
	}
	assert.Empty(t, CheckTokens(ok))

	back := append(ok, Grant{Name: "a", Lease: 5, Token: 11, Call: 9, Return: 10})
	vs := CheckTokens(back)
	require.Len(t, vs, 2, "%v", vs) // a duplicate, and not above #3
	for _, v := range vs {
		assert.Equal(t, "tokens", v.Check)
		assert.Equal(t, "a", v.Name)
	}
}

func TestCheckLostBeforeGrant(t *testing.T) {
	ms := int64(time.Millisecond)
	gs := []Grant{
		{Name: "a", Lease: 1, Agent: 0, Token: 10, Call: 0, Return: 1 * ms, Ended: 5 * ms, How: "lost"},
		{Name: "a", Lease: 2, Agent: 1, Token: 11, Call: 2 * ms, Return: 6 * ms, Ended: 8 * ms, How: "release"},
		{Name: "a", Lease: 3, Agent: 2, Token: 12, Call: 7 * ms, Return: 9 * ms, Ended: Infinity},
	}
	assert.Empty(t, CheckLostBeforeGrant(gs, 0))

	// #2 ends 3 ms after #3 was granted: a violation, unless the slack
	// covers it.
	gs[1].Ended = 12 * ms
	vs := CheckLostBeforeGrant(gs, 0)
	require.Len(t, vs, 1)
	assert.Contains(t, vs[0].Detail, "lease #3")
	assert.Contains(t, vs[0].Detail, "lease #2")
	assert.Empty(t, CheckLostBeforeGrant(gs, 5*time.Millisecond))

	// A lease never ended blocks every later grant.
	gs[0].Ended = Infinity
	assert.Len(t, CheckLostBeforeGrant(gs, 5*time.Millisecond), 2)
}
