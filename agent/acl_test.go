package agent_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/lockagent/lockagent/agent"
)

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pattern, name string
		match         bool
	}{
		{"*", "anything/at/all", true},
		{"orders/*", "orders/42", true},
		{"orders/*", "orders/", true},
		{"orders/*", "orders/eu/42", true},
		{"orders/*", "order/42", false},
		{"orders/*", "xorders/42", false},
		{"*/42", "orders/42", true},
		{"*/42", "orders/420", false},
		{"a*b*c", "aXbYbZc", true},
		{"a*b*c", "aXbYcZ", false},
		{"reports/??", "reports/ab", true},
		{"reports/??", "reports/abc", false},
		{"reports/??", "reports/é1", true}, // ? is a character, not a byte
		{"exact", "exact", true},
		{"exact", "exactly", false},
		{"[a]", "[a]", true}, // no character classes
		{"[a]", "a", false},
		{"**", "", true},
		// A '*' in the name is a character like another.
		{"*", "*x", true},
		{"orders/*", "orders/*eu", true},
		{"a*c", "a*bc", true},
		{"a*", "a*", true},
		{"a?c", "a*c", true},
		{"a*c", "a*b", false},
	} {
		assert.Equal(t, tc.match, agent.Glob(tc.pattern, tc.name), "%q ~ %q", tc.pattern, tc.name)
	}
}
