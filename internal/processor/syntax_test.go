package processor

import (
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/testsupport"
)

// The processor's identifier checks agree with the AT Protocol interop
// test vectors, value by value.
func TestIdentifierChecksFollowTheSpecificationsTestVectors(t *testing.T) {
	checks := []struct {
		kind  string
		check func(string) bool
	}{
		{testsupport.SyntaxDID, validDID},
		{testsupport.SyntaxRecordKey, validRKey},
		{testsupport.SyntaxHandle, validHandle},
		{testsupport.SyntaxTID, validTID}, // revs: the version of every record
		{testsupport.SyntaxDatetime, func(s string) bool {
			var c check
			c.datetime("createdAt", &s)
			return c.err == nil
		}},
	}
	for _, tc := range checks {
		for _, s := range testsupport.ValidVectors(tc.kind) {
			if !tc.check(s) {
				t.Errorf("%s %q refused, the specification says valid", tc.kind, s)
			}
		}
		for _, s := range testsupport.InvalidVectors(tc.kind) {
			if tc.check(s) {
				t.Errorf("%s %q accepted, the specification says invalid", tc.kind, s)
			}
		}
	}
}

// parseATURI takes only record URIs (DID authority, collection and key):
// every spec-invalid AT-URI is refused, and every spec-valid one of that
// shape is accepted.
func TestRecordURIsFollowTheSpecificationsTestVectors(t *testing.T) {
	accepted := 0
	for _, s := range testsupport.ValidVectors(testsupport.SyntaxATURI) {
		parts := strings.Split(strings.TrimPrefix(s, "at://"), "/")
		want := len(parts) == 3 && strings.HasPrefix(parts[0], "did:")
		if _, _, _, ok := parseATURI(s); ok != want {
			t.Errorf("parseATURI(%q) ok = %v, want %v", s, ok, want)
		}
		if want {
			accepted++
		}
	}
	if accepted == 0 {
		t.Fatal("no valid record AT-URI among the vectors: the test checks nothing")
	}
	for _, s := range append(testsupport.InvalidVectors(testsupport.SyntaxATURI), "at://did:plc:asdf123/short/stuff") {
		if _, _, _, ok := parseATURI(s); ok {
			t.Errorf("parseATURI(%q) accepted, the specification says invalid", s)
		}
	}
}

// The cases the issue names, through the decoder a commit takes.
func TestDecodeRefusesWhatTheSpecificationRefuses(t *testing.T) {
	commit := func(rkey, record string) *jetstream.Event {
		return &jetstream.Event{DID: "did:plc:alice", TimeUS: 1, Kind: jetstream.KindCommit,
			Commit: &jetstream.Commit{Operation: jetstream.OpCreate, Collection: CollectionTag, RKey: rkey, Record: []byte(record)}}
	}
	for name, ev := range map[string]*jetstream.Event{
		"hour of one digit":      commit("latest", `{"repository":"r","tag":"latest","manifestDigest":"sha256:x","createdAt":"1985-04-12T3:20:50Z"}`),
		"offset -00:00":          commit("latest", `{"repository":"r","tag":"latest","manifestDigest":"sha256:x","createdAt":"1985-04-12T23:20:50-00:00"}`),
		"collection not an NSID": commit("latest", `{"repository":"r","tag":"latest","manifest":"at://did:plc:asdf123/short/stuff"}`),
		"DID over 2048 bytes": {DID: "did:plc:" + strings.Repeat("a", 2041), TimeUS: 1, Kind: jetstream.KindIdentity,
			Identity: &jetstream.Identity{DID: "did:plc:" + strings.Repeat("a", 2041)}},
		"handle not a DNS name": {DID: "did:plc:alice", TimeUS: 1, Kind: jetstream.KindIdentity,
			Identity: &jetstream.Identity{DID: "did:plc:alice", Handle: "alice.test "}},
		// A NUL was refused by the database instead (db_error), and the
		// takedown it carried was not applied.
		"account status with a NUL": {DID: "did:plc:alice", TimeUS: 1, Kind: jetstream.KindAccount,
			Account: &jetstream.Account{DID: "did:plc:alice", Active: new(bool), Status: "takendown\x00evil"}},
	} {
		if _, reason, err := decode(ev); reason != ReasonBadValue {
			t.Errorf("%s: reason %q (%v), want %q", name, reason, err, ReasonBadValue)
		}
	}
	ok := commit("latest", `{"repository":"r","tag":"latest","manifest":"at://did:plc:asdf123/io.atcr.manifest/3jzfcijpj2z2a","createdAt":"1985-04-12T23:20:50.123+00:00"}`)
	if _, reason, err := decode(ok); reason != "" {
		t.Errorf("a valid tag refused: %s %v", reason, err)
	}
}

func TestHoldDIDFromEndpointRefusesHostsNoDIDCanName(t *testing.T) {
	for _, endpoint := range []string{"https://[::1]:8080", "https://hold%20one.example"} {
		if did, err := HoldDIDFromEndpoint(endpoint); err == nil {
			t.Errorf("HoldDIDFromEndpoint(%q) = %q, want an error", endpoint, did)
		}
	}
	if did, err := HoldDIDFromEndpoint("https://hold01.example.com:8443/x"); err != nil || did != "did:web:hold01.example.com%3A8443:x" {
		t.Errorf("got %q %v", did, err)
	}
}

// A commit's cid is stored with its manifest: a CID by the specification
// (its test vectors), or the event is a bad value; a commit without one
// (the backfill's reads of old records) is kept.
func TestCommitCIDsFollowTheSpecificationsTestVectors(t *testing.T) {
	commit := func(cid string) *jetstream.Event {
		return &jetstream.Event{DID: "did:plc:alice", TimeUS: 1, Kind: jetstream.KindCommit,
			Commit: &jetstream.Commit{Operation: jetstream.OpCreate, Collection: CollectionTag, RKey: "latest", CID: cid,
				Record: []byte(`{"repository":"r","tag":"latest","manifestDigest":"sha256:x"}`)}}
	}
	for _, cid := range append(testsupport.ValidVectors(testsupport.SyntaxCID), "") {
		if _, reason, err := decode(commit(cid)); reason != "" {
			t.Errorf("cid %q refused (%s %v), the specification says valid", cid, reason, err)
		}
	}
	for _, cid := range append(testsupport.InvalidVectors(testsupport.SyntaxCID), "bafyrei\x00abcdefgh") {
		if _, reason, _ := decode(commit(cid)); reason != ReasonBadValue {
			t.Errorf("cid %q: reason %q, want %q", cid, reason, ReasonBadValue)
		}
	}
}
