package jetstream

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

// Every identifier check of this package (the event's repo DID,
// wantedDids of the replay server, wantedCollections of client and replay
// server) agrees with the AT Protocol interop test vectors.
func TestIdentifierChecksFollowTheSpecificationsTestVectors(t *testing.T) {
	event := func(did string) []byte {
		b, _ := json.Marshal(map[string]any{"did": did, "time_us": MinEventTimeUS, "kind": "identity",
			"identity": map[string]any{"did": did, "seq": 1, "time": "2024-01-01T00:00:00Z"}})
		return b
	}
	for _, did := range testsupport.ValidVectors(testsupport.SyntaxDID) {
		if _, err := Decode(event(did)); err != nil {
			t.Errorf("event of DID %q refused, the specification says valid: %v", did, err)
		}
		if err := new(replayConn).setOptions(optionsUpdate{WantedDIDs: []string{did}}); err != nil {
			t.Errorf("wantedDids %q refused, the specification says valid: %v", did, err)
		}
	}
	for _, did := range append(testsupport.InvalidVectors(testsupport.SyntaxDID), "did:plc:"+strings.Repeat("a", 2041)) {
		if _, err := Decode(event(did)); ClassOf(err) != ClassInvalidEvent {
			t.Errorf("event of DID %q: error %v, want %s (the specification says invalid)", did, err, ClassInvalidEvent)
		}
		if err := new(replayConn).setOptions(optionsUpdate{WantedDIDs: []string{did}}); err == nil {
			t.Errorf("wantedDids %q accepted, the specification says invalid", did)
		}
	}
	for _, col := range testsupport.ValidVectors(testsupport.SyntaxNSID) {
		if _, err := newCollectionFilter([]string{col}); err != nil {
			t.Errorf("wantedCollections %q refused, the specification says valid: %v", col, err)
		}
	}
	for _, col := range testsupport.InvalidVectors(testsupport.SyntaxNSID) {
		if _, err := newCollectionFilter([]string{col}); err == nil && !strings.HasSuffix(col, ".*") {
			t.Errorf("wantedCollections %q accepted, the specification says invalid", col)
		}
	}
}
