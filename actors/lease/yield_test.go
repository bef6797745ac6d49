package lease

import (
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"
)

// healthPair starts instance-a holding "jetstream-consumer" and
// instance-b contending for it, each with its own worker health report,
// nudge endpoint and contender record.
func healthPair(t *testing.T, grace, minHold time.Duration) (h *harness, ha, hb *workers.Health, pa, pb *probe) {
	db := testsupport.OpenDB(t)
	h = newHarness(t)
	ha, hb = &workers.Health{}, &workers.Health{}
	pa, pb = &probe{}, &probe{}
	const name = "jetstream-consumer"
	start := func(instance string, health *workers.Health, p *probe) {
		e := newNudgeEndpoint(t, h.sys, name)
		store := NewStore(db, fastTiming.TTL)
		r := h.start(Options{Name: name, Instance: instance, Timing: fastTiming, Store: store,
			Worker: p.props, Contenders: h.newContenders(store, instance, e.url()),
			Health: health, YieldGrace: grace, MinHold: minHold})
		e.pid.Store(r.pid)
	}
	start("instance-a", ha, pa)
	h.events.wait(t, 0, "instance-a holding", is(WorkerStarted, "instance-a"))
	start("instance-b", hb, pb)
	h.events.wait(t, 0, "instance-b contending", is(LeaseContended, "instance-b"))
	return h, ha, hb, pa, pb
}

// A holder whose worker reports unhealthy for the grace, once
// it has held the lease for the minimum time, yields to a contender that
// reports healthy; the contender takes over and the yielder stays out.
func TestAnUnhealthyHolderYieldsToAHealthyContender(t *testing.T) {
	h, ha, _, pa, pb := healthPair(t, 300*time.Millisecond, 500*time.Millisecond)
	ha.Set(false, "no upstream reachable")
	y, _ := h.events.wait(t, 0, "lease.yielded", is(LeaseYielded, "instance-a"))
	if y.Reason != ReasonYielded || y.Err == nil {
		t.Fatalf("lease.yielded %+v, want reason %s and the cause", y, ReasonYielded)
	}
	rel, _ := h.events.wait(t, 0, "instance-a released", is(LeaseReleased, "instance-a"))
	if rel.Reason != ReasonYielded {
		t.Fatalf("release reason %q, want %q", rel.Reason, ReasonYielded)
	}
	testsupport.Eventually(t, "instance-b's worker running", func() bool { return pb.started.Load() > 0 })
	if n := pa.started.Load(); n != 1 {
		t.Fatalf("instance-a started %d workers, want only its first (it stays out for a TTL after yielding)", n)
	}
}

// A holder never yields when no contender is healthier: here the only
// contender reports unhealthy too. Several renewals past the grace and
// the minimum hold (each one a chance to yield) go by without a yield.
func TestAnUnhealthyHolderKeepsTheLeaseWhenNoContenderIsHealthier(t *testing.T) {
	h, ha, hb, _, pb := healthPair(t, 100*time.Millisecond, 100*time.Millisecond)
	hb.Set(false, "no upstream reachable either")
	// instance-b records its health at its next attempt (a change is
	// written at once).
	from, _ := h.events.snapshot()
	h.events.wait(t, len(from), "instance-b contending again", is(LeaseContended, "instance-b"))
	ha.Set(false, "no upstream reachable")
	renewed := is(LeaseRenewed, "instance-a")
	base := h.events.count(renewed)
	testsupport.Eventually(t, "instance-a renewing well past the grace and the minimum hold", func() bool {
		return h.events.count(renewed) >= base+20 // 20 renewals of 100 ms: 2 s, grace and hold 100 ms each
	})
	if n := h.events.count(is(LeaseYielded, "instance-a")); n != 0 || pb.started.Load() != 0 {
		all, _ := h.events.snapshot()
		t.Fatalf("instance-a yielded %d times to a contender no healthier than itself:\n%s", n, formatEvents(all))
	}
}
