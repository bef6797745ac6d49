package lease

import (
	"context"
	"fmt"
	"testing"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/testsupport"
)

// LeaseActors of one instance renew through one Renewer (one
// statement per tick for all of them); the one whose lease was taken
// learns it alone and stops its worker, the others keep renewing.
func TestLeaseActorsSharingARenewerLearnTheirOwnOutcomes(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	renewer := NewRenewer(NewStore(db, fastTiming.TTL))
	t.Cleanup(func() { _ = renewer.Close(context.Background()) })
	const n = 5
	for i := range n {
		p := &probe{}
		h.start(Options{Name: fmt.Sprintf("worker-%d", i), Instance: "instance-a", Timing: quickTiming, Store: renewer, Worker: p.props})
	}
	for i := range n {
		h.events.wait(t, 0, "every worker started", isFor(WorkerStarted, "instance-a", fmt.Sprintf("worker-%d", i)))
	}
	if _, err := db.Exec(`UPDATE leases SET holder = 'instance-b', fence = fence + 1, expires_at = ` +
		database.NowMS + ` + 60000 WHERE name = 'worker-2'`); err != nil {
		t.Fatal(err)
	}
	before := rowBytes(t, db, "worker-2")
	lost, at := h.events.wait(t, 0, "lease.lost", isFor(LeaseLost, "instance-a", "worker-2"))
	if lost.Reason != ReasonSuperseded {
		t.Fatalf("lease.lost %+v, want reason superseded", lost)
	}
	for i := range n {
		if i == 2 {
			continue
		}
		name := fmt.Sprintf("worker-%d", i)
		h.events.wait(t, at, name+" renewed after worker-2 was lost", isFor(LeaseRenewed, "instance-a", name))
	}
	if after := rowBytes(t, db, "worker-2"); after != before {
		t.Fatalf("a batched renewal touched the new holder's row:\nbefore %s\nafter  %s", before, after)
	}
	if c := h.events.count(func(e Event) bool { return e.Kind == LeaseLost && e.Lease != "worker-2" }); c != 0 {
		t.Fatalf("%d other leases lost", c)
	}
}
