//go:build race

package tests

// raceEnabled builds the appview binary under test with -race when the
// tests themselves run with -race.
const raceEnabled = true
