package lease

import (
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

// supervisionTiming has a short TTL so the give-up cooldown (one TTL) is
// quick to observe.
var supervisionTiming = config.Timing{TTL: time.Second, RenewInterval: 100 * time.Millisecond,
	RenewDeadline: 600 * time.Millisecond, RetryInterval: 200 * time.Millisecond}

func TestAPanickingWorkerIsRestartedInPlaceUnderTheSameCustody(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	p := &probe{}
	h.start(Options{Name: "jetstream-consumer", Instance: "instance-a", Timing: supervisionTiming, Store: NewStore(db, supervisionTiming.TTL), Worker: p.props})
	started, _ := h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))
	testsupport.Eventually(t, "worker running", func() bool { return p.pid() != nil })
	h.sys.Root.Send(p.pid(), panicWith{reason: "injected: nil map write"})
	restarted, _ := h.events.wait(t, 0, "worker.restarted", is(WorkerRestarted, "instance-a"))
	if restarted.Fence != started.Fence || restarted.Attempt != 1 {
		t.Fatalf("worker.restarted %+v, want fence %d attempt 1", restarted, started.Fence)
	}
	testsupport.Eventually(t, "worker restarted", func() bool { return p.restarting.Load() == 1 && p.started.Load() == 2 })
	if n := len(p.custodies()); n != 1 {
		t.Fatalf("the worker was built %d times; a restart reuses its props and custody", n)
	}
	if n := h.events.count(is(WorkerStarted, "instance-a")); n != 1 {
		t.Fatalf("%d worker.started events; a restart is not a new start", n)
	}
	for _, kind := range []EventKind{LeaseLost, LeaseReleased, WorkerFailed, WorkerStopped} {
		if n := h.events.count(is(kind, "instance-a")); n != 0 {
			t.Fatalf("a single panic caused %d %s", n, kind)
		}
	}
	if row := readRow(t, db, "jetstream-consumer"); row.Fence != started.Fence || row.State() != fence.StateHeld {
		t.Fatalf("custody changed by a restart: %+v", row)
	}
}

// Restart backoff doubles from 100 ms; the sixth failure within a minute
// gives the lease up so another instance can try, and this one waits a
// TTL before contending again.
func TestAWorkerFailingMoreThanFiveTimesAMinuteGivesTheLeaseUp(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	store := newFaultyStore(NewStore(db, supervisionTiming.TTL))
	p := &probe{}
	p.panicOnStart.Store("injected: cannot connect to the labeler")
	h.start(Options{Name: "labeler-subscriber", Instance: "instance-a", Timing: supervisionTiming, Store: store, Worker: p.props})
	_, first := h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))
	failed, failedAt := h.events.wait(t, 0, "worker.failed", is(WorkerFailed, "instance-a"))
	released, releasedAt := h.events.wait(t, failedAt, "lease.released", is(LeaseReleased, "instance-a"))
	p.panicOnStart.Store("")

	all, _ := h.events.snapshot()
	var restarts []Event
	for _, e := range all[first:failedAt] {
		if e.Kind == WorkerRestarted {
			restarts = append(restarts, e)
		}
	}
	if len(restarts) != MaxFailures {
		t.Fatalf("%d restarts before giving up, want %d:\n%s", len(restarts), MaxFailures, formatEvents(all))
	}
	for i, e := range restarts {
		if e.Attempt != i+1 || e.Fence != 1 {
			t.Fatalf("restart %d: %+v", i+1, e)
		}
		if i > 0 {
			// Backoff doubles: 100, 200, 400, 800 ms between restarts
			// (plus the time to fail again).
			want := RestartBackoffMin << i
			if gap := e.At.Sub(restarts[i-1].At); gap < want {
				t.Fatalf("restart %d came %s after the previous one, want >= %s", i+1, gap, want)
			}
		}
	}
	if failed.Fence != 1 || released.Reason != ReasonWorkerFailed || released.Fence != 1 {
		t.Fatalf("worker.failed %+v, lease.released %+v", failed, released)
	}
	if n := h.events.count(is(WorkerStopped, "instance-a")); n != 1 {
		t.Fatalf("%d worker.stopped events", n)
	}

	// Cooldown: the next acquire attempt is at least one TTL after the release.
	acq, _ := h.events.wait(t, releasedAt, "lease.acquired after the cooldown", is(LeaseAcquired, "instance-a"))
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
	h.events.wait(t, releasedAt, "a fresh worker", is(WorkerStarted, "instance-a"))
	// Six starts failed (the first and five restarts); the seventh runs.
	testsupport.Eventually(t, "the fresh worker running", func() bool { return p.started.Load() == 7 })
	if n := p.restarting.Load(); n != MaxFailures {
		t.Fatalf("%d restarts, want %d", n, MaxFailures)
	}
}

// Another instance may use the cooldown: it takes the lease at once.
func TestAnotherInstanceTakesTheLeaseAFailingWorkerGaveUp(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	pa, pb := &probe{}, &probe{}
	pa.panicOnStart.Store("injected: bad local disk")
	h.start(Options{Name: "cleanup", Instance: "instance-a", Timing: supervisionTiming, Store: NewStore(db, supervisionTiming.TTL), Worker: pa.props})
	h.events.wait(t, 0, "worker.started by a", is(WorkerStarted, "instance-a"))
	h.start(Options{Name: "cleanup", Instance: "instance-b", Timing: supervisionTiming, Store: NewStore(db, supervisionTiming.TTL), Worker: pb.props})
	h.events.wait(t, 0, "lease.released by a", is(LeaseReleased, "instance-a"))
	// From the start of the stream: b's lease.acquired may be published
	// before a's lease.released (each actor publishes on its own), and b
	// acquires nothing before a releases.
	acq, _ := h.events.wait(t, 0, "lease.acquired by b", is(LeaseAcquired, "instance-b"))
	if acq.Fence != 2 {
		t.Fatalf("b's fence %d, want 2", acq.Fence)
	}
	testsupport.Eventually(t, "b's worker running", func() bool { return pb.started.Load() == 1 })
}

// A worker whose fenced write found another holder must not be restarted:
// its custody is gone. The LeaseActor reports the loss and stops it.
func TestAWorkerFailingWithErrSupersededIsStoppedNotRestarted(t *testing.T) {
	db := testsupport.OpenDB(t)
	createProbeTable(t, db)
	h := newHarness(t)
	p := &probe{}
	h.start(Options{Name: "billing-tier-refresh", Instance: "instance-a", Timing: supervisionTiming, Store: NewStore(db, supervisionTiming.TTL), Worker: p.props})
	h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))
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
	lost, _ := h.events.wait(t, 0, "lease.lost", is(LeaseLost, "instance-a"))
	h.events.wait(t, 0, "worker.stopped", is(WorkerStopped, "instance-a"))
	if lost.Reason != ReasonSuperseded || lost.Fence != 1 {
		t.Fatalf("lease.lost %+v, want reason superseded fence 1", lost)
	}
	h.events.wait(t, 0, "lease.contended after the loss", is(LeaseContended, "instance-a"))
	if n := h.events.count(is(WorkerRestarted, "instance-a")); n != 0 || p.restarting.Load() != 0 {
		t.Fatalf("a superseded worker was restarted (%d events, %d restarts)", n, p.restarting.Load())
	}
	if n := probeWrites(t, db); n != 0 {
		t.Fatalf("%d writes landed under the lost custody", n)
	}
	testsupport.Eventually(t, "worker stopped", func() bool { return p.stopping.Load() == 1 })
	if n := h.events.count(is(WorkerStarted, "instance-a")); n != 1 {
		t.Fatalf("%d worker.started events", n)
	}
}
