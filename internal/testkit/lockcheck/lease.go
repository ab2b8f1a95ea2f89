package lockcheck

// Lease mode: the checkers of histories recorded under faults, where a
// holder's lease may end without a release (docs/testing.md, guarantee 3 and the
// checkers). A lease's end is recorded as an operation of its own,
// an End, spanning the time in which it may have taken effect: around the
// `lost` event the holder received, or from the moment its connection, its
// agent or the backend's data died. The model then demands what Strict
// demands, one holder at a time with increasing tokens, with an End in
// place of a release: a grant needs every earlier lease of the name
// released or ended first. So the Lease model still rejects two
// overlapping grants when nothing ended the first one.

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// LeaseKind is what a lease-mode operation did.
type LeaseKind uint8

const (
	// LeaseAcquire is an exclusive grant (OK) or a denial.
	LeaseAcquire LeaseKind = iota
	// LeaseRelease is the holder's release: OK, or refused as not held.
	LeaseRelease
	// LeaseEnd is a lease ending without a release: its holder was told
	// it was lost, or its connection, its agent or the backend's copy of
	// it died. It is always possible, and ends the lease if it is still
	// the holder.
	LeaseEnd
)

func (k LeaseKind) String() string {
	switch k {
	case LeaseAcquire:
		return "acquire"
	case LeaseRelease:
		return "release"
	default:
		return "end"
	}
}

// LeaseInput is a lease-mode operation's request.
type LeaseInput struct {
	Kind   LeaseKind
	Name   string
	Client int // the session that made it, for the visualization
	Lease  int // the grant it is about: one number per acquire, never reused
	Note   string
}

// LeaseOutput is a lease-mode operation's outcome. An End's is ignored.
type LeaseOutput struct {
	OK    bool
	Token uint64
}

// Infinity as an operation's return time says that it may take effect at
// any time after its call: an outcome never known. Only Ends may have it;
// acquires and releases of unknown outcome are left out of the history (a
// grant that nobody was told of is never used, and what ends a lease whose
// release was lost is recorded as an End).
const Infinity int64 = math.MaxInt64

// LeaseHistory is a history of lease-mode operations with explicit times
// (nanoseconds on any one clock), built after a run from its records. Its
// methods are safe for concurrent use.
type LeaseHistory struct {
	mu    sync.Mutex
	ops   []porcupine.Operation
	notes []porcupine.Annotation
}

// Add records an operation that was invoked at call and returned at ret
// (Infinity: never known).
func (h *LeaseHistory) Add(call, ret int64, in LeaseInput, out LeaseOutput) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: in.Client, Input: in, Call: call, Output: out, Return: ret})
}

// Annotate adds a note to the visualization, such as a fault or an event,
// spanning [start, end]. Tag groups notes on one line ("faults"); a tag of
// "" puts the note on the line of client.
func (h *LeaseHistory) Annotate(tag string, client int, start, end int64, text string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notes = append(h.notes, porcupine.Annotation{Tag: tag, ClientId: client, Start: start, End: end, Description: text})
}

// Len is the number of operations recorded.
func (h *LeaseHistory) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

// snapshot returns the operations with Infinity replaced by a time after
// every other (the same meaning, and a visualization that stays readable),
// and the notes.
func (h *LeaseHistory) snapshot() ([]porcupine.Operation, []porcupine.Annotation) {
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	notes := slices.Clone(h.notes)
	h.mu.Unlock()
	var last int64
	for _, op := range ops {
		last = max(last, op.Call)
		if op.Return != Infinity {
			last = max(last, op.Return)
		}
	}
	for _, n := range notes {
		last = max(last, n.End)
	}
	for i := range ops {
		if ops[i].Return == Infinity {
			ops[i].Return = last + 1
		}
	}
	return ops, notes
}

// jsonOp is an operation as WriteJSON saves it.
type jsonOp struct {
	Call   int64       `json:"call"`
	Return int64       `json:"return"`
	Input  LeaseInput  `json:"input"`
	Output LeaseOutput `json:"output"`
}

// WriteJSON saves the operations to path, one JSON object a line, for
// ReadLeaseHistory to check again offline.
func (h *LeaseHistory) WriteJSON(path string) error {
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	var b []byte
	for _, op := range ops {
		line, err := json.Marshal(jsonOp{Call: op.Call, Return: op.Return, Input: op.Input.(LeaseInput), Output: op.Output.(LeaseOutput)})
		if err != nil {
			return fmt.Errorf("lockcheck: %w", err)
		}
		b = append(append(b, line...), '\n')
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("lockcheck: %w", err)
	}
	return nil
}

// ReadLeaseHistory loads operations saved by WriteJSON.
func ReadLeaseHistory(path string) (*LeaseHistory, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("lockcheck: %w", err)
	}
	h := &LeaseHistory{}
	dec := json.NewDecoder(bytes.NewReader(b))
	for dec.More() {
		var op jsonOp
		if err := dec.Decode(&op); err != nil {
			return nil, fmt.Errorf("lockcheck: %s: %w", path, err)
		}
		h.Add(op.Call, op.Return, op.Input, op.Output)
	}
	return h, nil
}

type leaseState struct {
	holder int // the lease holding the name; -1: free
	last   uint64
}

// partitionLeases splits a Lease history by name.
func partitionLeases(ops []porcupine.Operation) [][]porcupine.Operation {
	return partitionByName(ops, func(in any) string { return in.(LeaseInput).Name })
}

// Lease is the model of a lock whose leases may end without a release,
// partitioned by name: a grant needs the lock free (its last lease
// released or ended) and a token above every earlier one; a release
// succeeds only for the lease holding the lock, and fails only for one
// that does not; an End frees the lock if its lease holds it.
var Lease = porcupine.Model{
	Partition: partitionLeases,
	Init:      func() any { return leaseState{holder: -1} },
	Step: func(st, in, out any) (bool, any) {
		s, i, o := st.(leaseState), in.(LeaseInput), out.(LeaseOutput)
		switch i.Kind {
		case LeaseAcquire:
			if !o.OK {
				return true, s // a lease may live in the backend unseen
			}
			if s.holder != -1 || o.Token <= s.last {
				return false, s
			}
			return true, leaseState{holder: i.Lease, last: o.Token}
		case LeaseRelease:
			if !o.OK {
				return s.holder != i.Lease, s
			}
			if s.holder != i.Lease {
				return false, s
			}
			return true, leaseState{holder: -1, last: s.last}
		default:
			if s.holder == i.Lease {
				return true, leaseState{holder: -1, last: s.last}
			}
			return true, s
		}
	},
	DescribeOperation: func(in, out any) string {
		i, o := in.(LeaseInput), out.(LeaseOutput)
		var s string
		switch i.Kind {
		case LeaseAcquire:
			if o.OK {
				s = fmt.Sprintf("acquire(%s) #%d -> token %d", i.Name, i.Lease, o.Token)
			} else {
				s = fmt.Sprintf("acquire(%s) #%d -> denied", i.Name, i.Lease)
			}
		case LeaseRelease:
			s = fmt.Sprintf("release(%s) #%d -> %v", i.Name, i.Lease, o.OK)
		default:
			s = fmt.Sprintf("end(%s) #%d", i.Name, i.Lease)
		}
		if i.Note != "" {
			s += " [" + i.Note + "]"
		}
		return s
	},
	DescribeState: func(st any) string {
		s := st.(leaseState)
		if s.holder == -1 {
			return fmt.Sprintf("free, last token %d", s.last)
		}
		return fmt.Sprintf("held by lease #%d, token %d", s.holder, s.last)
	},
}

// LeaseResult is the outcome of CheckLease.
type LeaseResult struct {
	OK         bool
	Operations int
	// BadNames are the names whose histories are not linearizable, and
	// Why says, for each, where the longest linearization porcupine found
	// got stuck.
	BadNames []string
	Why      []string
	// Visualization is porcupine's HTML file of the history, written when
	// the check fails.
	Visualization string
}

// checkTimeout bounds porcupine's search; a history it cannot decide in
// that time is reported as an error.
const checkTimeout = 2 * time.Minute

// CheckLease checks h against the Lease model, name by name. On a
// violation it writes porcupine's visualization, with h's notes, into dir.
func CheckLease(h *LeaseHistory, dir string) (LeaseResult, error) {
	ops, notes := h.snapshot()
	r := LeaseResult{Operations: len(ops)}
	res, info := porcupine.CheckOperationsVerbose(Lease, ops, checkTimeout)
	if res == porcupine.Unknown {
		return r, fmt.Errorf("lockcheck: the lease check timed out on %d operations", len(ops))
	}
	r.OK = res == porcupine.Ok
	if r.OK {
		return r, nil
	}
	partials := info.PartialLinearizations()
	for p, part := range partitionLeases(ops) {
		if porcupine.CheckOperationsTimeout(Lease, part, checkTimeout) != porcupine.Ok {
			r.BadNames = append(r.BadNames, part[0].Input.(LeaseInput).Name)
			var longest []int
			if p < len(partials) {
				for _, l := range partials[p] {
					if len(l) > len(longest) {
						longest = l
					}
				}
			}
			r.Why = append(r.Why, stuck(part, longest))
		}
	}
	info.AddAnnotations(notes)
	path, err := writeVisualization(Lease, info, dir)
	r.Visualization = path
	return r, err
}

// stuck describes where a partial linearization of part (ids are indexes
// in part) ends: the state it reaches, and the operation that returned
// first among those it could not place.
func stuck(part []porcupine.Operation, linearized []int) string {
	in := make(map[int]bool, len(linearized))
	var st any = Lease.Init()
	for _, id := range linearized {
		in[id] = true
		_, st = Lease.Step(st, part[id].Input, part[id].Output)
	}
	first := -1
	for id, op := range part {
		if !in[id] && (first == -1 || op.Return < part[first].Return) {
			first = id
		}
	}
	if first == -1 {
		return "every operation was placed"
	}
	op := part[first]
	return fmt.Sprintf("after %d of %d operations (%s), no order places %s, called at %v and returned at %v",
		len(linearized), len(part), Lease.DescribeState(st), Lease.DescribeOperation(op.Input, op.Output),
		time.Duration(op.Call), time.Duration(op.Return))
}

// VisualizeLease writes porcupine's visualization of h, with its notes,
// into dir whatever the outcome, and returns the file's path: for the
// artifacts of a run that failed another check.
func VisualizeLease(h *LeaseHistory, dir string) (string, error) {
	ops, notes := h.snapshot()
	_, info := porcupine.CheckOperationsVerbose(Lease, ops, checkTimeout)
	info.AddAnnotations(notes)
	return writeVisualization(Lease, info, dir)
}

func writeVisualization(m porcupine.Model, info porcupine.LinearizationInfo, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("lockcheck: %w", err)
	}
	path := filepath.Join(dir, "history.html")
	if err := porcupine.VisualizePath(m, info, path); err != nil {
		return "", fmt.Errorf("lockcheck: visualization: %w", err)
	}
	return path, nil
}

// Grant is a granted lease as the token and lost-before-grant checkers see
// it. Times are on the history's clock.
type Grant struct {
	Name  string
	Lease int // its number, as in LeaseInput
	Agent int // the agent that granted it
	Token uint64
	// Call and Return are the acquire's invocation and return.
	Call, Return int64
	// Ended is the earliest moment its holder had stopped holding it: it
	// invoked the release, received `lost`, or its connection, its agent
	// or the backend's data died (Infinity: never, in the history).
	Ended int64
	// How says what ended it ("release", "lost", "closed", ...).
	How string
}

// Violation is one breach found by a checker.
type Violation struct {
	Name   string
	Check  string // "tokens", "lost-before-grant", ...
	At     int64  // when, on the history's clock
	Detail string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %s at %v: %s", v.Check, v.Name, time.Duration(v.At), v.Detail)
}

// CheckTokens is the per-name token high-water checker: a grant whose
// acquire was invoked after another grant of the name returned has a larger
// token, and no two grants of a name share a token.
func CheckTokens(grants []Grant) []Violation {
	var out []Violation
	for name, gs := range byName(grants) {
		seen := map[uint64]int{}
		for _, g := range gs {
			if other, ok := seen[g.Token]; ok {
				out = append(out, Violation{Name: name, Check: "tokens", At: g.Return,
					Detail: fmt.Sprintf("leases #%d and #%d were both granted token %d", other, g.Lease, g.Token)})
			}
			seen[g.Token] = g.Lease
		}
		byCall := slices.SortedFunc(slices.Values(gs), func(a, b Grant) int { return cmp.Compare(a.Call, b.Call) })
		byReturn := slices.SortedFunc(slices.Values(gs), func(a, b Grant) int { return cmp.Compare(a.Return, b.Return) })
		var high Grant // the grant with the highest token among those returned so far
		j := 0
		for _, g := range byCall {
			for j < len(byReturn) && byReturn[j].Return < g.Call {
				if byReturn[j].Token > high.Token {
					high = byReturn[j]
				}
				j++
			}
			if high.Token != 0 && g.Token <= high.Token {
				out = append(out, Violation{Name: name, Check: "tokens", At: g.Return,
					Detail: fmt.Sprintf("lease #%d got token %d, not above token %d of lease #%d granted before it was asked for",
						g.Lease, g.Token, high.Token, high.Lease)})
			}
		}
	}
	sortViolations(out)
	return out
}

// CheckLostBeforeGrant checks promise 3 from the holders' side: when a
// lease G of a name is granted, every lease of the name with a smaller
// token (granted before it by the backend) has ended for its holder:
// released, reported lost, or its connection, agent or backend data gone.
// A lease that ended later than slack after G's acquire returned is a
// violation: two holders believed they held the name at once.
func CheckLostBeforeGrant(grants []Grant, slack time.Duration) []Violation {
	var out []Violation
	for name, gs := range byName(grants) {
		slices.SortFunc(gs, func(a, b Grant) int { return cmp.Compare(a.Token, b.Token) })
		for i, g := range gs {
			for _, l := range gs[:i] {
				if l.Token == g.Token || l.Ended <= g.Return+int64(slack) {
					continue
				}
				ended := "never"
				if l.Ended != Infinity {
					ended = fmt.Sprintf("%v (%s), %v after", time.Duration(l.Ended), l.How, time.Duration(l.Ended-g.Return))
				}
				out = append(out, Violation{Name: name, Check: "lost-before-grant", At: g.Return,
					Detail: fmt.Sprintf("lease #%d (agent %d, token %d) granted at %v while lease #%d (agent %d, token %d) was still held: it ended %s",
						g.Lease, g.Agent, g.Token, time.Duration(g.Return), l.Lease, l.Agent, l.Token, ended)})
			}
		}
	}
	sortViolations(out)
	return out
}

func byName(grants []Grant) map[string][]Grant {
	m := map[string][]Grant{}
	for _, g := range grants {
		m[g.Name] = append(m[g.Name], g)
	}
	return m
}

func sortViolations(vs []Violation) {
	slices.SortFunc(vs, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.At, b.At), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Detail, b.Detail))
	})
}
