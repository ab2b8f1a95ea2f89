//go:build !race

package chaos

// raceEnabled tells Build to build the agent with the race detector, as the
// tests themselves are.
const raceEnabled = false
