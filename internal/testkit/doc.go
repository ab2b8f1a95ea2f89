// Package testkit holds, in its sub-packages, what the tests use and the
// agent does not: agentbin (builds the lockagent binary for tests that run
// it), agenttest (an agent in the test's process), faultproxy (a TCP proxy
// that injects faults), lockcheck (checkers of lock histories), redistest
// (real redis-server processes, Clusters and Sentinels) and chaos (the
// safety suite). Production code lives in the other packages of internal.
package testkit

import "testing"

// SkipShort skips tb under `go test -short`, which runs the quick suites
// only: tb runs what it says, real processes or a long workload. The whole
// run (.ci/run) never sets -short.
func SkipShort(tb testing.TB, what string) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("-short: this test runs " + what)
	}
}
