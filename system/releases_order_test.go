package system

import (
	"reflect"
	"testing"

	"github.com/atcr-io/appview/internal/events"
)

// A hand-back of an older grant answered after a newer grant must not end
// the newer custody in the audit.
func TestTheReleaseAuditIgnoresAnOlderGrantsHandBack(t *testing.T) {
	a := newReleaseAudit("me")
	ev := func(kind events.Kind, fence int64, reason string) {
		a.observe(events.Custody{Kind: kind, Lease: "cleanup", Instance: "me", Fence: fence, Reason: reason})
	}
	ev(events.LeaseAcquired, 2, "")
	ev(events.LeaseAcquired, 1, events.ReasonStaleGrant)
	ev(events.LeaseReleased, 1, events.ReasonStaleGrant)
	if got := a.heldNow(); !reflect.DeepEqual(got, []string{"cleanup"}) {
		t.Fatalf("held %v while fence 2 is held", got)
	}
	a.beginStop()
	ev(events.LeaseReleased, 1, events.ReasonStaleGrant)
	ev(events.LeaseLost, 2, events.ReasonError)
	if err := a.unreleased(); err == nil {
		t.Fatal("fence 2 was never released, the audit says every lease was")
	}
}
