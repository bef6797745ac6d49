package system

import (
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/events"
)

func TestReleaseAuditNamesEveryLeaseAStopDidNotRelease(t *testing.T) {
	a := newReleaseAudit("me")
	ev := func(kind events.Kind, lease string, fence int64, reason string) {
		a.observe(events.Custody{Kind: kind, Lease: lease, Instance: "me", Fence: fence, Reason: reason})
	}
	ev(events.LeaseAcquired, "cleanup", 3, "")
	ev(events.LeaseAcquired, "backfill", 7, "")
	ev(events.LeaseAcquired, "billing-tier-refresh", 2, "")
	ev(events.LeaseAcquired, "labeler-subscriber", 4, "")
	// Lost before the stop: not the stop's to release.
	ev(events.LeaseLost, "labeler-subscriber", 4, events.ReasonBlackout)
	// Another instance's events never count.
	a.observe(events.Custody{Kind: events.LeaseAcquired, Lease: "jetstream-consumer", Instance: "other", Fence: 9})
	a.beginStop()
	if err := a.unreleased(); err == nil || !strings.Contains(err.Error(), "3 lease(s)") {
		t.Fatalf("mid-stop: %v, want the three held leases pending", err)
	}
	ev(events.LeaseReleased, "cleanup", 3, "")
	ev(events.LeaseLost, "backfill", 7, events.ReasonSuperseded)
	ev(events.LeaseLost, "billing-tier-refresh", 2, events.ReasonError)
	err := a.unreleased()
	if err == nil || !strings.Contains(err.Error(), "billing-tier-refresh (fence 2): error") || strings.Contains(err.Error(), "cleanup") ||
		strings.Contains(err.Error(), "backfill") || strings.Contains(err.Error(), "labeler") {
		t.Fatalf("after the stop: %v, want only billing-tier-refresh named", err)
	}

	clean := newReleaseAudit("me")
	clean.observe(events.Custody{Kind: events.LeaseAcquired, Lease: "cleanup", Instance: "me", Fence: 1})
	clean.beginStop()
	clean.observe(events.Custody{Kind: events.LeaseReleased, Lease: "cleanup", Instance: "me", Fence: 1})
	if err := clean.unreleased(); err != nil {
		t.Fatalf("every lease released, got %v", err)
	}
}

// A grant given up before the stop (lost for a reason other than
// superseded) is named by givenUpNow until it is handed back or a newer
// grant follows it; the stop itself does not count it.
func TestTheAuditNamesGrantsGivenUpBeforeTheStopAndNeverHandedBack(t *testing.T) {
	a := newReleaseAudit("me")
	ev := func(kind events.Kind, lease string, fence int64, reason string) {
		a.observe(events.Custody{Kind: kind, Lease: lease, Instance: "me", Fence: fence, Reason: reason})
	}
	for _, l := range []string{"cleanup", "backfill", "billing-tier-refresh", "labeler-subscriber"} {
		ev(events.LeaseAcquired, l, 3, "")
	}
	ev(events.LeaseLost, "cleanup", 3, events.ReasonError)              // never handed back
	ev(events.LeaseLost, "backfill", 3, events.ReasonBlackout)          // handed back below
	ev(events.LeaseLost, "billing-tier-refresh", 3, events.ReasonError) // another grant followed
	ev(events.LeaseLost, "labeler-subscriber", 3, events.ReasonSuperseded)
	ev(events.LeaseReleased, "backfill", 3, events.ReasonStaleGrant)
	a.observe(events.Custody{Kind: events.LeaseContended, Lease: "billing-tier-refresh", Instance: "me", Holder: "other", Fence: 4})
	a.beginStop()
	if err := a.unreleased(); err != nil {
		t.Fatalf("nothing was held at the stop, got %v", err)
	}
	if got := strings.Join(a.givenUpNow(), "; "); got != "cleanup (fence 3): error" {
		t.Fatalf("given up: %q, want only cleanup's", got)
	}
	ev(events.LeaseReleased, "cleanup", 2, events.ReasonStaleGrant) // an older grant's hand-back
	if len(a.givenUpNow()) != 1 {
		t.Fatal("an older grant's hand-back cleared the given-up one")
	}
}
