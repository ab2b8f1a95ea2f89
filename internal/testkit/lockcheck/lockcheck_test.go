package lockcheck

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// op records one operation with explicit times.
func op(h *History, call, ret int64, in Input, out Output) {
	h.ops = append(h.ops, operation(call, ret, in, out))
}

func TestStrictAcceptsSequentialHistory(t *testing.T) {
	h := NewHistory()
	op(h, 0, 1, Input{Acquire, "a", 0}, Output{true, 10})
	op(h, 2, 3, Input{Release, "a", 0}, Output{OK: true})
	op(h, 1, 5, Input{Acquire, "a", 1}, Output{true, 11}) // overlaps the release
	op(h, 0, 1, Input{Acquire, "b", 2}, Output{true, 1})  // another name
	r, err := CheckStrict(h, t.TempDir())
	require.NoError(t, err)
	assert.True(t, r.OK)
	assert.Equal(t, 4, r.Operations)
}

// The checker has teeth: two holders at once, or a token going back, fail.
func TestStrictRejectsViolations(t *testing.T) {
	for name, ops := range map[string][][2]any{
		"two holders": {
			{Input{Acquire, "a", 0}, Output{true, 10}},
			{Input{Acquire, "a", 1}, Output{true, 11}},
		},
		"token back": {
			{Input{Acquire, "a", 0}, Output{true, 10}},
			{Input{Release, "a", 0}, Output{OK: true}},
			{Input{Acquire, "a", 1}, Output{true, 9}},
		},
		"foreign release": {
			{Input{Acquire, "a", 0}, Output{true, 10}},
			{Input{Release, "a", 1}, Output{OK: true}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := NewHistory()
			for i, o := range ops {
				op(h, int64(2*i), int64(2*i+1), o[0].(Input), o[1].(Output))
			}
			dir := t.TempDir()
			r, err := CheckStrict(h, dir)
			require.NoError(t, err)
			assert.False(t, r.OK)
			assert.FileExists(t, r.Visualization)
		})
	}
}

func TestRegister(t *testing.T) {
	var r Register
	assert.True(t, r.Write(5))
	assert.True(t, r.Write(5))
	assert.False(t, r.Write(4))
	assert.True(t, r.Write(6))
	a, rej := r.Counts()
	assert.Equal(t, 3, a)
	assert.Equal(t, 1, rej)
}
