// Package socketapi is the agent's server of lockagent's wire protocol,
// version 1: newline-delimited JSON over a Unix stream socket
// (docs/protocol.md).
//
// It owns the listener (path, mode, group, systemd socket activation),
// each connection's read loop and single writer, the poller where idle
// connections wait without a goroutine, framing limits, the output budget,
// peer credentials and the mapping of errors to wire codes. It drives the
// agent package and knows nothing of how locks are stored. The protocol's
// data is internal/wire, which the Go client (package client) shares.
package socketapi
