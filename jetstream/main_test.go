package jetstream

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: the
// client and the replay server both promise to stop everything they start.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
