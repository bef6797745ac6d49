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
