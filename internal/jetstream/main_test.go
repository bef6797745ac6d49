package jetstream

import (
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

// TestMain fails the package if any test leaves a goroutine behind: the
// client and the replay server both promise to stop everything they start.
func TestMain(m *testing.M) {
	testsupport.VerifyTestMain(m)
}
