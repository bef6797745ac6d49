package processor_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// TestAStoredStringWithANULIsRefusedNotCut: SQLite's C API ends text at
// a NUL, so a record whose stored text carried "\u0000" was written cut
// short ("v\u0000tail" as "v"), and two annotation keys differing after
// the NUL met on one row and lost the whole manifest. Every stored text
// field of every collection now refuses it as bad_value, and the same
// record without the NUL is applied.
func TestAStoredStringWithANULIsRefusedNotCut(t *testing.T) {
	const nul = `\u0000`
	cases := []struct {
		name, collection, rkey, did, record string
	}{
		{"annotation value", processor.CollectionManifest, "3m6v4ol3afk22", "did:plc:u1",
			`{"$type":"io.atcr.manifest","repository":"app","digest":"sha256:aa","mediaType":"m","schemaVersion":2,"createdAt":"2025-06-15T15:06:39Z","annotations":{"k":"v%stail"}}`},
		{"annotation key", processor.CollectionManifest, "3m6v4ol3afk22", "did:plc:u1",
			`{"$type":"io.atcr.manifest","repository":"app","digest":"sha256:aa","mediaType":"m","schemaVersion":2,"createdAt":"2025-06-15T15:06:39Z","annotations":{"k%sa":"1"}}`},
		{"manifest mediaType", processor.CollectionManifest, "3m6v4ol3afk22", "did:plc:u1",
			`{"$type":"io.atcr.manifest","repository":"app","digest":"sha256:aa","mediaType":"m%sx","schemaVersion":2,"createdAt":"2025-06-15T15:06:39Z"}`},
		{"layer mediaType", processor.CollectionManifest, "3m6v4ol3afk22", "did:plc:u1",
			`{"$type":"io.atcr.manifest","repository":"app","digest":"sha256:aa","mediaType":"m","schemaVersion":2,"createdAt":"2025-06-15T15:06:39Z","layers":[{"mediaType":"a%sb","digest":"sha256:bb","size":1}]}`},
		{"platform", processor.CollectionManifest, "3m6v4ol3afk22", "did:plc:u1",
			`{"$type":"io.atcr.manifest","repository":"app","digest":"sha256:aa","mediaType":"m","schemaVersion":2,"createdAt":"2025-06-15T15:06:39Z","manifests":[{"mediaType":"m","digest":"sha256:bb","size":1,"platform":{"os":"linux%sx","architecture":"amd64"}}]}`},
		{"repo page description", processor.CollectionRepoPage, "app", "did:plc:u1",
			`{"$type":"io.atcr.repo.page","repository":"app","description":"hello%sworld","createdAt":"2025-06-15T15:06:39Z","updatedAt":"2025-06-15T15:06:39Z"}`},
		{"captain region", processor.CollectionCaptain, "self", "did:web:hold.example",
			`{"$type":"io.atcr.hold.captain","owner":"did:plc:o","public":true,"allowAllCrew":false,"enableBlueskyPosts":false,"deployedAt":"2025-06-15T15:06:39Z","region":"r%sx"}`},
		{"crew tier", processor.CollectionCrew, "c1", "did:web:hold.example",
			`{"$type":"io.atcr.hold.crew","member":"did:plc:m","role":"write","permissions":["blob:write"],"addedAt":"2025-06-15T15:06:39Z","tier":"gold%sx"}`},
		{"crew permission", processor.CollectionCrew, "c1", "did:web:hold.example",
			`{"$type":"io.atcr.hold.crew","member":"did:plc:m","role":"write","permissions":["blob%s:write"],"addedAt":"2025-06-15T15:06:39Z"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, withNUL := range []bool{true, false} {
				db := testsupport.OpenDB(t)
				fill := ""
				if withNUL {
					fill = nul
				}
				rec := strings.Replace(tc.record, "%s", fill, 1)
				ev := jetstream.Event{DID: tc.did, TimeUS: 1750000000000100, Kind: jetstream.KindCommit, Commit: &jetstream.Commit{
					Rev: "3lrnqkdzhdqi2", Operation: "create", Collection: tc.collection, RKey: tc.rkey, Record: json.RawMessage(rec)}}
				p := processor.New(processor.Options{Log: zerolog.Nop()})
				res, err := p.Apply(context.Background(), db, unfenced, []jetstream.Event{ev})
				if err != nil {
					t.Fatal(err)
				}
				if withNUL && (res.Applied != 0 || res.Skipped[processor.ReasonBadValue] != 1) {
					t.Fatalf("with a NUL: result %+v, want it skipped as bad_value", res)
				}
				if !withNUL && res.Applied != 1 {
					t.Fatalf("without the NUL: result %+v, want it applied", res)
				}
			}
		})
	}
}
