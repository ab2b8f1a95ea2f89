package main

// Replaying the docs' protocol examples against a real agent: lines as
// the docs show them, with their shortened ids (`l_zved…`) bound to the
// agent's, compared by field names, JSON types, error codes and the
// values that say what happened.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// wireConn is a raw connection to an agent, one JSON line at a time: a
// socket of the test's, or the pipes of a process that holds one (socat).
type wireConn struct {
	t *testing.T
	w interface {
		io.WriteCloser
		SetWriteDeadline(time.Time) error
	}
	rd interface{ SetReadDeadline(time.Time) error }
	r  *bufio.Reader
}

func dialWire(t *testing.T, socket string) *wireConn {
	t.Helper()
	c, err := net.Dial("unix", socket)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &wireConn{t: t, w: c, rd: c, r: bufio.NewReaderSize(c, 1<<20)}
}

// close ends the connection, or the input of the process that holds it.
func (w *wireConn) close() { w.w.Close() }

// send writes a line.
func (w *wireConn) send(line string) {
	w.t.Helper()
	require.NoError(w.t, w.w.SetWriteDeadline(time.Now().Add(callTimeout)))
	_, err := w.w.Write([]byte(line + "\n"))
	require.NoError(w.t, err, "send %.80s", line)
}

// recv reads a line, within callTimeout.
func (w *wireConn) recv() string {
	w.t.Helper()
	require.NoError(w.t, w.rd.SetReadDeadline(time.Now().Add(callTimeout)))
	line, err := w.r.ReadString('\n')
	require.NoError(w.t, err, "no line from the agent")
	return strings.TrimSuffix(line, "\n")
}

// call sends req and returns its answer, which must come before any event.
func (w *wireConn) call(req map[string]any) map[string]any {
	w.t.Helper()
	b, err := json.Marshal(req)
	require.NoError(w.t, err)
	w.send(string(b))
	res := decodeLine(w.t, w.recv())
	require.Equal(w.t, true, res["ok"], "%s: %v", b, res)
	return res
}

// recvEvent reads an event, which must be the next line and of kind.
func (w *wireConn) recvEvent(kind string) map[string]any {
	w.t.Helper()
	ev := decodeLine(w.t, w.recv())
	require.Equal(w.t, kind, ev["event"], "the next line: %v", ev)
	return ev
}

func decodeLine(t *testing.T, line string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(line), &m), "%.200s", line)
	return m
}

// wireLine is a line of an example: sent (→) or expected (←).
type wireLine struct {
	sent bool
	text string
}

// wireExample is a code block of → and ← lines.
type wireExample struct {
	mdBlock
	lines []wireLine
}

// wireExamples returns the blocks of the markdown file rel made of → and ←
// lines, and how many such lines the file has in all.
func wireExamples(t *testing.T, rel string) (exs []wireExample, arrows int) {
	t.Helper()
	for _, b := range mdBlocks(t, rel) {
		ex := wireExample{mdBlock: b}
		for _, l := range b.lines {
			if text, ok := strings.CutPrefix(l, "→ "); ok {
				ex.lines = append(ex.lines, wireLine{true, text})
			} else if text, ok := strings.CutPrefix(l, "← "); ok {
				ex.lines = append(ex.lines, wireLine{false, text})
			}
		}
		arrows += len(ex.lines)
		if len(ex.lines) == len(b.lines) && len(b.lines) > 0 {
			exs = append(exs, ex)
		}
	}
	return exs, arrows
}

// elided marks what an example leaves out: `[…]` is any array, `,…}` any
// more fields.
const elided = "…"

// placeholder matches a request's shortened id, to replace with the
// agent's.
var placeholder = regexp.MustCompile(`"([^"\\]*…)"`)

// replay is a replay of examples on one connection: the agent's ids bound
// to the docs' shortened ones, and what each op answered.
type replay struct {
	t     *testing.T
	w     *wireConn
	binds map[string]string // "l_zved…" → the agent's lease id
	ops   map[string]string // a request's id (its JSON) → its op
	// results are the fields each op answered with, across the replay.
	results map[string]map[string]bool
	// before is called before each expected line is read, with its
	// index in the example: what makes the agent send it.
	before func(i int)
}

func newReplay(t *testing.T, w *wireConn, results map[string]map[string]bool) *replay {
	return &replay{t: t, w: w, binds: map[string]string{}, ops: map[string]string{}, results: results}
}

// bind binds a shortened id of the docs to the agent's.
func (r *replay) bind(short string, real any) {
	r.t.Helper()
	s, ok := real.(string)
	require.True(r.t, ok, "%s: %v is not a string", short, real)
	r.binds[short] = s
}

// run replays the lines: each run of → lines is sent, then the ← lines
// that follow are read, each matched by its id (or its event) to one of
// them, in any order.
func (r *replay) run(lines []wireLine) {
	r.t.Helper()
	expected := 0
	for i := 0; i < len(lines); {
		for ; i < len(lines) && lines[i].sent; i++ {
			line := placeholder.ReplaceAllStringFunc(lines[i].text, func(q string) string {
				real, ok := r.binds[strings.Trim(q, `"`)]
				require.True(r.t, ok, "%s is sent before the agent gave it", q)
				return `"` + real + `"`
			})
			var req map[string]json.RawMessage
			require.NoError(r.t, json.Unmarshal([]byte(line), &req), line)
			var op string
			json.Unmarshal(req["op"], &op)
			r.ops[string(req["id"])] = op
			r.w.send(line)
		}
		// The expected lines by key; lines of one key (events of one
		// kind) come in their order.
		want := map[string][]any{}
		n := 0
		for ; i < len(lines) && !lines[i].sent; i++ {
			exp := parseExpected(r.t, lines[i].text)
			want[lineKey(exp)] = append(want[lineKey(exp)], exp)
			n++
		}
		for ; n > 0; n-- {
			if r.before != nil {
				r.before(expected)
			}
			expected++
			got := r.w.recv()
			act := parseJSON(r.t, got)
			k := lineKey(act)
			require.NotEmpty(r.t, want[k], "the agent sent %s, which the example does not show", got)
			exp := want[k][0]
			want[k] = want[k][1:]
			require.NoError(r.t, r.compare(exp, act, "", false), "the agent sent\n%s", got)
			require.NoError(r.t, r.compare(exp, act, "", true), "the agent sent\n%s", got)
			// What an op answered with; not a request the example does
			// not show (its scene sent it).
			if op := r.ops[strings.TrimPrefix(k, "id ")]; op != "" && act.(map[string]any)["ok"] == true {
				obj := act.(map[string]any)
				if r.results[op] == nil {
					r.results[op] = map[string]bool{}
				}
				for f := range obj {
					r.results[op][f] = true
				}
			}
		}
	}
}

// lineKey is what matches an answer to its example: its id, or its event.
func lineKey(v any) string {
	obj, _ := v.(map[string]any)
	if ev, ok := obj["event"]; ok {
		return fmt.Sprintf("event %v", ev)
	}
	id, _ := json.Marshal(obj["id"])
	return "id " + string(id)
}

// parseJSON decodes a line, keeping numbers as they are written.
func parseJSON(t *testing.T, line string) any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(line))
	d.UseNumber()
	var v any
	require.NoError(t, d.Decode(&v), "%.200s", line)
	return v
}

// parseExpected decodes an expected line, its elisions made JSON: `[…]`
// is ["…"], `,…}` is a field "…".
func parseExpected(t *testing.T, line string) any {
	t.Helper()
	line = strings.ReplaceAll(line, "["+elided+"]", `["`+elided+`"]`)
	line = strings.ReplaceAll(line, ","+elided+"}", `,"`+elided+`":"`+elided+`"}`)
	return parseJSON(t, line)
}

// exact are the fields whose values an answer must have as the example
// shows them; of the others, the type is compared (and every boolean).
var exact = map[string]bool{"id": true, "code": true, "event": true, "reason": true, "mode": true, "scope": true,
	"state": true, "backend_state": true}

// compare compares an expected value with the agent's, at path: the same
// fields, the same JSON types, the values of exact fields and booleans; a
// shortened id is the one bound to it, or binds it (if bind; else any
// string matches an unbound one).
func (r *replay) compare(exp, act any, path string, bind bool) error {
	field := path[strings.LastIndex(path, ".")+1:]
	switch e := exp.(type) {
	case nil:
		if act != nil {
			return fmt.Errorf("%s: %v, not null", path, act)
		}
	case bool:
		if act != e {
			return fmt.Errorf("%s: %v, not %v", path, act, e)
		}
	case json.Number:
		a, ok := act.(json.Number)
		if !ok || strings.ContainsAny(a.String(), ".eE") {
			return fmt.Errorf("%s: %v, not an integer", path, act)
		}
		if exact[field] && a != e {
			return fmt.Errorf("%s: %v, not %v", path, a, e)
		}
	case string:
		a, ok := act.(string)
		switch {
		case !ok:
			return fmt.Errorf("%s: %v, not a string", path, act)
		case strings.HasSuffix(e, elided) && e != elided:
			if real, bound := r.binds[e]; bound && real != a {
				return fmt.Errorf("%s: %q, not %q (%s)", path, a, real, e)
			} else if !bound && bind {
				r.binds[e] = a
			}
		case exact[field] && a != e:
			return fmt.Errorf("%s: %q, not %q", path, a, e)
		}
	case []any:
		a, ok := act.([]any)
		if !ok {
			return fmt.Errorf("%s: %v, not an array", path, act)
		}
		if len(e) == 1 && e[0] == elided {
			return nil
		}
		if len(a) != len(e) {
			return fmt.Errorf("%s: %d elements, not %d", path, len(a), len(e))
		}
		// In any order: each expected element matches one of the agent's.
		used := make([]bool, len(a))
	next:
		for i, ee := range e {
			for j, aa := range a {
				if !used[j] && r.compare(ee, aa, fmt.Sprintf("%s[%d]", path, i), false) == nil {
					used[j] = true
					if err := r.compare(ee, aa, fmt.Sprintf("%s[%d]", path, i), bind); err != nil {
						return err
					}
					continue next
				}
			}
			return fmt.Errorf("%s[%d]: none of %v is like %v", path, i, act, ee)
		}
	case map[string]any:
		a, ok := act.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %v, not an object", path, act)
		}
		_, open := e[elided]
		var keys []string
		for k := range e {
			keys = append(keys, k)
		}
		for k := range a {
			if _, ok := e[k]; !ok && !open {
				return fmt.Errorf("%s: the field %q is not in the example", path, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			if k == elided {
				continue
			}
			av, ok := a[k]
			if !ok {
				return fmt.Errorf("%s: no field %q", path, k)
			}
			if err := r.compare(e[k], av, strings.TrimPrefix(path+"."+k, "."), bind); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%s: %T in the example", path, exp)
	}
	return nil
}

// opsTable returns the result fields of each op in the table of ops of
// docs/protocol.md; "the lease" is the lease's fields.
func opsTable(t *testing.T) map[string][]string {
	t.Helper()
	src := readDoc(t, "docs/protocol.md")
	section := strings.SplitN(strings.SplitN(src, "\n## Ops\n", 2)[1], "\n### ", 2)[0]
	row := regexp.MustCompile("(?m)^\\| \\[`(\\w+)`\\]\\(#\\w+\\) \\| [^|]* \\| ([^|]*) \\|$")
	word := regexp.MustCompile("`(\\w+)`")
	table := map[string][]string{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		var fields []string
		for _, w := range word.FindAllStringSubmatch(m[2], -1) {
			fields = append(fields, w[1])
		}
		if strings.Contains(m[2], "the lease") {
			fields = append(fields, "lease", "name", "mode", "scope", "token", "ttl_ms")
		}
		table[m[1]] = fields
	}
	require.NotEmpty(t, table, "the table of ops")
	return table
}
