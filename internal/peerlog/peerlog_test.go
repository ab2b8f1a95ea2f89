package peerlog

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestBudget: a uid logs its burst at once, then one line per interval,
// and the first line after a silence says how many were left out; each
// uid has its own budget.
func TestBudget(t *testing.T) {
	l := New(3, time.Second)
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		ok, n := l.allow(7, t0)
		assert.True(t, ok, "line %d of the burst", i)
		assert.Zero(t, n)
	}
	for range 4 {
		ok, _ := l.allow(7, t0.Add(100*time.Millisecond))
		assert.False(t, ok, "beyond the burst")
	}
	ok, _ := l.allow(8, t0)
	assert.True(t, ok, "another uid has its own budget")
	ok, n := l.allow(7, t0.Add(1100*time.Millisecond))
	assert.True(t, ok, "one line per interval")
	assert.Equal(t, 4, n, "the lines left out")
	ok, _ = l.allow(7, t0.Add(1200*time.Millisecond))
	assert.False(t, ok)
}
