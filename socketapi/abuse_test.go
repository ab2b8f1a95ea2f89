package socketapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestA7_ProtocolAbuse: every kind of bad input gets a clear error (or a
// close), the agent keeps serving, and nothing is leaked.
func TestA7_ProtocolAbuse(t *testing.T) {
	ta := startAgent(t)
	r := ta.raw(t)
	r.ok(`{"op":"acquire","name":"keep"}`)

	for _, tc := range []struct{ line, code string }{
		{"\xff\xfe{}", "bad_request"},
		{`{"op":"ping","name":"` + "\xc3\x28" + `"}`, "bad_request"},
		{`[1,2,3]`, "bad_request"},
		{`"just a string"`, "bad_request"},
		{`42`, "bad_request"},
		{`null`, "bad_request"},
		{`{"op":"ping"`, "bad_request"},
		{`{"op":"ping"} {"op":"ping"}`, "bad_request"},
		{`{"op":"acquire","op":"ping"}`, "bad_request"},
		{`{"op":"acquire","name":"a","name":"b"}`, "bad_request"},
		{`{"op":"acquire","n\u0061me":"a","name":"b"}`, "bad_request"},
		// Decoders make a lone surrogate U+FFFD: two names, one lock.
		{`{"op":"acquire","name":"sur\ud800x"}`, "bad_request"},
		{`{"op":"acquire","name":"x","meta":"\udfff"}`, "bad_request"},
		{`{"op":"acquire","name":"x","wait_ms":-1,"id":{"nested":true}}`, "bad_request"},
		{`{"op":["ping"]}`, "invalid_argument"},
		{`{"op":"ping","id":1e2}`, "bad_request"},
		{`{"op":"PING"}`, "unknown_op"},
		{`{"op":"elect","name":"x"}`, "unknown_op"},
	} {
		m := r.call(tc.line)
		requireCode(t, m, tc.code)
	}
	// Nested duplicates are the value's business, not the request's.
	r.ok(`{"op":"ping","x":{"a":1,"a":2}}`)

	// A partial line is completed by a later write (whether the agent
	// reads the halves apart is up to the scheduler; TestLineReaderPieces
	// reads a line in pieces for sure).
	_, err := r.nc.Write([]byte(`{"id":"part","op":`))
	require.NoError(t, err)
	_, err = r.nc.Write([]byte(`"ping"}` + "\n"))
	require.NoError(t, err)
	assert.Equal(t, "part", r.recv()["id"])

	// Pipelined requests in one write are all answered.
	var b strings.Builder
	for i := 0; i < 100; i++ {
		fmt.Fprintf(&b, `{"id":%d,"op":"ping"}`+"\r\n", i)
	}
	_, err = r.nc.Write([]byte(b.String()))
	require.NoError(t, err)
	seen := map[float64]bool{}
	for i := 0; i < 100; i++ {
		seen[r.recv()["id"].(float64)] = true
	}
	assert.Len(t, seen, 100)

	// The lock held before all that is still held, and only by us.
	assert.Len(t, r.ok(`{"op":"list"}`)["sessions"].([]any)[0].(map[string]any)["leases"], 1)
	assert.Equal(t, false, ta.raw(t).ok(`{"op":"acquire","name":"keep"}`)["acquired"])
}
