package redis

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/lockagent/lockagent/backend"
)

// TestKeys: every key of a name, built as slices of one string, is the
// name's hash-tagged key and its suffix.
func TestKeys(t *testing.T) {
	b := &Backend{prefix: "pfx"}
	assert.Equal(t, keys{
		x: "pfx:lk:{orders/42}", r: "pfx:lk:{orders/42}:r", t: "pfx:lk:{orders/42}:t", f: "pfx:lk:{orders/42}:f",
		q: "pfx:lk:{orders/42}:q", qe: "pfx:lk:{orders/42}:qe", c: "pfx:lk:{orders/42}:c",
	}, b.keys("orders/42"))
	k := b.keys("a{b}")
	assert.Regexp(t, `^pfx:lk:\{#[0-9a-f]{32}\}:qe$`, k.qe)
	assert.Equal(t, b.holderKey("a{b}"), k.x)

	// A name that looks like another name's digest is digested too: the
	// two never share keys.
	digest := k.x[len("pfx:lk:{") : len(k.x)-1]
	assert.NotEqual(t, b.keys(digest).x, k.x)
	assert.Regexp(t, `^pfx:lk:\{#[0-9a-f]{32}\}$`, b.keys(digest).x)
	assert.Regexp(t, `^pfx:lk:\{#[0-9a-f]{32}\}$`, b.keys("#tag").x)
}

// TestTicketLife: the scripts bound a ticket's life by backend.TicketLife.
func TestTicketLife(t *testing.T) {
	assert.Equal(t, strconv.FormatInt(backend.TicketLife.Milliseconds(), 10), ticketLifeMs)
}

// TestMaxToken: the scripts bound tokens by backend.MaxToken.
func TestMaxToken(t *testing.T) {
	assert.Equal(t, strconv.FormatUint(backend.MaxToken, 10), maxToken)
}
