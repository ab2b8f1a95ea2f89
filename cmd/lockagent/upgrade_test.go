package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/config"
	"github.com/lockagent/lockagent/internal/handover"
)

// TestUpgradeFormats: between neighbouring releases, the state goes in
// the newest format both read, upgrading and downgrading; two releases
// apart, the upgrade is refused.
func TestUpgradeFormats(t *testing.T) {
	for _, c := range []struct {
		old, new int // the releases' own formats
		format   int
	}{
		{1, 1, 1},
		{1, 2, 1}, {2, 1, 1}, // the first format's neighbour, both ways
		{5, 5, 5},
		{5, 6, 5}, // an upgrade: the old release writes its own format, which the new reads
		{6, 5, 5}, // a downgrade: the old release writes the one before
		{5, 7, 0}, {7, 5, 0},
	} {
		got := handover.Pick(handover.FormatsOf(c.old), handover.FormatsOf(c.new))
		require.Equal(t, c.format, got, "from format %d to %d", c.old, c.new)
	}
}

// TestUpgradeRefusals: the running agent refuses a new release that reads
// none of the formats it writes, and settings that move the locks or the
// socket, saying why.
func TestUpgradeRefusals(t *testing.T) {
	cfg := config.Default()
	u := &upgrader{in: &instance{cfg: cfg}}
	mine := settingsOf(cfg)
	format, refuse := u.accept(handover.Hello{Version: "x", Formats: handover.Formats, Settings: mine})
	require.Equal(t, handover.Format, format)
	require.Empty(t, refuse)

	_, refuse = u.accept(handover.Hello{Version: "x", Formats: []int{handover.Format + 2}, Settings: mine})
	require.Contains(t, refuse, "upgrade through the releases between")
	moved := mine
	moved.Backend = "memory /elsewhere"
	_, refuse = u.accept(handover.Hello{Formats: handover.Formats, Settings: moved})
	require.Contains(t, refuse, "restart the agent to change it")
	moved = mine
	moved.Socket = "/elsewhere.sock"
	_, refuse = u.accept(handover.Hello{Formats: handover.Formats, Settings: moved})
	require.Contains(t, refuse, "socket")
}
