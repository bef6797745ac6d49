package system

import (
	"strings"
	"testing"

	"github.com/atcr-io/appview/actors/lease"
)

func TestReleaseAuditNamesEveryLeaseAStopDidNotRelease(t *testing.T) {
	a := newReleaseAudit("me")
	ev := func(kind lease.EventKind, name string, fence int64, reason string) {
		a.observe(lease.Event{Kind: kind, Lease: name, Instance: "me", Fence: fence, Reason: reason})
	}
	ev(lease.LeaseAcquired, "cleanup", 3, "")
	ev(lease.LeaseAcquired, "backfill", 7, "")
	ev(lease.LeaseAcquired, "billing-tier-refresh", 2, "")
	ev(lease.LeaseAcquired, "labeler-subscriber", 4, "")
	// Lost before the stop: not the stop's to release.
	ev(lease.LeaseLost, "labeler-subscriber", 4, lease.ReasonBlackout)
	// Another instance's events never count.
	a.observe(lease.Event{Kind: lease.LeaseAcquired, Lease: "jetstream-consumer", Instance: "other", Fence: 9})
	a.beginStop()
	if err := a.unreleased(); err == nil || !strings.Contains(err.Error(), "3 lease(s)") {
		t.Fatalf("mid-stop: %v, want the three held leases pending", err)
	}
	ev(lease.LeaseReleased, "cleanup", 3, "")
	ev(lease.LeaseLost, "backfill", 7, lease.ReasonSuperseded)
	ev(lease.LeaseLost, "billing-tier-refresh", 2, lease.ReasonError)
	err := a.unreleased()
	if err == nil || !strings.Contains(err.Error(), "billing-tier-refresh (fence 2): error") || strings.Contains(err.Error(), "cleanup") ||
		strings.Contains(err.Error(), "backfill") || strings.Contains(err.Error(), "labeler") {
		t.Fatalf("after the stop: %v, want only billing-tier-refresh named", err)
	}

	clean := newReleaseAudit("me")
	clean.observe(lease.Event{Kind: lease.LeaseAcquired, Lease: "cleanup", Instance: "me", Fence: 1})
	clean.beginStop()
	clean.observe(lease.Event{Kind: lease.LeaseReleased, Lease: "cleanup", Instance: "me", Fence: 1})
	if err := clean.unreleased(); err != nil {
		t.Fatalf("every lease released, got %v", err)
	}
}

// A grant given up before the stop (lost for a reason other than
// superseded) is named by givenUpNow until it is handed back or a newer
// grant follows it; the stop itself does not count it.
func TestTheAuditNamesGrantsGivenUpBeforeTheStopAndNeverHandedBack(t *testing.T) {
	a := newReleaseAudit("me")
	ev := func(kind lease.EventKind, name string, fence int64, reason string) {
		a.observe(lease.Event{Kind: kind, Lease: name, Instance: "me", Fence: fence, Reason: reason})
	}
	for _, l := range []string{"cleanup", "backfill", "billing-tier-refresh", "labeler-subscriber"} {
		ev(lease.LeaseAcquired, l, 3, "")
	}
	ev(lease.LeaseLost, "cleanup", 3, lease.ReasonError)              // never handed back
	ev(lease.LeaseLost, "backfill", 3, lease.ReasonBlackout)          // handed back below
	ev(lease.LeaseLost, "billing-tier-refresh", 3, lease.ReasonError) // another grant followed
	ev(lease.LeaseLost, "labeler-subscriber", 3, lease.ReasonSuperseded)
	ev(lease.LeaseReleased, "backfill", 3, lease.ReasonStaleGrant)
	a.observe(lease.Event{Kind: lease.LeaseContended, Lease: "billing-tier-refresh", Instance: "me", Holder: "other", Fence: 4})
	a.beginStop()
	if err := a.unreleased(); err != nil {
		t.Fatalf("nothing was held at the stop, got %v", err)
	}
	if got := strings.Join(a.givenUpNow(), "; "); got != "cleanup (fence 3): error" {
		t.Fatalf("given up: %q, want only cleanup's", got)
	}
	ev(lease.LeaseReleased, "cleanup", 2, lease.ReasonStaleGrant) // an older grant's hand-back
	if len(a.givenUpNow()) != 1 {
		t.Fatal("an older grant's hand-back cleared the given-up one")
	}
}
