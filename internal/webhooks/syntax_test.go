package webhooks

import (
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

func TestSubscriptionDIDsFollowTheSpecificationsTestVectors(t *testing.T) {
	for _, did := range testsupport.ValidVectors(testsupport.SyntaxDID) {
		if err := CheckDID(did); err != nil {
			t.Errorf("CheckDID(%q) = %v, the specification says valid", did, err)
		}
	}
	for _, did := range append(testsupport.InvalidVectors(testsupport.SyntaxDID), "did:plc:"+strings.Repeat("a", 2041)) {
		if CheckDID(did) == nil {
			t.Errorf("CheckDID(%q) accepted, the specification says invalid", did)
		}
	}
}

// An over-long DID is refused in one readable line, quoting its start.
func TestAnOverLongDIDIsRefusedInOneShortLine(t *testing.T) {
	for _, did := range []string{"did:plc:" + strings.Repeat("a", 3000), "did:plc:" + strings.Repeat("!", 1000)} {
		err := CheckDID(did)
		if err == nil || len(err.Error()) > 200 || !strings.Contains(err.Error(), "did:plc:aaa") && !strings.Contains(err.Error(), "did:plc:!!!") {
			t.Errorf("CheckDID(%d bytes) = %v; want a refusal under 200 bytes quoting its start", len(did), err)
		}
	}
}
