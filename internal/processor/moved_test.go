package processor_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// revCommit is a commit with the rev a PDS would give it at us.
func revCommit(did string, us int64, op, collection, rkey, record string) jetstream.Event {
	c := &jetstream.Commit{Rev: syntax.NewTID(us, 0).String(), Operation: op, Collection: collection, RKey: rkey}
	if record != "" {
		c.Record = json.RawMessage(record)
	}
	return jetstream.Event{DID: did, TimeUS: us, Kind: jetstream.KindCommit, Commit: c}
}

// An update that changes what a record names (another tag, digest,
// repository or owner at the same rkey) left the row of the old version
// behind: one record, two rows. The record at an rkey is one row, the
// newest version's.
func TestAnUpdateThatMovesARecordLeavesNoRowBehind(t *testing.T) {
	const (
		alice = "did:plc:alice"
		hold  = "did:web:hold.example"
		t0    = int64(1764547200000000)
	)
	d := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	manifest := func(repo, digest string) string {
		return `{"$type":"io.atcr.manifest","repository":"` + repo + `","digest":"` + digest +
			`","mediaType":"application/vnd.oci.image.manifest.v1+json","schemaVersion":2,"createdAt":"2026-01-01T00:00:00Z","annotations":{"k":"v"}}`
	}
	tag := func(repo, name, digest string) string {
		return `{"$type":"io.atcr.tag","repository":"` + repo + `","tag":"` + name + `","manifestDigest":"` + digest + `"}`
	}
	page := func(repo string) string {
		return `{"$type":"io.atcr.repo.page","repository":"` + repo + `","createdAt":"2026-01-01T00:00:00Z","updatedAt":"2026-01-01T00:00:00Z"}`
	}
	stats := func(repo string, pulls int) string {
		return `{"$type":"io.atcr.hold.stats","ownerDid":"` + alice + `","repository":"` + repo + `","pullCount":` +
			strings.Repeat("1", pulls) + `,"pushCount":1,"updatedAt":"2026-01-01T00:00:00Z"}`
	}
	db := testsupport.OpenDB(t)
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	apply := func(events ...jetstream.Event) {
		t.Helper()
		res, err := p.Apply(context.Background(), db, unfenced, events)
		if err != nil || len(res.Skipped) != 0 {
			t.Fatalf("apply: %+v, %v", res, err)
		}
	}
	apply(
		revCommit(alice, t0+1, "create", processor.CollectionManifest, "3m6v4ol3afk22", manifest("app", d("1"))),
		revCommit(alice, t0+2, "create", processor.CollectionTag, "same", tag("r1", "one", d("1"))),
		revCommit(alice, t0+3, "create", processor.CollectionRepoPage, "pg", page("old")),
		revCommit(hold, t0+4, "create", processor.CollectionStats, "hmove", stats("moveA", 1)),
	)
	apply(
		revCommit(alice, t0+11, "update", processor.CollectionManifest, "3m6v4ol3afk22", manifest("app", d("2"))),
		revCommit(alice, t0+12, "update", processor.CollectionTag, "same", tag("r1", "two", d("2"))),
		revCommit(alice, t0+13, "update", processor.CollectionRepoPage, "pg", page("new")),
		revCommit(hold, t0+14, "update", processor.CollectionStats, "hmove", stats("moveB", 2)),
	)
	rows := func(q string) []string {
		t.Helper()
		out, err := database.Column(context.Background(), db.DB, q)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for q, want := range map[string]string{
		`SELECT repository || ' ' || digest FROM manifests ORDER BY 1`:                      "app " + d("2"),
		`SELECT count(*) FROM manifest_annotations`:                                         "1",
		`SELECT repository || ':' || tag FROM tags ORDER BY 1`:                              "r1:two",
		`SELECT repository FROM repo_pages ORDER BY 1`:                                      "new",
		`SELECT repository || ' ' || pull_count FROM repository_hold_stats ORDER BY 1`:      "moveB 11",
		`SELECT repository || ' ' || pull_count FROM repository_stats WHERE pull_count > 0`: "moveB 11",
	} {
		if got := strings.Join(rows(q), ","); got != want {
			t.Errorf("%s: %q, want %q", q, got, want)
		}
	}
	// Another record naming the same row is not touched by the move: a
	// second tag record for r1:two at another rkey, then the first record
	// moves on again.
	apply(
		revCommit(alice, t0+21, "create", processor.CollectionTag, "other", tag("r1", "three", d("2"))),
		revCommit(alice, t0+22, "update", processor.CollectionTag, "same", tag("r1", "four", d("2"))),
	)
	if got := strings.Join(rows(`SELECT repository || ':' || tag || '@' || rkey FROM tags ORDER BY 1`), ","); got != "r1:four@same,r1:three@other" {
		t.Errorf("tags %q, want r1:four@same,r1:three@other", got)
	}
}

// A read older than a move (a backfill page read before the record was
// renamed, applied after) brought the old name back beside the new one:
// the old name's row was gone, so its upsert had nothing to lose to. A
// read is now dropped when a newer version of the same record was
// applied under any name.
func TestAReadOlderThanAMoveDoesNotBringTheOldNameBack(t *testing.T) {
	const (
		alice = "did:plc:alice"
		t0    = int64(1764547200000000)
	)
	tag := func(name string) string {
		return `{"$type":"io.atcr.tag","repository":"app","tag":"` + name + `","manifestDigest":"sha256:` + strings.Repeat("a", 64) + `"}`
	}
	db := testsupport.OpenDB(t)
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	read := revCommit(alice, t0+1, "create", processor.CollectionTag, "lv", tag("stale"))
	read.Commit.Rev = "" // a backfill read: the no-rev version, below every TID
	older := revCommit(alice, t0+2, "update", processor.CollectionTag, "lv", tag("older"))
	for _, events := range [][]jetstream.Event{
		{revCommit(alice, t0+10, "create", processor.CollectionTag, "lv", tag("live")),
			revCommit(alice, t0+11, "update", processor.CollectionTag, "lv", tag("renamed"))},
		{read},
		{older}, // a re-read's update stamped with a rev older than the move
	} {
		if _, err := p.Apply(context.Background(), db, unfenced, events); err != nil {
			t.Fatal(err)
		}
	}
	got, err := database.Column(context.Background(), db.DB, `SELECT tag FROM tags ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "renamed" {
		t.Fatalf("tags %v, want only the newest version's name", got)
	}
}
