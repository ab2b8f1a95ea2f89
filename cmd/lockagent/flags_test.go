package main

import (
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseInterspersed: flags may follow the arguments; "--" ends the
// flags, unless it is the value of a flag that takes one.
func TestParseInterspersed(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		names  []string
		socket string
		json   bool
	}{
		{[]string{"x", "-socket", "p"}, []string{"x"}, "p", false},
		{[]string{"-socket=p", "x", "-json"}, []string{"x"}, "p", true},
		{[]string{"--", "-x"}, []string{"-x"}, "", false},
		{[]string{"x", "--", "-y", "z"}, []string{"x", "-y", "z"}, "", false},
		{[]string{"-json", "--", "-n"}, []string{"-n"}, "", true},
		{[]string{"-socket", "--", "n", "-json"}, []string{"n"}, "--", true},
		{[]string{"--socket", "--", "--", "-n"}, []string{"-n"}, "--", false},
	} {
		fs := newFlagSet("test", io.Discard)
		socket := fs.String("socket", "", "")
		asJSON := fs.Bool("json", false, "")
		names, err := fs.parseInterspersed(tc.args)
		require.NoError(t, err, "%q", tc.args)
		assert.Equal(t, tc.names, names, "%q", tc.args)
		assert.Equal(t, tc.socket, *socket, "%q", tc.args)
		assert.Equal(t, tc.json, *asJSON, "%q", tc.args)
	}
}
