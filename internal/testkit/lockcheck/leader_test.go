package lockcheck

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestCheckLeaders(t *testing.T) {
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	ok := []Term{
		{Name: "l", Candidate: 1, Token: 10, Start: ms(0), End: ms(100), How: "lost"},
		{Name: "l", Candidate: 2, Token: 20, Start: ms(105), End: ms(200), How: "resign"},
		{Name: "l", Candidate: 1, Token: 30, Start: ms(203), End: Infinity},
		{Name: "other", Candidate: 3, Token: 5, Start: ms(50), End: Infinity},
	}
	assert.Empty(t, CheckLeaders(ok, 0))

	overlap := []Term{
		{Name: "l", Candidate: 1, Token: 10, Start: ms(0), End: ms(150), How: "lost"},
		{Name: "l", Candidate: 2, Token: 20, Start: ms(100), End: Infinity},
	}
	vs := CheckLeaders(overlap, 10*time.Millisecond)
	if assert.Len(t, vs, 1) {
		assert.Equal(t, "one-leader", vs[0].Check)
	}
	assert.Empty(t, CheckLeaders(overlap, 60*time.Millisecond), "within slack")

	never := []Term{
		{Name: "l", Candidate: 1, Token: 10, Start: ms(0), End: Infinity},
		{Name: "l", Candidate: 2, Token: 20, Start: ms(100), End: Infinity},
	}
	assert.Len(t, CheckLeaders(never, time.Second), 1)

	back := []Term{
		{Name: "l", Candidate: 1, Token: 10, Start: ms(0), End: ms(10)},
		{Name: "l", Candidate: 2, Token: 30, Start: ms(20), End: ms(30)},
		{Name: "l", Candidate: 3, Token: 20, Start: ms(40), End: Infinity},
	}
	vs = CheckLeaders(back, 0)
	if assert.Len(t, vs, 1) {
		assert.Equal(t, "leader-tokens", vs[0].Check)
	}
}

func TestCheckFIFO(t *testing.T) {
	inOrder := []Wait{
		{Name: "q", Client: 1, Call: 0, Queued: 5, Granted: 100},
		{Name: "q", Client: 2, Call: 10, Queued: 15, Granted: 200},
		{Name: "q", Client: 3, Call: 20, Queued: 25, Granted: 300},
	}
	assert.Empty(t, CheckFIFO(inOrder))
	// Two that asked at the same time may go in either order.
	assert.Empty(t, CheckFIFO([]Wait{
		{Name: "q", Client: 1, Call: 0, Queued: 20, Granted: 200},
		{Name: "q", Client: 2, Call: 10, Queued: 20, Granted: 100},
	}))
	jumped := []Wait{
		{Name: "q", Client: 1, Call: 0, Queued: 5, Granted: 300},
		{Name: "q", Client: 2, Call: 10, Queued: 15, Granted: 200},
		{Name: "other", Client: 3, Call: 20, Queued: 25, Granted: 100},
	}
	vs := CheckFIFO(jumped)
	if assert.Len(t, vs, 1) {
		assert.Equal(t, "fifo", vs[0].Check)
	}
}
