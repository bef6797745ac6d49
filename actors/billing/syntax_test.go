package billing

import (
	"encoding/json"
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

// The DID a subscription's metadata names is checked by the DID syntax:
// a malformed one maps the subscription to nobody.
func TestSubscriptionDIDsFollowTheSpecificationsTestVectors(t *testing.T) {
	sub := func(did string) stripeSubscription {
		var s stripeSubscription
		raw := `{"items":{"data":[{"price":{"metadata":{"` + MetadataTierRank + `":"1"}}}]}}`
		if err := json.Unmarshal([]byte(raw), &s); err != nil {
			t.Fatal(err)
		}
		s.Metadata = map[string]string{MetadataDID: did}
		return s
	}
	for _, did := range testsupport.ValidVectors(testsupport.SyntaxDID) {
		if got, _, ok := subscriptionTier(sub(did)); !ok || got != did {
			t.Errorf("subscription of %q: %q %v, the specification says valid", did, got, ok)
		}
	}
	for _, did := range testsupport.InvalidVectors(testsupport.SyntaxDID) {
		if got, _, ok := subscriptionTier(sub(did)); ok && got == did {
			t.Errorf("subscription of %q accepted, the specification says invalid", did)
		}
	}
}
