package chaos

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two holders at once, interleaved as a paused holder and its successor
// would be: the unfenced counter loses the update, the fenced one refuses
// the stale write and loses nothing.
func TestFencedCounterLosesNothing(t *testing.T) {
	var f fencedCounter
	var p plainCounter
	grants := map[int][2]int64{1: {0, 1}, 2: {5, 6}}

	// Lease #1 (token 10) reads; lease #2 (token 20) reads; both write.
	v1, ok1 := f.read(10)
	p1 := p.read()
	v2, ok2 := f.read(20)
	p2 := p.read()
	require.True(t, ok1)
	require.True(t, ok2)
	assert.True(t, f.write(20, v2+1, 2, 7))
	p.write(p2 + 1)
	assert.False(t, f.write(10, v1+1, 1, 8), "a stale token is refused")
	p.write(p1 + 1)

	assert.Equal(t, 1, p.value, "the unfenced counter lost an increment")
	assert.Equal(t, 2, p.increments)
	assert.Equal(t, 1, f.value)
	assert.Empty(t, checkFenced("a", &f, grants))

	// A stale holder cannot even read.
	_, ok := f.read(10)
	assert.False(t, ok)
}

// checkFenced has teeth: a write accepted from a holder after a holder
// granted later had written (tokens that went back), and a lost update
// (two holders with the same token), are both violations.
func TestCheckFencedViolations(t *testing.T) {
	t.Run("token back", func(t *testing.T) {
		var f fencedCounter
		grants := map[int][2]int64{1: {0, 1}, 2: {5, 6}}
		require.True(t, f.write(5, 1, 2, 7))  // the later grant, with a lower token
		require.True(t, f.write(10, 2, 1, 8)) // the earlier grant writes after it
		vs := checkFenced("a", &f, grants)
		require.Len(t, vs, 1)
		assert.Contains(t, vs[0].Detail, "lease #1")
	})
	t.Run("same token", func(t *testing.T) {
		var f fencedCounter
		grants := map[int][2]int64{1: {0, 1}, 2: {0, 1}}
		v1, _ := f.read(10)
		v2, _ := f.read(10)
		require.True(t, f.write(10, v1+1, 1, 2))
		require.True(t, f.write(10, v2+1, 2, 3))
		vs := checkFenced("a", &f, grants)
		require.Len(t, vs, 1)
		assert.Contains(t, vs[0].Detail, "1 lost")
	})
}
