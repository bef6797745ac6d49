package processor_test

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// Revs of one repo, in increasing order (TIDs compare as strings).
const (
	rev1 = "3lrnqkdzhdq22"
	rev2 = "3lrnqkdzhdq23"
	rev3 = "3lrnqkdzhdq24"
)

// at is a commit event with a rev: the version that orders it.
func at(did string, us int64, rev, op, collection, rkey string, record any) jetstream.Event {
	ev := commit(did, us, op, collection, rkey, record)
	ev.Commit.Rev = rev
	return ev
}

func applyAll(t *testing.T, db *database.DB, events ...jetstream.Event) processor.Result {
	t.Helper()
	res, err := processor.New(processor.Options{Log: zerolog.Nop()}).Apply(context.Background(), db, unfenced, events)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return res
}

func queryInt(t *testing.T, db *database.DB, q string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// Two updates of a hold's stats in one millisecond (same updatedAt): the
// later commit (newer rev) holds the hold's current counts. Ordering by
// updatedAt kept the first and left the repository's totals wrong.
func TestTwoHoldStatsUpdatesInOneMillisecondAreOrderedByRev(t *testing.T) {
	db := testsupport.OpenDB(t)
	const hold, owner = "did:web:hold.example", "did:plc:owner"
	stats := func(us int64, rev string, pull int) jetstream.Event {
		return at(hold, us, rev, "update", processor.CollectionStats, "rk", map[string]any{
			"ownerDid": owner, "repository": "app", "pullCount": pull, "pushCount": 1,
			"updatedAt": "2026-01-01T00:00:00.123Z"})
	}
	res := applyAll(t, db, stats(100, rev1, 7), stats(101, rev2, 8))
	if res.Applied != 2 {
		t.Fatalf("result %+v: want both updates applied", res)
	}
	if got := queryInt(t, db, `SELECT pull_count FROM repository_stats WHERE did = ?`, owner); got != 8 {
		t.Fatalf("repository_stats.pull_count = %d, want 8 (the later commit)", got)
	}
	// A replay of the older commit changes nothing.
	applyAll(t, db, stats(102, rev1, 7))
	if got := queryInt(t, db, `SELECT pull_count FROM repository_hold_stats WHERE did = ?`, owner); got != 8 {
		t.Fatalf("after replaying the older commit pull_count = %d, want 8", got)
	}
}

// After a Jetstream failover each host stamps time_us on its own clock: a
// delete stamped early by one host must still win over an older update
// stamped late by another, and a re-create stamped early must still win
// over the delete before it.
func TestRevsOrderChangesAcrossJetstreamHostsWhateverTheirTimeUS(t *testing.T) {
	db := testsupport.OpenDB(t)
	const alice, owner = "did:plc:alice", "did:plc:owner"
	star := map[string]any{"subject": map[string]any{"did": owner, "repository": "app"}, "createdAt": "2026-01-01T00:00:00Z"}
	// Host A saw the create (rev1) and the delete (rev3); host B, whose
	// clock runs ahead, delivers the older update (rev2) afterwards.
	applyAll(t, db,
		at(alice, 1000, rev1, "create", processor.CollectionStar, "s1", star),
		at(alice, 2000, rev3, "delete", processor.CollectionStar, "s1", nil),
		at(alice, 9000, rev2, "update", processor.CollectionStar, "s1", star),
	)
	if n := countRows(t, db, "stars"); n != 0 {
		t.Fatalf("%d stars after a delete with the newest rev, want 0", n)
	}
	if got := queryInt(t, db, `SELECT star_count FROM repository_stats WHERE did = ?`, owner); got != 0 {
		t.Fatalf("star_count = %d, want 0", got)
	}
	// A tag deleted (rev2, stamped late by host B) and re-created (rev3,
	// stamped early by host A) stays.
	applyAll(t, db,
		at(alice, 5000, rev1, "create", processor.CollectionTag, "t1", tagRecord("app", "latest", "sha256:1")),
		at(alice, 8000, rev2, "delete", processor.CollectionTag, "t1", nil),
		at(alice, 6000, rev3, "create", processor.CollectionTag, "t1", tagRecord("app", "latest", "sha256:2")),
	)
	if got := queryInt(t, db, `SELECT COUNT(*) FROM tags WHERE did = ? AND digest = 'sha256:2'`, alice); got != 1 {
		t.Fatalf("re-created tag: %d rows, want 1", got)
	}
}

// One commit (one rev) cannot hold two operations on one record; if a
// delete and a create of one record arrive with the same rev anyway, the
// delete wins in either arrival order, so hosts and replays agree.
func TestADeleteAndACreateWithTheSameRevEndDeletedInEitherOrder(t *testing.T) {
	const alice = "did:plc:alice"
	create := at(alice, 100, rev2, "create", processor.CollectionTag, "t1", tagRecord("app", "latest", "sha256:1"))
	del := at(alice, 100, rev2, "delete", processor.CollectionTag, "t1", nil)
	for name, events := range map[string][]jetstream.Event{
		"create then delete": {create, del},
		"delete then create": {del, create},
	} {
		t.Run(name, func(t *testing.T) {
			db := testsupport.OpenDB(t)
			applyAll(t, db, events...)
			applyAll(t, db, events...) // and again, as a replay
			if n := countRows(t, db, "tags"); n != 0 {
				t.Fatalf("%d tags, want 0", n)
			}
		})
	}
}

// A row written by an event without a rev (a row from before migration
// 0008, or a backfill read) is replaced by any event with a rev, whatever
// its time_us; an event without a rev never replaces a row with one.
func TestAnEventWithARevReplacesARowWrittenWithoutOne(t *testing.T) {
	db := testsupport.OpenDB(t)
	const alice = "did:plc:alice"
	page := func(desc string) map[string]any {
		return map[string]any{"repository": "app", "description": desc,
			"createdAt": "2026-01-01T00:00:00Z", "updatedAt": "2026-01-01T00:00:00Z"}
	}
	applyAll(t, db, commit(alice, 9_000_000, "create", processor.CollectionRepoPage, "app", page("backfilled")))
	applyAll(t, db, at(alice, 1_000, rev1, "update", processor.CollectionRepoPage, "app", page("live")))
	var desc string
	if err := db.QueryRow(`SELECT description FROM repo_pages WHERE did = ?`, alice).Scan(&desc); err != nil || desc != "live" {
		t.Fatalf("description = %q (%v), want live: an event with a rev replaces a row without one", desc, err)
	}
	applyAll(t, db, commit(alice, 99_000_000, "update", processor.CollectionRepoPage, "app", page("stale read")))
	if err := db.QueryRow(`SELECT description FROM repo_pages WHERE did = ?`, alice).Scan(&desc); err != nil || desc != "live" {
		t.Fatalf("description = %q (%v), want live: an event without a rev never replaces one with a rev", desc, err)
	}
}

func TestARevThatIsNotATIDIsSkippedAsBadValue(t *testing.T) {
	db := testsupport.OpenDB(t)
	res := applyAll(t, db,
		at("did:plc:alice", 1, "3lrnqkdzhdq2", "create", processor.CollectionTag, "t1", tagRecord("app", "a", "sha256:1")),  // 12 chars
		at("did:plc:alice", 2, "zlrnqkdzhdq22", "create", processor.CollectionTag, "t2", tagRecord("app", "b", "sha256:1")), // top bit set
		at("did:plc:alice", 3, "3lrnqkdzhdq21", "create", processor.CollectionTag, "t3", tagRecord("app", "c", "sha256:1")), // '1' is not base32-sortable
		at("did:plc:alice", 4, rev1, "create", processor.CollectionTag, "t4", tagRecord("app", "d", "sha256:1")),
	)
	if res.Skipped[processor.ReasonBadValue] != 3 || res.Applied != 1 {
		t.Fatalf("result %+v: want 3 bad_value skips and 1 applied", res)
	}
}
