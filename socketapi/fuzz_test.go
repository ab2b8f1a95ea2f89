package socketapi_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"testing"
	"time"
)

// FuzzLine (F1) sends arbitrary bytes as request lines to a live agent.
// Whatever they are, the agent must not panic, must answer with JSON
// objects only (responses or events), must keep answering on the same
// connection (a ping after the fuzzed input gets its pong) unless it closed
// it, and must not answer more lines than it was sent.
func FuzzLine(f *testing.F) {
	for _, seed := range []string{
		`{"id":1,"op":"hello","version":1,"client":"fuzz","session_ttl_ms":100,"heartbeat_ms":0}`,
		`{"id":2,"op":"acquire","name":"orders/42","mode":"shared","limit":2,"scope":"session","ttl_ms":1000,"wait_ms":0,"meta":"m"}`,
		`{"id":3,"op":"acquire","name":"x","wait_ms":10}`,
		`{"id":4,"op":"release","lease":"l_x"}`,
		`{"id":5,"op":"check","lease":"l_x"}`,
		`{"id":6,"op":"inspect","name":"x"}`,
		`{"id":7,"op":"list","all":true}`,
		`{"id":8,"op":"break","name":"x"}`,
		`{"id":9,"op":"cancel","target":3}`,
		`{"id":"p","op":"ping"}`,
		`{"id":"r","op":"hello","resume":{"session":"s_x","token":"t"}}`,
		`{"op":"acquire","name":"a","name":"b"}`,
		`{"op":"acquire","name":"a","ttl_ms":1e400}`,
		"{\"op\":\"ping\"}\r",
		"\xff\xfe",
		`[]`,
		`{"id":{},"op":"ping"}`,
		`{"id":99999999999999999999999,"op":"frob"}`,
		"",
		`{"op":"bye"}`,
	} {
		f.Add([]byte(seed))
	}
	ta := startAgent(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		nc, err := net.Dial("unix", ta.path)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		sent := bytes.Count(in, []byte{'\n'}) + 2
		if _, err := nc.Write(append(append(in, '\n'), `{"id":"sentinel","op":"ping"}`+"\n"...)); err != nil {
			return // the agent closed the connection (bye, a line too long)
		}
		sc := bufio.NewScanner(nc)
		sc.Buffer(make([]byte, 4096), 1<<20)
		lines := 0
		for sc.Scan() {
			lines++
			if lines > sent+64 { // events of a resumed session may come too
				t.Fatalf("%d lines answered to %d sent", lines, sent)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("answer is not a JSON object: %q", sc.Bytes())
			}
			_, isEvent := m["event"]
			_, isResponse := m["ok"]
			if isEvent == isResponse {
				t.Fatalf("neither a response nor an event: %q", sc.Bytes())
			}
			if string(m["id"]) == `"sentinel"` {
				return
			}
		}
		if err := sc.Err(); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("no answer to the sentinel ping and no close")
			}
		}
	})
}
