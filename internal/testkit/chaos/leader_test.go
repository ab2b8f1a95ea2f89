package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/testkit/lockcheck"
)

// termSpec is a term of a synthetic history, times in milliseconds: its
// candidate's agent, its token, when its elected event came and when the
// client saw it end (-1: never) and why, when its leader resigned and its
// connection ended (-1: never).
type termSpec struct {
	agent              int
	token              uint64
	start, done        int64
	reason             string
	resign, sessionEnd int64
}

// checkTerms runs checkLeaders on a history of one leader name, each term
// its own campaign and session, under the given faults, and returns the
// checks that found violations and whether the Lease model accepts it.
func checkTerms(t *testing.T, specs []termSpec, ls leaderStops) ([]string, bool) {
	ms := func(n int64) int64 {
		if n < 0 {
			return -1
		}
		return n * int64(time.Millisecond)
	}
	const name = "chaos/leader/0"
	r := &run{t: t, cfg: Config{Slack: 20 * time.Millisecond}, leaderNames: []string{name},
		fenced: map[string]*fencedCounter{name: {}}, plain: map[string]*plainCounter{name: {}}}
	for i, s := range specs {
		how := ""
		if s.sessionEnd >= 0 {
			how = "closed"
		}
		r.sessions = append(r.sessions, &sessRec{id: i, agent: s.agent, ended: ms(s.sessionEnd), how: how})
		c := &campaignRec{seq: i + 1, session: i, agent: s.agent, name: name, ttl: 1000, outcome: ok,
			call: ms(s.start) - ms(50), resignCall: ms(s.resign), resignRet: -1}
		if s.resign >= 0 {
			c.resignRet, c.resignOutcome = ms(s.resign+10), ok
		}
		r.campaigns = append(r.campaigns, c)
		r.terms = append(r.terms, &termRec{seq: i + 1, campaign: c, token: s.token, contend: c.call, start: ms(s.start),
			done: ms(s.done), reason: s.reason})
	}
	for _, fs := range [][][]faultRec{ls.stops, ls.kills} {
		for _, f := range fs {
			for i := range f {
				f[i].start, f[i].end = ms(f[i].start), ms(f[i].end)
			}
		}
	}
	for i := range ls.restarts {
		ls.restarts[i].start = ms(ls.restarts[i].start)
	}
	for s, ps := range ls.pauses {
		for i := range ps {
			ls.pauses[s][i].start, ls.pauses[s][i].end = ms(ps[i].start), ms(ps[i].end)
		}
	}
	rep := &Report{}
	var h lockcheck.LeaseHistory
	r.checkLeaders(rep, &h, ls)
	var checks []string
	for _, v := range rep.Violations {
		checks = append(checks, v.Check)
	}
	res, err := lockcheck.CheckLease(&h, t.TempDir())
	require.NoError(t, err)
	assert.Equal(t, len(specs), rep.Terms)
	return checks, res.OK
}

// The leader checks accept handovers (after a lost event, a resign, a
// connection's end) and the ends the lease checks excuse (an agent stopped
// or killed, a client paused, Redis restarted), and find a leader elected
// while another led, a token that went back, and a term that ended
// without its lost event.
func TestLeaderChecks(t *testing.T) {
	noFaults := func() leaderStops {
		return leaderStops{stops: make([][]faultRec, 2), kills: make([][]faultRec, 2), pauses: map[int][]pauseRec{}}
	}
	with := func(f func(*leaderStops)) leaderStops {
		ls := noFaults()
		f(&ls)
		return ls
	}
	for _, tc := range []struct {
		name   string
		terms  []termSpec
		faults leaderStops
		checks []string // the checks that find violations
	}{
		{
			name: "handover after lost",
			terms: []termSpec{
				{agent: 0, token: 10, start: 0, done: 1000, reason: "expired", resign: -1, sessionEnd: -1},
				{agent: 1, token: 20, start: 1010, done: 3001, reason: "connection closed", resign: -1, sessionEnd: 3000},
			},
			faults: noFaults(),
		},
		{
			name: "handover after resign",
			terms: []termSpec{
				{agent: 0, token: 10, start: 0, done: 910, reason: "resigned", resign: 900, sessionEnd: -1},
				{agent: 1, token: 20, start: 905, done: -1, resign: -1, sessionEnd: -1},
			},
			faults: noFaults(),
		},
		{
			name: "elected as it resigned",
			terms: []termSpec{
				{agent: 0, token: 10, start: 1000, done: 1010, reason: "resigned", resign: 990, sessionEnd: -1},
				{agent: 1, token: 20, start: 1020, done: -1, resign: -1, sessionEnd: -1},
			},
			faults: noFaults(),
		},
		{
			name: "elected while another leads",
			terms: []termSpec{
				{agent: 0, token: 10, start: 0, done: 2000, reason: "expired", resign: -1, sessionEnd: -1},
				{agent: 1, token: 20, start: 1000, done: -1, resign: -1, sessionEnd: 3000},
			},
			faults: noFaults(),
			checks: []string{"one-leader"},
		},
		{
			name: "lost after its agent was stopped",
			terms: []termSpec{
				{agent: 0, token: 10, start: 0, done: 3000, reason: "expired", resign: -1, sessionEnd: -1},
				{agent: 1, token: 20, start: 2000, done: -1, resign: -1, sessionEnd: -1},
			},
			faults: with(func(ls *leaderStops) { ls.stops[0] = []faultRec{{kind: stopLong, start: 500, end: 2900}} }),
		},
		{
			name: "connection closed while its agent was stopped",
			terms: []termSpec{
				{agent: 0, token: 10, start: 0, done: 2501, reason: "connection closed", resign: -1, sessionEnd: 2500},
				{agent: 1, token: 20, start: 2000, done: -1, resign: -1, sessionEnd: -1},
			},
			faults: with(func(ls *leaderStops) { ls.stops[0] = []faultRec{{kind: stopLong, start: 500, end: 2900}} }),
		},
		{
			name: "lost long after its agent was stopped",
			terms: []termSpec{
				{agent: 0, token: 10, start: 0, done: 5000, reason: "expired", resign: -1, sessionEnd: -1},
				{agent: 1, token: 20, start: 2000, done: -1, resign: -1, sessionEnd: -1},
			},
			faults: with(func(ls *leaderStops) { ls.stops[0] = []faultRec{{kind: stopLong, start: 500, end: 2900}} }),
			checks: []string{"one-leader"},
		},
		{
			name: "agent killed",
			terms: []termSpec{
				{agent: 0, token: 10, start: 0, done: 801, reason: "connection closed", resign: -1, sessionEnd: 800},
				{agent: 1, token: 20, start: 600, done: -1, resign: -1, sessionEnd: -1},
			},
			faults: with(func(ls *leaderStops) { ls.kills[0] = []faultRec{{kind: killAgent, start: 500, end: 500}} }),
		},
		{
			name: "connection dropped while its client was paused",
			terms: []termSpec{
				{agent: 0, token: 10, start: 0, done: 1501, reason: "connection closed", resign: -1, sessionEnd: 1500},
				{agent: 1, token: 20, start: 1200, done: -1, resign: -1, sessionEnd: -1},
			},
			faults: with(func(ls *leaderStops) { ls.pauses[0] = []pauseRec{{session: 0, start: 500, end: 3000}} }),
		},
		{
			name: "redis-server restarted",
			terms: []termSpec{
				{agent: 0, token: 10, start: 0, done: -1, resign: -1, sessionEnd: -1},
				{agent: 1, token: 20, start: 450, done: -1, resign: -1, sessionEnd: -1},
			},
			faults: with(func(ls *leaderStops) { ls.restarts = []faultRec{{kind: restartRedis, start: 400}} }),
		},
		{
			name: "token went back",
			terms: []termSpec{
				{agent: 0, token: 20, start: 0, done: 110, reason: "resigned", resign: 100, sessionEnd: -1},
				{agent: 1, token: 10, start: 200, done: -1, resign: -1, sessionEnd: -1},
			},
			faults: noFaults(),
			checks: []string{"leader-tokens"},
		},
		{
			name: "ended without its lost event",
			terms: []termSpec{
				{agent: 0, token: 10, start: 0, done: 500, reason: "released", resign: -1, sessionEnd: -1},
				{agent: 1, token: 20, start: 600, done: -1, resign: -1, sessionEnd: -1},
			},
			faults: noFaults(),
			checks: []string{"leader-events"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checks, leaseOK := checkTerms(t, tc.terms, tc.faults)
			assert.Equal(t, tc.checks, checks)
			// The Lease model agrees wherever two leaders overlapped or
			// a token went back.
			overlap := false
			for _, c := range tc.checks {
				overlap = overlap || c != "leader-events"
			}
			assert.Equal(t, !overlap, leaseOK, "the Lease model's verdict")
		})
	}
}
