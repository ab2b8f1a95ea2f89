package socketapi_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"testing"
	"time"
)

// FuzzSession (F2) plays a whole session over one connection: the input
// is a script of ops (acquire in every mode, scope and wait, release and
// check of leases held and not, inspect, list, break, cancel, status, a
// late hello, garbage, bye), two bytes a step. Whatever the script, every
// request is answered exactly once, with its own id; granted tokens of a
// name only go up; the connection serves a ping after the script unless it
// said bye; and once it is closed, the agent holds no session and no lease.
func FuzzSession(f *testing.F) {
	for _, seed := range [][]byte{
		{0, 0, 4, 0, 6, 0, 10, 0},
		{0, 1, 2, 1, 9, 2, 7, 1, 13, 0},
		{1, 2, 1, 2, 1, 3, 11, 2, 8, 0, 4, 1},
		{3, 0, 12, 0, 5, 7, 15, 9, 14, 0},
		{2, 3, 2, 3, 9, 1, 9, 0, 0, 3},
	} {
		f.Add(seed)
	}
	ta := startAgent(f, func(o *options) { o.Agent.MaxLeasesPerSession = 6 })
	lastToken := map[string]float64{}
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) > 200 {
			script = script[:200]
		}
		nc, err := net.Dial("unix", ta.path)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		r := bufio.NewReader(nc)
		answered := map[string]int{}
		var leases []string
		readLine := func() (map[string]any, bool) {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return nil, false
			}
			var m map[string]any
			if err := json.Unmarshal(line, &m); err != nil {
				t.Fatalf("not a JSON object: %q", line)
			}
			if _, ev := m["event"]; ev {
				return m, true
			}
			id := fmt.Sprint(m["id"])
			answered[id]++
			if answered[id] > 1 {
				t.Fatalf("id %s answered twice: %q", id, line)
			}
			if m["acquired"] == true {
				name, tok := m["name"].(string), m["token"].(float64)
				if tok <= lastToken[name] {
					t.Fatalf("token %v of %s after %v", tok, name, lastToken[name])
				}
				lastToken[name] = tok
				leases = append(leases, m["lease"].(string))
			}
			return m, true
		}
		// await reads until id is answered; false if the connection ended.
		await := func(id string) bool {
			for answered[id] == 0 {
				if _, ok := readLine(); !ok {
					return false
				}
			}
			return true
		}
		sent := []string{}
		bye := false
		for i := 0; i+1 < len(script) && !bye; i += 2 {
			op, arg := script[i]%16, int(script[i+1])
			id := fmt.Sprint(i)
			name := fmt.Sprintf("fz/%d", arg%4)
			lease := "l_none"
			if len(leases) > 0 {
				lease = leases[arg%len(leases)]
			}
			var line string
			switch op {
			case 0:
				line = fmt.Sprintf(`{"id":%s,"op":"acquire","name":%q}`, id, name)
			case 1:
				line = fmt.Sprintf(`{"id":%s,"op":"acquire","name":%q,"mode":"shared","limit":%d}`, id, name, arg%3+1)
			case 2:
				line = fmt.Sprintf(`{"id":%s,"op":"acquire","name":%q,"wait_ms":%d}`, id, name, arg%30)
			case 3:
				line = fmt.Sprintf(`{"id":%s,"op":"acquire","name":%q,"scope":"session","ttl_ms":%d}`, id, name, 1000+arg)
			case 4:
				line = fmt.Sprintf(`{"id":%s,"op":"release","lease":%q}`, id, lease)
			case 5:
				line = fmt.Sprintf(`{"id":%s,"op":"release","lease":"l_%d"}`, id, arg)
			case 6:
				line = fmt.Sprintf(`{"id":%s,"op":"check","lease":%q}`, id, lease)
			case 7:
				line = fmt.Sprintf(`{"id":%s,"op":"inspect","name":%q}`, id, name)
			case 8:
				line = fmt.Sprintf(`{"id":%s,"op":"list","all":%v}`, id, arg%2 == 0)
			case 9:
				target := "0"
				if len(sent) > 0 {
					target = sent[arg%len(sent)]
				}
				line = fmt.Sprintf(`{"id":%s,"op":"cancel","target":%s}`, id, target)
			case 10:
				line = fmt.Sprintf(`{"id":%s,"op":"ping"}`, id)
			case 11:
				line = fmt.Sprintf(`{"id":%s,"op":"break","name":%q}`, id, name)
			case 12:
				line = fmt.Sprintf(`{"id":%s,"op":"hello","version":1}`, id)
			case 13:
				line = fmt.Sprintf(`{"id":%s,"op":"status"}`, id)
			case 14:
				line = fmt.Sprintf(`{"id":%s,"op":"bye"}`, id)
				bye = true
			default:
				line = fmt.Sprintf(`{"id":%s,"op":"frob%d","name":%q}`, id, arg, name)
			}
			if _, err := nc.Write([]byte(line + "\n")); err != nil {
				t.Fatalf("write %q: %v", line, err)
			}
			sent = append(sent, id)
			// Waiting acquires are answered later; everything else first.
			if op != 2 && !await(id) {
				t.Fatalf("connection ended before the answer to %q", line)
			}
		}
		if !bye {
			nc.Write([]byte(`{"id":"sentinel","op":"ping"}` + "\n"))
			if !await("sentinel") {
				t.Fatal("no answer to the sentinel ping")
			}
		}
		for _, id := range sent {
			if !await(id) {
				t.Fatalf("request %s never answered", id)
			}
		}
		nc.Close()
		deadline := time.Now().Add(5 * time.Second)
		for {
			st := ta.agent.Stats()
			if st.Sessions == 0 && st.Leases == 0 && st.Waiters == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("left behind after the connection closed: %+v", st)
			}
			time.Sleep(time.Millisecond)
		}
	})
}
