package system

import (
	"reflect"
	"testing"

	"github.com/atcr-io/appview/actors/lease"
)

// A hand-back of an older grant answered after a newer grant must not end
// the newer custody in the audit.
func TestTheReleaseAuditIgnoresAnOlderGrantsHandBack(t *testing.T) {
	a := newReleaseAudit("me")
	ev := func(kind lease.EventKind, fence int64, reason string) {
		a.observe(lease.Event{Kind: kind, Lease: "cleanup", Instance: "me", Fence: fence, Reason: reason})
	}
	ev(lease.LeaseAcquired, 2, "")
	ev(lease.LeaseAcquired, 1, lease.ReasonStaleGrant)
	ev(lease.LeaseReleased, 1, lease.ReasonStaleGrant)
	if got := a.heldNow(); !reflect.DeepEqual(got, []string{"cleanup"}) {
		t.Fatalf("held %v while fence 2 is held", got)
	}
	a.beginStop()
	ev(lease.LeaseReleased, 1, lease.ReasonStaleGrant)
	ev(lease.LeaseLost, 2, lease.ReasonError)
	if err := a.unreleased(); err == nil {
		t.Fatal("fence 2 was never released, the audit says every lease was")
	}
}
