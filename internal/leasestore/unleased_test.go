package leasestore_test

import (
	"context"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/leasestore"
	"github.com/atcr-io/appview/internal/testsupport"
)

// An instance running with leases off is seen by the others while its
// record is fresh, never by itself, and not after its stop; the record of
// another process start under its instance_id outlives that stop.
func TestUnleasedRecordsAreSeenByOtherInstancesOnly(t *testing.T) {
	ctx := context.Background()
	db := testsupport.OpenDB(t).DB
	a := leasestore.NewStore(db, time.Minute)
	if err := a.MarkUnleased(ctx, "solo"); err != nil {
		t.Fatal(err)
	}
	if err := a.MarkUnleased(ctx, "solo"); err != nil { // a refresh
		t.Fatal(err)
	}
	seen, err := leasestore.UnleasedOthers(ctx, db, "other", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0].Instance != "solo" || seen[0].Age < 0 || seen[0].Age > time.Minute {
		t.Fatalf("another instance sees %+v, want solo, seen just now", seen)
	}
	if own, err := leasestore.UnleasedOthers(ctx, db, "solo", time.Minute); err != nil || len(own) != 0 {
		t.Fatalf("the instance itself sees %+v (%v), want nothing", own, err)
	}
	// Nothing a lease holder reads: no contender of any lease, and the
	// lease table is untouched.
	if rows, err := leasestore.List(ctx, db); err != nil || len(rows) != 0 {
		t.Fatalf("lease rows %+v (%v) after a leases-off record, want none", rows, err)
	}

	// A later process start under the same instance_id replaces the
	// record; the first one's stop leaves it.
	b := leasestore.NewStore(db, time.Minute)
	if err := b.MarkUnleased(ctx, "solo"); err != nil {
		t.Fatal(err)
	}
	if err := a.UnmarkUnleased(ctx, "solo"); err != nil {
		t.Fatal(err)
	}
	if seen, err := leasestore.UnleasedOthers(ctx, db, "other", time.Minute); err != nil || len(seen) != 1 {
		t.Fatalf("after the earlier start's stop another instance sees %+v (%v), want the later start's record", seen, err)
	}
	if err := b.UnmarkUnleased(ctx, "solo"); err != nil {
		t.Fatal(err)
	}
	if seen, err := leasestore.UnleasedOthers(ctx, db, "other", time.Minute); err != nil || len(seen) != 0 {
		t.Fatalf("after the stop another instance sees %+v (%v), want nothing", seen, err)
	}
}

// A record not refreshed within the window (an instance that crashed)
// stops counting.
func TestAStaleUnleasedRecordDoesNotCount(t *testing.T) {
	ctx := context.Background()
	db := testsupport.OpenDB(t).DB
	if err := leasestore.NewStore(db, time.Minute).MarkUnleased(ctx, "crashed"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE lease_contenders SET seen_at = seen_at - 60000 WHERE name = ?1`, leasestore.UnleasedMark); err != nil {
		t.Fatal(err)
	}
	if seen, err := leasestore.UnleasedOthers(ctx, db, "other", 30*time.Second); err != nil || len(seen) != 0 {
		t.Fatalf("a record last refreshed a minute ago counts within 30s: %+v (%v)", seen, err)
	}
	if seen, err := leasestore.UnleasedOthers(ctx, db, "other", 2*time.Minute); err != nil || len(seen) != 1 {
		t.Fatalf("within 2m: %+v (%v), want the record", seen, err)
	}
}
