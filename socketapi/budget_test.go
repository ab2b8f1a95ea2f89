package socketapi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cutOffs are the outputs of a charge's cut.
func cutOffs(cut []cutOff) []*output {
	var os []*output
	for _, c := range cut {
		os = append(os, c.o)
	}
	return os
}

// TestOutputBudget: a uid past its share loses its connections that hold
// the most, largest first; the total past its bound loses anybody's
// largest; an answer that would cut its own connection off is refused
// instead; what is written or released is given back.
func TestOutputBudget(t *testing.T) {
	b := newOutputBudget(100, 40)
	out := func(uid uint32) *output { return &output{budget: b, uid: uid} }
	a1, a2, a3, b1, c1 := out(1), out(1), out(1), out(2), out(3)

	ok, cut := b.charge(a1, 25, false)
	require.True(t, ok)
	require.Empty(t, cut)
	ok, cut = b.charge(a2, 10, false)
	require.True(t, ok)
	require.Empty(t, cut)
	// uid 1 at 45 > 40: its largest, a1, goes.
	ok, cut = b.charge(a3, 10, false)
	require.True(t, ok)
	assert.Equal(t, []*output{a1}, cutOffs(cut))
	assert.True(t, a1.released)
	assert.Equal(t, 20, b.uids[1].bytes)
	ok, _ = b.charge(a1, 5, false)
	assert.True(t, ok, "a released output is charged nothing")
	assert.Equal(t, 0, a1.charged)

	// An answer larger than what the others hold is refused, not cut off.
	ok, cut = b.charge(a2, 30, true)
	assert.False(t, ok)
	assert.Empty(t, cut)
	assert.Equal(t, 10, a2.charged)
	// A smaller one pushes the larger holder out.
	ok, cut = b.charge(a2, 15, true)
	assert.True(t, ok)
	assert.Empty(t, cut, "uid 1 at 35: fits")
	ok, cut = b.charge(a3, 1, true)
	assert.True(t, ok)
	assert.Empty(t, cut)

	// The total: 36 of uid 1, then uid 2 and 3 below their share but over
	// 100 in all: the largest anywhere goes.
	ok, cut = b.charge(b1, 39, false)
	require.True(t, ok)
	require.Empty(t, cut)
	ok, cut = b.charge(c1, 30, false)
	require.True(t, ok)
	assert.Equal(t, []*output{b1}, cutOffs(cut))
	assert.Equal(t, 36+30, b.total)

	// Written bytes come back; a release gives back the rest.
	b.credit(a2, 25)
	assert.Equal(t, 0, a2.charged)
	assert.NotContains(t, b.uids[1].holders, a2)
	b.release(a3)
	b.release(c1)
	assert.Equal(t, 0, b.total)
	assert.Empty(t, b.uids, "nothing held, nothing kept")
}

// TestAnswerTooLarge: an answer that does not fit the room its connection
// has is replaced by the line tooLarge makes, and the connection stays.
func TestAnswerTooLarge(t *testing.T) {
	o, peer := testOutput(t, 1<<20)
	o.budget, o.uid = newOutputBudget(1<<20, 1000), 7
	o.answer(make([]byte, 2000), func(size int) []byte {
		assert.Equal(t, 2000, size)
		return []byte("refused\n")
	}, true)
	got := <-readAll(peer, len("refused\n"))
	assert.Equal(t, "refused\n", string(got))
	o.mu.Lock()
	defer o.mu.Unlock()
	assert.False(t, o.closed)
}
