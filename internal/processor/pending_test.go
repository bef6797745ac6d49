package processor_test

import (
	"context"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// A tag naming its manifest by at-uri only, committed before that
// manifest record was stored, was skipped for good (unresolved_manifest):
// the manifest arrived in the next event and the tag never appeared.
// Any event may arrive late: the tag is now kept pending until its
// manifest arrives, and dropped if its record is deleted first. A tag
// naming a deleted manifest is still skipped.
func TestATagWhoseManifestArrivesLaterIsWrittenWhenItDoes(t *testing.T) {
	const (
		alice = "did:plc:alice"
		t0    = int64(1764547200000000)
		mrkey = "3m6v4okrju222"
	)
	digest := "sha256:" + strings.Repeat("a", 64)
	manifest := `{"$type":"io.atcr.manifest","repository":"app","digest":"` + digest +
		`","mediaType":"application/vnd.oci.image.manifest.v1+json","schemaVersion":2,"createdAt":"2026-01-01T00:00:00Z"}`
	tag := func(name, rkey string) string {
		return `{"$type":"io.atcr.tag","repository":"app","tag":"` + name + `","manifest":"at://` + alice + `/io.atcr.manifest/` + rkey + `"}`
	}
	for _, tc := range []struct {
		split, session bool
	}{{false, false}, {true, false}, {false, true}, {true, true}} {
		split := tc.split
		db := testsupport.OpenDB(t)
		p := processor.New(processor.Options{Log: zerolog.Nop()})
		// Apply, and a session that preloads which DIDs have pending
		// tags, as the consumer's does (its read once failed on every
		// batch of a DID with a pending tag, which lost them all).
		apply := func(events ...jetstream.Event) processor.Result {
			t.Helper()
			if tc.session {
				return applySession(t, p, db, events, 2)
			}
			res, err := p.Apply(context.Background(), db, unfenced, events)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		events := []jetstream.Event{
			revCommit(alice, t0+1, "create", processor.CollectionTag, "early", tag("latest", mrkey)),
			revCommit(alice, t0+2, "create", processor.CollectionTag, "gone", tag("old", mrkey)),
			revCommit(alice, t0+3, "delete", processor.CollectionTag, "gone", ""),
			revCommit(alice, t0+4, "create", processor.CollectionManifest, mrkey, manifest),
		}
		if split { // the manifest in a later batch
			apply(events[:3]...)
			apply(events[3:]...)
		} else {
			apply(events...)
		}
		var got string
		if err := db.QueryRow(`SELECT group_concat(tag || '=' || digest || '@' || rkey) FROM tags`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != "latest="+digest+"@early" {
			t.Errorf("%+v: tags %q, want latest at the manifest's digest (and not the deleted tag)", tc, got)
		}
		if n := countRows(t, db, "pending_tags"); n != 0 {
			t.Errorf("%+v: %d pending tags left", tc, n)
		}
		// A manifest deleted before it was ever stored: the tag waiting
		// for it waits for nothing.
		apply(revCommit(alice, t0+5, "create", processor.CollectionTag, "orphan", tag("orphan", "3m6v4okrju333")),
			revCommit(alice, t0+6, "delete", processor.CollectionManifest, "3m6v4okrju333", ""))
		if n := countRows(t, db, "pending_tags"); n != 0 {
			t.Errorf("%+v: %d pending tags left after their manifest was deleted", tc, n)
		}
		// A tag naming a manifest deleted since is dangling.
		res := apply(
			revCommit(alice, t0+7, "delete", processor.CollectionManifest, mrkey, ""),
			revCommit(alice, t0+8, "create", processor.CollectionTag, "late", tag("late", mrkey)),
		)
		if res.Skipped[processor.ReasonUnresolvedManifest] != 1 || countRows(t, db, "pending_tags") != 0 {
			t.Errorf("%+v: a tag of a deleted manifest: %+v, want it skipped as unresolved_manifest", tc, res)
		}
	}
}
