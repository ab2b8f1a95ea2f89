package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

const ms = int64(time.Millisecond)

// checkRun is a run with two agents, a session on each and one name, for
// histories made by hand.
func checkRun(t *testing.T) *run {
	r := &run{t: t, cfg: Config{Slack: 20 * time.Millisecond, NoTeeth: true},
		fenced: map[string]*fencedCounter{}, plain: map[string]*plainCounter{},
		c: &cluster{agents: []*agent{{idx: 0}, {idx: 1}}}, artifacts: t.TempDir()}
	r.names = []string{"n"}
	r.fenced["n"], r.plain["n"] = &fencedCounter{}, &plainCounter{}
	r.sessions = []*sessRec{{id: 0, agent: 0, ended: -1}, {id: 1, worker: 1, agent: 1, ended: -1}}
	return r
}

// TestCheckReleasedAfterLost: a release answered released:true after the
// lease's lost event came is a violation (after lost, the lease id is
// dead: not_held); a lost event after the release's answer is not one
// (that one never comes from a correct agent, but it says nothing of the
// release).
func TestCheckReleasedAfterLost(t *testing.T) {
	history := func(lostAt int64) *run {
		r := checkRun(t)
		r.ops = []*opRec{{seq: 1, session: 0, agent: 0, name: "n", ttl: 1000, call: 0, ret: 1 * ms,
			outcome: ok, token: 10, leaseID: "l_a", relCall: 500 * ms, relRet: 501 * ms, relOutcome: ok}}
		r.lost = []lostEvent{{session: 0, lease: "l_a", name: "n", token: 10, reason: "expired", at: lostAt}}
		return r
	}
	rep := history(100 * ms).check()
	var found bool
	for _, v := range rep.Violations {
		found = found || v.Check == "events"
	}
	assert.True(t, found, "released:true 400 ms after lost: %v", rep.Violations)
	for _, v := range history(600 * ms).check().Violations {
		assert.NotEqual(t, "events", v.Check, "lost after the release's answer: %v", v)
	}
}

// TestCheckLostLongAfterAStop: a lost event that comes soon after its
// agent's SIGCONT is excused (the lease may have ended in Redis at any
// moment of the stop, when the agent could tell nobody); one that comes
// long after, once the agent had been running for a while, is not: the
// name granted elsewhere before it is a violation.
func TestCheckLostLongAfterAStop(t *testing.T) {
	history := func(lostAfterStop int64) *run {
		r := checkRun(t)
		r.faults = []faultRec{{kind: stopShort, agent: 0, start: 1000 * ms, stopped: 1000 * ms, end: 1300 * ms}}
		r.ops = []*opRec{
			{seq: 1, session: 0, agent: 0, name: "n", ttl: 1000, call: 0, ret: 1 * ms,
				outcome: ok, token: 10, leaseID: "l_a", relCall: -1},
			{seq: 2, session: 1, agent: 1, name: "n", ttl: 1000, call: 1200 * ms, ret: 1250 * ms,
				outcome: ok, token: 11, leaseID: "l_b", relCall: 3000 * ms, relRet: 3001 * ms, relOutcome: ok},
		}
		r.lost = []lostEvent{{session: 0, lease: "l_a", name: "n", token: 10, reason: "expired", at: 1300*ms + lostAfterStop}}
		return r
	}
	assert.Empty(t, history(10*ms).check().Violations, "lost 10 ms after SIGCONT")
	assert.NotEmpty(t, history(600*ms).check().Violations, "lost 600 ms after SIGCONT, after a grant elsewhere")
}
