package agent

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPendingAcquires(t *testing.T) {
	w := func(name string) *waiter { return &waiter{req: AcquireRequest{Name: name}} }
	names := func(p *pendingAcquires) []string {
		var out []string
		for w := range p.all() {
			out = append(out, w.req.Name)
		}
		slices.Sort(out)
		return out
	}
	var p pendingAcquires
	assert.Equal(t, 0, p.len())
	assert.Nil(t, p.get("a"))

	a, a2, b, c := w("a"), w("a"), w("b"), w("c")
	p.put(a)
	assert.Same(t, a, p.get("a"))
	assert.Nil(t, p.get("b"))
	assert.Nil(t, p.more, "one takes no map")
	p.put(a2)
	assert.Same(t, a2, p.get("a"), "a new acquire of a name takes its place")
	p.remove(a)
	assert.Same(t, a2, p.get("a"), "the one it replaced removes nothing")

	p.put(b)
	p.put(c)
	assert.Equal(t, 3, p.len())
	assert.Equal(t, []string{"a", "b", "c"}, names(&p))
	assert.Same(t, b, p.get("b"))

	// Removing while iterating.
	for w := range p.all() {
		p.remove(w)
	}
	assert.Equal(t, 0, p.len())
	assert.Nil(t, p.more, "no map kept once empty")
	assert.Nil(t, p.get("b"))
	p.put(b)
	assert.Equal(t, []string{"b"}, names(&p))
	p.remove(b)
	assert.Equal(t, 0, p.len())
}
