package webhooks

import (
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/syntaxvectors"
)

func TestSubscriptionDIDsFollowTheSpecificationsTestVectors(t *testing.T) {
	for _, did := range syntaxvectors.Valid(syntaxvectors.DID) {
		if err := CheckDID(did); err != nil {
			t.Errorf("CheckDID(%q) = %v, the specification says valid", did, err)
		}
	}
	for _, did := range append(syntaxvectors.Invalid(syntaxvectors.DID), "did:plc:"+strings.Repeat("a", 2041)) {
		if CheckDID(did) == nil {
			t.Errorf("CheckDID(%q) accepted, the specification says invalid", did)
		}
	}
}
