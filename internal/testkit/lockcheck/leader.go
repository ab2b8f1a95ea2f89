package lockcheck

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Term is one term of leadership of a name, as its candidate saw it: from
// its `elected` event to the earliest moment it had stopped leading. Times
// are on the history's clock.
type Term struct {
	Name      string
	Candidate int // the campaign's number in the history
	Agent     int // the agent it campaigned on
	Token     uint64
	// Start is when the elected event reached the candidate.
	Start int64
	// End is the earliest moment the candidate had stopped leading: it
	// received `lost`, invoked resign or release, or its connection or its
	// agent died (Infinity: it led to the end of the history).
	End int64
	How string // what ended it
}

// CheckLeaders checks leader election: at most one leader of a name at a
// time (a term starts only once every earlier one has ended, give or take
// slack, the measurement tolerance of events timed on different
// connections), and every new leader's token is larger than every earlier
// leader's.
func CheckLeaders(terms []Term, slack time.Duration) []Violation {
	var out []Violation
	m := map[string][]Term{}
	for _, t := range terms {
		m[t.Name] = append(m[t.Name], t)
	}
	for name, ts := range m {
		slices.SortFunc(ts, func(a, b Term) int { return cmp.Or(cmp.Compare(a.Start, b.Start), cmp.Compare(a.Token, b.Token)) })
		var high Term // the earlier term with the highest token
		for j, t := range ts {
			for _, e := range ts[:j] {
				if e.End <= t.Start+int64(slack) {
					continue
				}
				ended := "never"
				if e.End != Infinity {
					ended = fmt.Sprintf("%v later (%s)", time.Duration(e.End-t.Start), e.How)
				}
				out = append(out, Violation{Name: name, Check: "one-leader", At: t.Start,
					Detail: fmt.Sprintf("candidate %d (agent %d, token %d) elected at %v while candidate %d (agent %d, token %d) still led: its term ended %s",
						t.Candidate, t.Agent, t.Token, time.Duration(t.Start), e.Candidate, e.Agent, e.Token, ended)})
			}
			if j > 0 && t.Token <= high.Token {
				out = append(out, Violation{Name: name, Check: "leader-tokens", At: t.Start,
					Detail: fmt.Sprintf("candidate %d elected with token %d, not above token %d of candidate %d elected before it",
						t.Candidate, t.Token, high.Token, high.Candidate)})
			}
			if t.Token > high.Token {
				high = t
			}
		}
	}
	sortViolations(out)
	return out
}

// Wait is one waiting exclusive acquire of a name.
type Wait struct {
	Name   string
	Client int
	// Call is when the acquire was invoked; Queued when it was known to be
	// in the name's queue (an observer saw it there); Granted when the
	// grant returned (Infinity: never).
	Call, Queued, Granted int64
}

// CheckFIFO checks first come, first served: of two waiting exclusive
// acquires of a name, the one known to be queued before the other was
// invoked is granted first.
func CheckFIFO(waits []Wait) []Violation {
	var out []Violation
	for _, a := range waits {
		for _, b := range waits {
			if a.Name != b.Name || a.Queued >= b.Call || b.Granted >= a.Granted {
				continue
			}
			out = append(out, Violation{Name: a.Name, Check: "fifo", At: b.Granted,
				Detail: fmt.Sprintf("client %d, queued at %v, was granted at %v, after client %d, which asked at %v and was granted at %v",
					a.Client, time.Duration(a.Queued), time.Duration(a.Granted), b.Client, time.Duration(b.Call), time.Duration(b.Granted))})
		}
	}
	sortViolations(out)
	return out
}
