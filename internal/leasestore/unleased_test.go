package leasestore_test

import (
	"context"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/leasestore"
	"github.com/atcr-io/appview/internal/testsupport"
)

// Every process start running with leases off has its own record, under
// one instance_id or not; a refresh keeps its start; its stop deletes
// only its own.
func TestUnleasedRecordsArePerProcessStart(t *testing.T) {
	ctx := context.Background()
	db := testsupport.OpenDB(t).DB
	a, b := leasestore.NewStore(db, time.Minute), leasestore.NewStore(db, time.Minute)
	if err := a.MarkUnleased(ctx, "solo", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.MarkUnleased(ctx, "solo", 2*time.Second); err != nil { // a second process, same instance_id
		t.Fatal(err)
	}
	all, err := leasestore.ListUnleased(ctx, db)
	if err != nil || len(all) != 2 {
		t.Fatalf("records %+v (%v), want one per process start", all, err)
	}
	// Listed in start order, which both sides compute alike (the two may
	// share a millisecond: then the nonce decides).
	if !leasestore.UnleasedBefore(all[0], all[1]) || leasestore.UnleasedBefore(all[1], all[0]) {
		t.Fatalf("records %+v not in UnleasedBefore's order", all)
	}
	byNonce := func(list []leasestore.UnleasedInstance, nonce string) leasestore.UnleasedInstance {
		for _, u := range list {
			if u.Nonce == nonce {
				return u
			}
		}
		t.Fatalf("no record of nonce %s in %+v", nonce, list)
		return leasestore.UnleasedInstance{}
	}
	ra, rb := byNonce(all, a.Nonce()), byNonce(all, b.Nonce())
	if !ra.Live() || ra.Every != time.Second || rb.Every != 2*time.Second || ra.Instance != "solo" {
		t.Fatalf("records %+v, %+v: want both live, refreshed every 1s and 2s", ra, rb)
	}
	if err := a.MarkUnleased(ctx, "solo", time.Second); err != nil {
		t.Fatal(err)
	}
	if again, err := leasestore.ListUnleased(ctx, db); err != nil || byNonce(again, a.Nonce()).StartedAt != ra.StartedAt {
		t.Fatalf("after a refresh %+v (%v), want a's start kept", again, err)
	}
	if err := a.UnmarkUnleased(ctx, "solo"); err != nil {
		t.Fatal(err)
	}
	if left, err := leasestore.ListUnleased(ctx, db); err != nil || len(left) != 1 || left[0].Nonce != b.Nonce() {
		t.Fatalf("after a's stop %+v (%v), want b's record only", left, err)
	}
	// Nothing a lease holder reads.
	if rows, err := leasestore.List(ctx, db); err != nil || len(rows) != 0 {
		t.Fatalf("lease rows %+v (%v) after leases-off records, want none", rows, err)
	}
}

// A record not refreshed within two of its intervals and the grace is
// overdue (a crashed process), and the next refresh of another process
// deletes it.
func TestAnOverdueUnleasedRecordIsNotLiveAndIsSweptByTheNextRefresh(t *testing.T) {
	ctx := context.Background()
	db := testsupport.OpenDB(t).DB
	crashed, live := leasestore.NewStore(db, time.Minute), leasestore.NewStore(db, time.Minute)
	if err := crashed.MarkUnleased(ctx, "crashed", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE unleased_instances SET seen_at = seen_at - 3100`); err != nil {
		t.Fatal(err)
	}
	all, err := leasestore.ListUnleased(ctx, db)
	if err != nil || len(all) != 1 || all[0].Live() || all[0].Overdue() > 0 {
		t.Fatalf("%+v (%v): want one overdue record (last refresh 3.1s ago, every 1s)", all, err)
	}
	if err := live.MarkUnleased(ctx, "live", time.Second); err != nil {
		t.Fatal(err)
	}
	if all, err := leasestore.ListUnleased(ctx, db); err != nil || len(all) != 1 || all[0].Instance != "live" {
		t.Fatalf("after another refresh %+v (%v), want only the live record", all, err)
	}
}
