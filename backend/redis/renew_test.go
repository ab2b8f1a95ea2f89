package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/lockagent/lockagent/backend"
)

// TestRenewCommand: a renewal call's command, whose keys are slices of
// one string and whose strings and numbers go as pointers into a scratch
// used again, holds each lease's keys (as holderKey builds them, braces in
// names too) and arguments in the order of the scripts.
func TestRenewCommand(t *testing.T) {
	b := &Backend{prefix: "pfx"}
	reqs := []backend.RenewRequest{
		{LeaseKey: backend.LeaseKey{Name: "a", LeaseID: "id-a", Mode: backend.Exclusive}, TTL: 15 * time.Second},
		{LeaseKey: backend.LeaseKey{Name: "b{c}", LeaseID: "id-b", Mode: backend.Shared}, TTL: 2500 * time.Millisecond},
		{LeaseKey: backend.LeaseKey{Name: "d", LeaseID: "id-d", Mode: backend.Exclusive}, TTL: time.Second},
	}
	values := func(cmd []any) []any {
		out := make([]any, len(cmd))
		for i, v := range cmd {
			switch v := v.(type) {
			case *string:
				out[i] = *v
			case *int64:
				out[i] = *v
			default:
				out[i] = v
			}
		}
		return out
	}
	xb := b.holderKey("b{c}")
	sc := new(renewScratch)
	// Both commands of one pipeline, built in the same scratch, hold
	// their own arguments.
	held := b.renewCommand(sc, reqs, renewCall{held: true, idx: []int{0, 2}}, false)
	other := b.renewCommand(sc, reqs, renewCall{idx: []int{0, 1}}, true)
	assert.Equal(t, []any{
		"evalsha", renewHeldScript.Hash(), 2,
		"pfx:lk:{a}", "pfx:lk:{d}",
		"id-a", int64(15000), "id-d", int64(1000),
	}, values(held))
	assert.Equal(t, []any{
		"eval", renewSource, 6,
		"pfx:lk:{a}", "pfx:lk:{a}:r", "pfx:lk:{a}:t", xb, xb + ":r", xb + ":t",
		"id-a", "x", int64(15000), "id-b", "s", int64(2500),
	}, values(other))
	sc.reset()
	assert.Empty(t, sc.args)
	assert.Empty(t, sc.keys)
	assert.Empty(t, sc.ttls)
	assert.Nil(t, sc.args[:cap(sc.args)][0], "a used scratch keeps no pointers")
}

// TestHeldResults: a renewHeldScript call's reply names the leases it did
// not renew, which go on to renewScript; the others are renewed. A place
// out of the call fails every lease of the call.
func TestHeldResults(t *testing.T) {
	b := &Backend{prefix: "pfx"}
	reqs := []backend.RenewRequest{
		{LeaseKey: backend.LeaseKey{Name: "a", LeaseID: "id-a"}}, {LeaseKey: backend.LeaseKey{Name: "b", LeaseID: "id-b"}},
		{LeaseKey: backend.LeaseKey{Name: "c", LeaseID: "id-c"}},
	}
	call := renewCall{held: true, idx: []int{0, 2}}
	errs := []error{errors.New("before"), errors.New("untouched"), errors.New("before")}
	missed := b.heldResults(reqs, call, []int64{2}, errs, []int{1})
	assert.Equal(t, []int{1, 2}, missed, "the second lease of the call, index 2 of the chunk")
	assert.NoError(t, errs[0])
	assert.EqualError(t, errs[1], "untouched", "a lease of another call")

	for _, bad := range [][]int64{{0}, {3}, {-1}} {
		errs := make([]error, 3)
		missed := b.heldResults(reqs, call, bad, errs, nil)
		assert.Empty(t, missed, "%v", bad)
		assert.ErrorIs(t, errs[0], backend.ErrUnavailable, "%v", bad)
		assert.ErrorIs(t, errs[2], backend.ErrUnavailable, "%v", bad)
		assert.NoError(t, errs[1], "%v", bad)
	}
}
