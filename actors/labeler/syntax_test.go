package labeler

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

// A label's subject is a DID or an AT-URI, and its cts/exp are datetimes:
// each check agrees with the AT Protocol interop test vectors.
func TestSubjectsAndTimesFollowTheSpecificationsTestVectors(t *testing.T) {
	db := testsupport.OpenDB(t)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	ctx := context.Background()
	malformed := func(uri string) bool {
		_, err := resolveSubject(ctx, tx, uri)
		return errors.Is(err, errMalformed)
	}

	for _, did := range testsupport.ValidVectors(testsupport.SyntaxDID) {
		if got, err := resolveSubject(ctx, tx, did); err != nil || got.did != did {
			t.Errorf("subject DID %q: %+v %v, the specification says valid", did, got, err)
		}
	}
	for _, did := range append(testsupport.InvalidVectors(testsupport.SyntaxDID), "did:plc:"+strings.Repeat("a", 2041)) {
		if strings.HasPrefix(did, "did:") && !malformed(did) {
			t.Errorf("subject DID %q (%d bytes) accepted, the specification says invalid", did, len(did))
		}
	}
	for _, uri := range testsupport.ValidVectors(testsupport.SyntaxATURI) {
		if malformed(uri) && strings.HasPrefix(uri, "at://did:") {
			t.Errorf("subject %q refused as malformed, the specification says valid", uri)
		}
	}
	for _, uri := range testsupport.InvalidVectors(testsupport.SyntaxATURI) {
		if !malformed(uri) {
			t.Errorf("subject %q not refused as malformed, the specification says invalid", uri)
		}
	}

	// Label times (cts, exp) go through internal/atproto, whose test
	// holds it to the datetime vectors; a comma before the fraction, which
	// indigo's pattern let through, is refused here too.
	if _, err := parseTime("2024-01-01T00:00:00,123Z"); err == nil {
		t.Error("a datetime with a comma before its fraction accepted")
	}
}

// A label's src (the labeler's DID, part of the takedown's key) is a DID
// by the specification, or the label is skipped as malformed before
// anything is written.
func TestLabelSourcesFollowTheSpecificationsTestVectors(t *testing.T) {
	for _, src := range append(testsupport.InvalidVectors(testsupport.SyntaxDID), "", "did:plc:"+strings.Repeat("a", 2041)) {
		l := Label{Src: src, URI: "did:plc:alice", Val: ValTakedown, Cts: "2024-01-01T00:00:00Z"}
		if err := new(store).applyLabel(context.Background(), nil, 1, l, 0, map[string]int{}); !errors.Is(err, errMalformed) {
			t.Errorf("label src %q: %v, want it refused as malformed", src, err)
		}
	}
}

// A label's cid is stored with it: a CID by the specification, or the
// label is skipped as malformed before anything is written (a NUL in it
// would otherwise reach the database, which refuses such text and would
// fail the frame).
func TestLabelCIDsFollowTheSpecificationsTestVectors(t *testing.T) {
	for _, cid := range append(testsupport.InvalidVectors(testsupport.SyntaxCID), "bafyrei\x00abcdefgh") {
		l := Label{Src: "did:plc:labeler", URI: "did:plc:alice", Val: ValTakedown, Cts: "2024-01-01T00:00:00Z", CID: cid}
		if err := new(store).applyLabel(context.Background(), nil, 1, l, 0, map[string]int{}); !errors.Is(err, errMalformed) {
			t.Errorf("label cid %q: %v, want it refused as malformed", cid, err)
		}
	}
}
