// Package lockcheck checks histories of lock operations recorded by the
// tests: a porcupine linearizability model of a lock partitioned by name
// (one holder at a time, tokens increasing), checkers of leader election
// (one leader at a time, rising tokens) and of first-come-first-served
// waiting, and a fenced register that plays a resource refusing stale
// tokens. It is test support: nothing in the agent imports it.
package lockcheck

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Kind is what an operation did.
type Kind uint8

const (
	// Acquire is an exclusive grant.
	Acquire Kind = iota
	// Release ends the client's grant.
	Release
)

// Input is an operation's request.
type Input struct {
	Kind   Kind
	Name   string
	Client int
}

// Output is an operation's outcome.
type Output struct {
	OK    bool
	Token uint64 // of an acquire
}

// History records operations from many goroutines, timed on the monotonic
// clock.
type History struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
}

// NewHistory starts an empty history.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the history's clock; take it just before invoking an operation.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Add records an operation invoked at call (from Now) that has just
// returned out.
func (h *History) Add(call int64, in Input, out Output) {
	ret := h.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, operation(call, ret, in, out))
}

func operation(call, ret int64, in Input, out Output) porcupine.Operation {
	return porcupine.Operation{ClientId: in.Client, Input: in, Call: call, Output: out, Return: ret}
}

// Len is the number of operations recorded.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

type state struct {
	holder int // -1: free
	last   uint64
}

// Strict is the model of a lock without faults: a grant needs the lock
// free and a token above every earlier one; a release needs the releasing
// client to hold it.
var Strict = porcupine.Model{
	Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
		return partitionByName(ops, func(in any) string { return in.(Input).Name })
	},
	Init: func() any { return state{holder: -1} },
	Step: func(st, in, out any) (bool, any) {
		s, i, o := st.(state), in.(Input), out.(Output)
		switch i.Kind {
		case Acquire:
			if !o.OK {
				return true, s
			}
			if s.holder != -1 || o.Token <= s.last {
				return false, s
			}
			return true, state{holder: i.Client, last: o.Token}
		default:
			if !o.OK {
				return s.holder != i.Client, s
			}
			if s.holder != i.Client {
				return false, s
			}
			return true, state{holder: -1, last: s.last}
		}
	},
	DescribeOperation: func(in, out any) string {
		i, o := in.(Input), out.(Output)
		if i.Kind == Acquire {
			return fmt.Sprintf("acquire(%s) -> %v token %d", i.Name, o.OK, o.Token)
		}
		return fmt.Sprintf("release(%s) -> %v", i.Name, o.OK)
	},
	DescribeState: func(st any) string {
		s := st.(state)
		if s.holder == -1 {
			return fmt.Sprintf("free, last token %d", s.last)
		}
		return fmt.Sprintf("held by client %d, token %d", s.holder, s.last)
	},
}

// Result of a check.
type Result struct {
	OK            bool
	Operations    int
	Visualization string // an HTML file showing the failure, when not OK
}

// CheckStrict checks h against the Strict model. On a violation it writes
// porcupine's visualization into dir.
func CheckStrict(h *History, dir string) (Result, error) {
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	res, info := porcupine.CheckOperationsVerbose(Strict, ops, time.Minute)
	r := Result{OK: res == porcupine.Ok, Operations: len(ops)}
	if res == porcupine.Unknown {
		return r, fmt.Errorf("lockcheck: the check timed out on %d operations", len(ops))
	}
	if !r.OK {
		r.Visualization = filepath.Join(dir, "history.html")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return r, fmt.Errorf("lockcheck: %w", err)
		}
		if err := porcupine.VisualizePath(Strict, info, r.Visualization); err != nil {
			return r, fmt.Errorf("lockcheck: visualization: %w", err)
		}
	}
	return r, nil
}

// Register is a fenced resource: it accepts a write only with a token at
// least as high as every token it accepted before.
type Register struct {
	mu       sync.Mutex
	high     uint64
	accepted int
	rejected int
}

// Write offers a write fenced by token and reports whether it was accepted.
func (r *Register) Write(token uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if token < r.high {
		r.rejected++
		return false
	}
	r.high = token
	r.accepted++
	return true
}

// Counts reports how many writes were accepted and rejected.
func (r *Register) Counts() (accepted, rejected int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted, r.rejected
}

// partitionByName splits a history into one part per lock name, in the
// order the names first appear; name reads an operation's input's name.
func partitionByName(ops []porcupine.Operation, name func(input any) string) [][]porcupine.Operation {
	byName := map[string][]porcupine.Operation{}
	var names []string
	for _, op := range ops {
		n := name(op.Input)
		if _, ok := byName[n]; !ok {
			names = append(names, n)
		}
		byName[n] = append(byName[n], op)
	}
	out := make([][]porcupine.Operation, 0, len(names))
	for _, n := range names {
		out = append(out, byName[n])
	}
	return out
}
