package system_test

import (
	"context"
	"testing"
	"time"

	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/system"
)

// Every process start running with leases off has its own record, under
// one instance_id or not; a refresh keeps its start; its stop deletes
// only its own.
func TestUnleasedRecordsArePerProcessStart(t *testing.T) {
	ctx := context.Background()
	db := testsupport.OpenDB(t)
	a, b := lease.NewStore(db, time.Minute), lease.NewStore(db, time.Minute)
	if err := system.MarkUnleased(ctx, db, "solo", a.Nonce(), time.Second); err != nil {
		t.Fatal(err)
	}
	if err := system.MarkUnleased(ctx, db, "solo", b.Nonce(), 2*time.Second); err != nil { // a second process, same instance_id
		t.Fatal(err)
	}
	all, err := system.ListUnleased(ctx, db)
	if err != nil || len(all) != 2 {
		t.Fatalf("records %+v (%v), want one per process start", all, err)
	}
	// Listed in start order, which both sides compute alike (the two may
	// share a millisecond: then the nonce decides).
	if !system.UnleasedBefore(all[0], all[1]) || system.UnleasedBefore(all[1], all[0]) {
		t.Fatalf("records %+v not in UnleasedBefore's order", all)
	}
	byNonce := func(list []system.UnleasedInstance, nonce string) system.UnleasedInstance {
		for _, u := range list {
			if u.Nonce == nonce {
				return u
			}
		}
		t.Fatalf("no record of nonce %s in %+v", nonce, list)
		return system.UnleasedInstance{}
	}
	ra, rb := byNonce(all, a.Nonce()), byNonce(all, b.Nonce())
	if !ra.Live() || ra.Every != time.Second || rb.Every != 2*time.Second || ra.Instance != "solo" {
		t.Fatalf("records %+v, %+v: want both live, refreshed every 1s and 2s", ra, rb)
	}
	if err := system.MarkUnleased(ctx, db, "solo", a.Nonce(), time.Second); err != nil {
		t.Fatal(err)
	}
	if again, err := system.ListUnleased(ctx, db); err != nil || byNonce(again, a.Nonce()).StartedAt != ra.StartedAt {
		t.Fatalf("after a refresh %+v (%v), want a's start kept", again, err)
	}
	if err := system.UnmarkUnleased(ctx, db, "solo", a.Nonce()); err != nil {
		t.Fatal(err)
	}
	if left, err := system.ListUnleased(ctx, db); err != nil || len(left) != 1 || left[0].Nonce != b.Nonce() {
		t.Fatalf("after a's stop %+v (%v), want b's record only", left, err)
	}
	// Nothing a lease holder reads.
	if rows, err := fence.List(ctx, db); err != nil || len(rows) != 0 {
		t.Fatalf("lease rows %+v (%v) after leases-off records, want none", rows, err)
	}
}

// A record not refreshed within two of its intervals and the grace is
// overdue (a crashed process), and the next refresh of another process
// deletes it.
func TestAnOverdueUnleasedRecordIsNotLiveAndIsSweptByTheNextRefresh(t *testing.T) {
	ctx := context.Background()
	db := testsupport.OpenDB(t)
	crashed, live := lease.NewStore(db, time.Minute), lease.NewStore(db, time.Minute)
	if err := system.MarkUnleased(ctx, db, "crashed", crashed.Nonce(), time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE unleased_instances SET seen_at = seen_at - 3100`); err != nil {
		t.Fatal(err)
	}
	all, err := system.ListUnleased(ctx, db)
	if err != nil || len(all) != 1 || all[0].Live() || all[0].Overdue() > 0 {
		t.Fatalf("%+v (%v): want one overdue record (last refresh 3.1s ago, every 1s)", all, err)
	}
	if err := system.MarkUnleased(ctx, db, "live", live.Nonce(), time.Second); err != nil {
		t.Fatal(err)
	}
	if all, err := system.ListUnleased(ctx, db); err != nil || len(all) != 1 || all[0].Instance != "live" {
		t.Fatalf("after another refresh %+v (%v), want only the live record", all, err)
	}
}
