//go:build soak

package lease

import (
	"testing"
	"time"
)

// TestSoakRenewalsAreNotStarvedForAMinute is the starvation test of
// starve_test.go run for a minute (scripts/soak).
func TestSoakRenewalsAreNotStarvedForAMinute(t *testing.T) {
	starve(t, time.Minute)
}
