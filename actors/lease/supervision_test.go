package lease

import (
	"testing"
	"time"

	"github.com/atcr-io/appview/actors/lease/internal/machine"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/events"
	"github.com/atcr-io/appview/internal/leasestore"
	"github.com/atcr-io/appview/internal/testsupport"
)

// supervisionTiming has a short TTL so the give-up cooldown (one TTL) is
// quick to observe.
var supervisionTiming = leasestore.Timing{TTL: time.Second, RenewInterval: 100 * time.Millisecond,
	RenewDeadline: 600 * time.Millisecond, RetryInterval: 200 * time.Millisecond}

func TestAPanickingWorkerIsRestartedInPlaceUnderTheSameCustody(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	h := newHarness(t)
	p := &probe{}
	h.start(Options{Name: "jetstream-consumer", Instance: "instance-a", Timing: supervisionTiming, Store: leasestore.NewStore(db, supervisionTiming.TTL), Worker: p.props})
	started, _ := h.events.wait(t, 0, "worker.started", is(events.WorkerStarted, "instance-a"))
	testsupport.Eventually(t, "worker running", func() bool { return p.pid() != nil })
	h.sys.Root.Send(p.pid(), panicWith{reason: "injected: nil map write"})
	restarted, _ := h.events.wait(t, 0, "worker.restarted", is(events.WorkerRestarted, "instance-a"))
	if restarted.Fence != started.Fence || restarted.Attempt != 1 {
		t.Fatalf("worker.restarted %+v, want fence %d attempt 1", restarted, started.Fence)
	}
	testsupport.Eventually(t, "worker restarted", func() bool { return p.restarting.Load() == 1 && p.started.Load() == 2 })
	if n := len(p.custodies()); n != 1 {
		t.Fatalf("the worker was built %d times; a restart reuses its props and custody", n)
	}
	if n := h.events.count(is(events.WorkerStarted, "instance-a")); n != 1 {
		t.Fatalf("%d worker.started events; a restart is not a new start", n)
	}
	for _, kind := range []events.Kind{events.LeaseLost, events.LeaseReleased, events.WorkerFailed, events.WorkerStopped} {
		if n := h.events.count(is(kind, "instance-a")); n != 0 {
			t.Fatalf("a single panic caused %d %s", n, kind)
		}
	}
	if row := readRow(t, db, "jetstream-consumer"); row.Fence != started.Fence || row.State() != leasestore.StateHeld {
		t.Fatalf("custody changed by a restart: %+v", row)
	}
}

// Restart backoff doubles from 100 ms; the sixth failure within a minute
// gives the lease up so another instance can try, and this one waits a
// TTL before contending again.
func TestAWorkerFailingMoreThanFiveTimesAMinuteGivesTheLeaseUp(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	h := newHarness(t)
	store := newFaultyStore(leasestore.NewStore(db, supervisionTiming.TTL))
	p := &probe{}
	p.panicOnStart.Store("injected: cannot connect to the labeler")
	h.start(Options{Name: "labeler-subscriber", Instance: "instance-a", Timing: supervisionTiming, Store: store, Worker: p.props})
	_, first := h.events.wait(t, 0, "worker.started", is(events.WorkerStarted, "instance-a"))
	failed, failedAt := h.events.wait(t, 0, "worker.failed", is(events.WorkerFailed, "instance-a"))
	released, releasedAt := h.events.wait(t, failedAt, "lease.released", is(events.LeaseReleased, "instance-a"))
	p.panicOnStart.Store("")

	all, _ := h.events.snapshot()
	var restarts []events.Custody
	for _, e := range all[first:failedAt] {
		if e.Kind == events.WorkerRestarted {
			restarts = append(restarts, e)
		}
	}
	if len(restarts) != machine.MaxFailures {
		t.Fatalf("%d restarts before giving up, want %d:\n%s", len(restarts), machine.MaxFailures, formatEvents(all))
	}
	for i, e := range restarts {
		if e.Attempt != i+1 || e.Fence != 1 {
			t.Fatalf("restart %d: %+v", i+1, e)
		}
		if i > 0 {
			// Backoff doubles: 100, 200, 400, 800 ms between restarts
			// (plus the time to fail again).
			want := machine.RestartBackoffMin << i
			if gap := e.At.Sub(restarts[i-1].At); gap < want {
				t.Fatalf("restart %d came %s after the previous one, want >= %s", i+1, gap, want)
			}
		}
	}
	if failed.Fence != 1 || released.Reason != events.ReasonWorkerFailed || released.Fence != 1 {
		t.Fatalf("worker.failed %+v, lease.released %+v", failed, released)
	}
	if n := h.events.count(is(events.WorkerStopped, "instance-a")); n != 1 {
		t.Fatalf("%d worker.stopped events", n)
	}

	// Cooldown: the next acquire attempt is at least one TTL after the release.
	acq, _ := h.events.wait(t, releasedAt, "lease.acquired after the cooldown", is(events.LeaseAcquired, "instance-a"))
	var next time.Time
	for _, at := range store.acquireTimes() {
		if at.After(released.At) {
			next = at
			break
		}
	}
	if gap := next.Sub(released.At); gap < supervisionTiming.TTL-5*time.Millisecond {
		t.Fatalf("contended again %s after giving up, want a cooldown of one TTL (%s)", gap, supervisionTiming.TTL)
	}
	if acq.Fence != 2 {
		t.Fatalf("re-acquired with fence %d, want 2", acq.Fence)
	}
	h.events.wait(t, releasedAt, "a fresh worker", is(events.WorkerStarted, "instance-a"))
	// Six starts failed (the first and five restarts); the seventh runs.
	testsupport.Eventually(t, "the fresh worker running", func() bool { return p.started.Load() == 7 })
	if n := p.restarting.Load(); n != machine.MaxFailures {
		t.Fatalf("%d restarts, want %d", n, machine.MaxFailures)
	}
}

// Another instance may use the cooldown: it takes the lease at once.
func TestAnotherInstanceTakesTheLeaseAFailingWorkerGaveUp(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	h := newHarness(t)
	pa, pb := &probe{}, &probe{}
	pa.panicOnStart.Store("injected: bad local disk")
	h.start(Options{Name: "cleanup", Instance: "instance-a", Timing: supervisionTiming, Store: leasestore.NewStore(db, supervisionTiming.TTL), Worker: pa.props})
	h.events.wait(t, 0, "worker.started by a", is(events.WorkerStarted, "instance-a"))
	h.start(Options{Name: "cleanup", Instance: "instance-b", Timing: supervisionTiming, Store: leasestore.NewStore(db, supervisionTiming.TTL), Worker: pb.props})
	h.events.wait(t, 0, "lease.released by a", is(events.LeaseReleased, "instance-a"))
	// From the start of the stream: b's lease.acquired may be published
	// before a's lease.released (each actor publishes on its own), and b
	// acquires nothing before a releases.
	acq, _ := h.events.wait(t, 0, "lease.acquired by b", is(events.LeaseAcquired, "instance-b"))
	if acq.Fence != 2 {
		t.Fatalf("b's fence %d, want 2", acq.Fence)
	}
	testsupport.Eventually(t, "b's worker running", func() bool { return pb.started.Load() == 1 })
}

// A worker whose fenced write found another holder must not be restarted:
// its custody is gone. The LeaseActor reports the loss and stops it.
func TestAWorkerFailingWithErrSupersededIsStoppedNotRestarted(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	createProbeTable(t, db)
	h := newHarness(t)
	p := &probe{}
	h.start(Options{Name: "billing-tier-refresh", Instance: "instance-a", Timing: supervisionTiming, Store: leasestore.NewStore(db, supervisionTiming.TTL), Worker: p.props})
	h.events.wait(t, 0, "worker.started", is(events.WorkerStarted, "instance-a"))
	testsupport.Eventually(t, "worker running", func() bool { return p.pid() != nil })
	// Another instance took the lease between two renewals.
	if _, err := db.Exec(`UPDATE leases SET holder = 'instance-b', fence = fence + 1, expires_at = ` +
		database.NowMS + ` + 60000 WHERE name = 'billing-tier-refresh'`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	h.sys.Root.Send(p.pid(), fencedWrite{db: db, done: done})
	if err := <-done; err == nil {
		t.Fatal("the fenced write under a taken lease succeeded")
	}
	lost, _ := h.events.wait(t, 0, "lease.lost", is(events.LeaseLost, "instance-a"))
	h.events.wait(t, 0, "worker.stopped", is(events.WorkerStopped, "instance-a"))
	if lost.Reason != events.ReasonSuperseded || lost.Fence != 1 {
		t.Fatalf("lease.lost %+v, want reason superseded fence 1", lost)
	}
	h.events.wait(t, 0, "lease.contended after the loss", is(events.LeaseContended, "instance-a"))
	if n := h.events.count(is(events.WorkerRestarted, "instance-a")); n != 0 || p.restarting.Load() != 0 {
		t.Fatalf("a superseded worker was restarted (%d events, %d restarts)", n, p.restarting.Load())
	}
	if n := probeWrites(t, db); n != 0 {
		t.Fatalf("%d writes landed under the lost custody", n)
	}
	testsupport.Eventually(t, "worker stopped", func() bool { return p.stopping.Load() == 1 })
	if n := h.events.count(is(events.WorkerStarted, "instance-a")); n != 1 {
		t.Fatalf("%d worker.started events", n)
	}
}
