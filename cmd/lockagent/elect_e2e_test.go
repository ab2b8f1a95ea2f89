package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit/lockcheck"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// election records the terms of every candidate of one name, on one
// clock, for lockcheck.CheckLeaders.
type election struct {
	t     *testing.T
	name  string
	ttl   time.Duration
	start time.Time

	mu       sync.Mutex
	terms    []*lockcheck.Term
	resigned map[int]int64 // candidate -> when it invoked resign
	nextCand int
	wg       sync.WaitGroup
}

func newElection(t *testing.T, name string, ttl time.Duration) *election {
	e := &election{t: t, name: name, ttl: ttl, start: time.Now(), resigned: map[int]int64{}}
	t.Cleanup(e.wg.Wait)
	return e
}

func (e *election) now() int64 { return int64(time.Since(e.start)) }

// candidate is one campaign, on one agent of the fleet.
type candidate struct {
	id    int
	agent int
	c     *client.Client
	cp    *client.Campaign
}

// campaign connects a new candidate to agent i of f and starts its
// campaign; its terms are recorded as they come and end.
func (e *election) campaign(f *fleet, i int) *candidate {
	e.t.Helper()
	e.mu.Lock()
	e.nextCand++
	cand := &candidate{id: e.nextCand, agent: i, c: f.agents[i].client(e.t, fmt.Sprintf("candidate-%d", e.nextCand))}
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	cp, err := cand.c.Campaign(ctx, e.name, client.CampaignOptions{TTL: e.ttl, Meta: fmt.Sprintf("candidate %d", cand.id)})
	require.NoError(e.t, err)
	cand.cp = cp
	e.wg.Go(func() {
		for term := range cp.Elected() {
			rec := &lockcheck.Term{Name: e.name, Candidate: cand.id, Agent: i, Token: term.Token, Start: e.now(), End: lockcheck.Infinity}
			e.mu.Lock()
			e.terms = append(e.terms, rec)
			e.mu.Unlock()
			e.wg.Go(func() {
				<-term.Done()
				at := e.now()
				e.mu.Lock()
				defer e.mu.Unlock()
				rec.How = term.Reason()
				rec.End = at
				if r, ok := e.resigned[cand.id]; ok && rec.How == "resigned" {
					rec.End = r // it stopped leading when it asked
				}
			})
		}
	})
	return cand
}

// resign makes the candidate resign, noting when it asked.
func (e *election) resign(cand *candidate) {
	e.t.Helper()
	e.mu.Lock()
	e.resigned[cand.id] = e.now()
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	require.NoError(e.t, cand.cp.Resign(ctx))
}

// snapshot copies the terms.
func (e *election) snapshot() []lockcheck.Term {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]lockcheck.Term, len(e.terms))
	for i, t := range e.terms {
		out[i] = *t
	}
	return out
}

// leader waits for a term that started after since and has not ended, and
// returns it.
func (e *election) leader(since int64, timeout time.Duration) lockcheck.Term {
	e.t.Helper()
	var cur lockcheck.Term
	eventually(e.t, timeout, "a leader elected", func() bool {
		for _, t := range e.snapshot() {
			if t.Start > since && t.End == lockcheck.Infinity {
				cur = t
				return true
			}
		}
		return false
	})
	return cur
}

// TestElection: three agents on one redis-server, a candidate on each.
// Leaders resign, their agents are killed with SIGKILL, and stopped with
// SIGSTOP for twice the lease; every time another candidate is elected,
// and the history of terms is checked: at most one leader at a time, each
// new leader's token above every earlier one. The time from a leader's
// loss to the next election is reported.
func TestElection(t *testing.T) {
	const ttl = time.Second
	f := startFleet(t, 3, redistest.Options{}, "")
	e := newElection(t, "elect/svc", ttl)
	cands := make([]*candidate, 3)
	for i := range cands {
		cands[i] = e.campaign(f, i)
	}
	leader := e.leader(-1, 5*time.Second)

	byCand := func(id int) *candidate {
		for _, c := range cands {
			if c.id == id {
				return c
			}
		}
		t.Fatalf("no candidate %d", id)
		return nil
	}
	// stops are the SIGSTOPs: a term whose lost event came just after its
	// agent's SIGCONT ended, as far as anybody can tell, when the stop
	// began (docs/testing.md C1).
	type stopRec struct {
		agent          int
		start, resumed int64
	}
	var stops []stopRec
	failovers := map[string][]time.Duration{}
	for round := range 2 {
		for _, fault := range []string{"resign", "kill", "stop"} {
			cur := byCand(leader.Candidate)
			a := f.agents[cur.agent]
			at := e.now()
			switch fault {
			case "resign":
				e.resign(cur)
			case "kill":
				killAgent(t, a.proc)
			case "stop":
				a.proc.signal(t, syscall.SIGSTOP)
			}
			next := e.leader(at, 10*ttl)
			require.NotEqual(t, cur.id, next.Candidate, "round %d, %s: the next leader", round, fault)
			failovers[fault] = append(failovers[fault], time.Duration(next.Start-at))
			switch fault {
			case "resign":
				cands[slices.Index(cands, cur)] = e.campaign(f, cur.agent)
			case "kill":
				a.start(t)
				cands[slices.Index(cands, cur)] = e.campaign(f, cur.agent)
			case "stop":
				// Keep it stopped for twice the lease in all.
				time.Sleep(time.Until(e.start.Add(time.Duration(at) + 2*ttl)))
				resumed := e.now() // before its lost event can come
				a.proc.signal(t, syscall.SIGCONT)
				stops = append(stops, stopRec{cur.agent, at, resumed})
				eventually(t, 5*time.Second, "the stopped leader's term ends", func() bool {
					for _, tm := range e.snapshot() {
						if tm.Candidate == cur.id && tm.Start == leader.Start {
							return tm.End != lockcheck.Infinity
						}
					}
					return false
				})
			}
			leader = next
		}
	}

	terms := e.snapshot()
	for i, tm := range terms {
		for _, s := range stops {
			if tm.Agent == s.agent && tm.Start < s.start && tm.End >= s.resumed && tm.End <= s.resumed+int64(time.Second) {
				terms[i].End, terms[i].How = s.start, tm.How+", after its agent was stopped"
			}
		}
	}
	vs := lockcheck.CheckLeaders(terms, 20*time.Millisecond)
	for _, v := range vs {
		t.Error(v)
	}
	require.GreaterOrEqual(t, len(terms), 7, "a first leader and one per fault")
	var b strings.Builder
	for _, fault := range []string{"resign", "kill", "stop"} {
		fmt.Fprintf(&b, " %s=%s", fault, durations(failovers[fault]))
	}
	line := fmt.Sprintf("election: ttl=%s terms=%d violations=%d failover (loss to next elected):%s", msString(ttl), len(terms), len(vs), b.String())
	t.Log(line)
	fmt.Println(line)
}

func durations(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = msString(d)
	}
	return strings.Join(s, ",")
}

// electScript is the command of the run -elect tests: it prints when it
// starts, with its token, and when SIGTERM stops it.
const electScript = `trap 'echo stop; exit 0' TERM; echo "start $LOCKAGENT_TOKEN"; while :; do sleep 0.02; done`

// TestRunElect: `run -elect` on three agents runs the command on exactly
// one host at a time. A killed agent's run stops its command and exits;
// a stopped agent's run stops its command when it learns of the loss, and
// stays in the race; a run told to stop ends its command and resigns, and
// another host takes over at once.
func TestRunElect(t *testing.T) {
	f := startFleet(t, 3, redistest.Options{}, "")
	runs := make([]*proc, 3)
	for i, a := range f.agents {
		runs[i] = startProc(t, fmt.Sprintf("run-elect-%d", i), a.env.clientEnv(), lockagentBin,
			"run", "-elect", "svc", "-ttl", "1s", "-grace", "2s", "--", "sh", "-c", electScript)
	}
	// starts counts the commands started on each host, running the ones
	// started and not stopped.
	starts := func() (started, running []int) {
		started, running = make([]int, 3), make([]int, 3)
		for i, r := range runs {
			out := r.stdout.String()
			started[i] = strings.Count(out, "start ")
			running[i] = started[i] - strings.Count(out, "stop")
		}
		return started, running
	}
	leaderOf := func(what string) int {
		t.Helper()
		l := -1
		eventually(t, 10*time.Second, what, func() bool {
			_, running := starts()
			l = -1
			n := 0
			for i, r := range running {
				if r > 0 {
					l = i
					n++
				}
			}
			require.LessOrEqual(t, n, 1, "commands running on hosts %v", running)
			return n == 1
		})
		return l
	}
	first := leaderOf("a first leader's command")

	// SIGSTOP the leader's agent past the lease: another host takes over;
	// on SIGCONT the old leader's command is stopped, its run keeps going.
	f.agents[first].proc.signal(t, syscall.SIGSTOP)
	eventually(t, 10*time.Second, "another host's command", func() bool {
		started, _ := starts()
		return started[(first+1)%3]+started[(first+2)%3] == 1
	})
	// Until then, the stopped host's command ran on: its agent could not
	// tell it (the fencing token is what protects a resource then).
	f.agents[first].proc.signal(t, syscall.SIGCONT)
	runs[first].waitOutput(t, "stop", 5*time.Second)
	second := leaderOf("the first command stopped")
	require.NotEqual(t, first, second)
	require.False(t, runs[first].exited(), "the stopped host's run stays in the race")

	// Kill the leader's agent: its run stops the command and exits with
	// an error; a third host's command starts.
	killAgent(t, f.agents[second].proc)
	require.Equal(t, 1, runs[second].wait(t, 5*time.Second), "run's status when its agent dies")
	require.Contains(t, runs[second].stdout.String(), "stop")
	third := leaderOf("a command after the kill")
	require.NotEqual(t, second, third)

	// SIGTERM to the leader's run: the command stops, run resigns and
	// exits with the command's status, and the last host takes over.
	runs[third].signal(t, syscall.SIGTERM)
	require.Equal(t, 0, runs[third].wait(t, 5*time.Second))
	last := leaderOf("a command after the resign")
	require.NotEqual(t, third, last)
	require.NotEqual(t, second, last)
	started, _ := starts()
	require.Equal(t, 2, started[first], "the host that was stopped contended again, and led again")

	var tokens []uint64
	for _, r := range runs {
		for _, line := range strings.Split(r.stdout.String(), "\n") {
			if tok, ok := strings.CutPrefix(line, "start "); ok {
				var n uint64
				fmt.Sscan(tok, &n)
				tokens = append(tokens, n)
			}
		}
	}
	require.Len(t, tokens, 4)
	t.Logf("run -elect: leaders on hosts %d, %d, %d, %d; tokens %v", first, second, third, last, tokens)
}
