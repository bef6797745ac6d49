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
