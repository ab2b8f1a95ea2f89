package socketapi_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// listAll pages through list with limit and returns the session ids in
// the order given, and the pages' sizes.
func listAll(t *testing.T, r *raw, limit int) (ids []string, pages []int) {
	t.Helper()
	after := ""
	for {
		req := fmt.Sprintf(`{"op":"list","all":true,"limit":%d}`, limit)
		if after != "" {
			req = fmt.Sprintf(`{"op":"list","all":true,"limit":%d,"after":%q}`, limit, after)
		}
		m := r.ok(req)
		ss := m["sessions"].([]any)
		for _, s := range ss {
			ids = append(ids, s.(map[string]any)["session"].(string))
		}
		pages = append(pages, len(ss))
		next, more := m["next"].(string)
		if !more {
			require.Nil(t, m["next"])
			return ids, pages
		}
		require.Equal(t, ids[len(ids)-1], next, "next is the last session of the page")
		after = next
		require.Less(t, len(pages), 1000, "list pages without end")
	}
}

// TestListPages: list with a limit answers that many sessions at most, in
// order, and next says where the next page starts; paging through gives
// every session once. Without a limit, the answer has every session.
func TestListPages(t *testing.T) {
	ta := startAgent(t)
	for i := range 20 {
		r := ta.raw(t)
		r.ok(`{"op":"hello","client":"s` + fmt.Sprint(i) + `"}`)
		r.ok(fmt.Sprintf(`{"op":"acquire","name":"n/%d"}`, i))
	}
	r := ta.raw(t)
	whole := r.ok(`{"op":"list","all":true}`)
	require.Nil(t, whole["next"])
	var all []string
	for _, s := range whole["sessions"].([]any) {
		all = append(all, s.(map[string]any)["session"].(string))
	}
	require.Len(t, all, 21)
	require.True(t, slices.IsSorted(all))

	for _, limit := range []int{1, 3, 7, 21, 100} {
		ids, pages := listAll(t, r, limit)
		assert.Equal(t, all, ids, "limit %d", limit)
		for _, n := range pages[:len(pages)-1] {
			assert.Equal(t, limit, n, "limit %d: a page before the last is full", limit)
		}
	}
	m := r.ok(fmt.Sprintf(`{"op":"list","all":true,"after":%q}`, all[len(all)-1]))
	assert.Empty(t, m["sessions"])
	assert.Nil(t, m["next"])
	m = r.ok(fmt.Sprintf(`{"op":"list","all":true,"after":%q,"limit":5}`, all[9]))
	assert.Len(t, m["sessions"], 5)
	assert.Equal(t, all[14], m["next"])

	for _, bad := range []string{`0`, `-1`, `1.5`, `"3"`, `true`, `4294967296`} {
		r.fail(`{"op":"list","limit":`+bad+`}`, "invalid_argument")
	}
	r.fail(`{"op":"list","after":3}`, "invalid_argument")
}

// TestListLargeSessions: sessions whose leases fill several of the
// agent's chunks all come, in order, with every lease; a page with a limit
// stops at about 256 KiB and says where to go on.
func TestListLargeSessions(t *testing.T) {
	ta := startAgent(t)
	meta := strings.Repeat("m", 256)
	const sessions, leases = 12, 500
	for i := range sessions {
		r := ta.raw(t)
		r.ok(`{"op":"hello"}`)
		for j := 0; j < leases; j += 50 {
			for k := range 50 {
				r.send(fmt.Sprintf(`{"op":"acquire","name":"s%d/%d","meta":%q}`, i, j+k, meta))
			}
			for range 50 {
				require.Equal(t, true, r.recv()["acquired"])
			}
		}
	}
	r := ta.raw(t)
	m := r.ok(`{"op":"list"}`)
	ss := m["sessions"].([]any)
	require.Len(t, ss, sessions+1)
	n := 0
	for _, s := range ss {
		n += len(s.(map[string]any)["leases"].([]any))
	}
	assert.Equal(t, sessions*leases, n)

	r.send(`{"op":"list","limit":1000}`)
	r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := r.r.ReadBytes('\n')
	require.NoError(t, err)
	assert.Less(t, len(line), 256<<10+leases*400, "a page stops after about 256 KiB")
	ids, _ := listAll(t, r, 1000)
	assert.Len(t, ids, sessions+1)
}

// TestListBeyondTheUIDsRoom: a list answer larger than the output room of
// its uid is refused with limit_exceeded; the connection stays, and pages
// with a limit still list everything.
func TestListBeyondTheUIDsRoom(t *testing.T) {
	ta := startAgent(t, func(o *options) { o.Server.MaxOutputBytesPerUID = 64 << 10 })
	for i := range 4 {
		r := ta.raw(t)
		r.ok(`{"op":"hello"}`)
		for j := range 100 {
			r.ok(fmt.Sprintf(`{"op":"acquire","name":"s%d/%d","meta":%q}`, i, j, strings.Repeat("m", 200)))
		}
	}
	r := ta.raw(t)
	m := r.fail(`{"id":"big","op":"list"}`, "limit_exceeded")
	assert.Equal(t, "big", m["id"])
	assert.Contains(t, m["error"].(map[string]any)["message"], "ask for less")
	r.ok(`{"op":"ping"}`)
	ids, _ := listAll(t, r, 1)
	assert.Len(t, ids, 5)
}
