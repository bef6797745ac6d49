package lease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"

	"github.com/atcr-io/appview/internal/database"
)

// Mirror of the seed's TestWaitBlocksUntilLeaseReleased: a rolling deploy
// hands over in milliseconds only if the process exits after the release
// has landed. The store answers slowly (a remote database), so a release
// that did not hold up the actor's termination would still be in flight
// when the row is read.
func TestStoppingALeaseActorReturnsOnlyAfterTheLeaseIsReleased(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	store := newFaultyStore(NewStore(db, fastTiming.TTL))
	store.releaseLag = 200 * time.Millisecond
	p := &probe{}
	r := h.start(Options{Name: "jetstream-consumer", Instance: "instance-a", Timing: fastTiming, Store: store, Worker: p.props})
	h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))

	h.stop(r)
	r.wait(t)
	row := readRow(t, db, "jetstream-consumer")
	if row.State() != fence.StateReleased {
		t.Fatalf("the lease actor terminated with the lease %s (expires in %d ms): the release had not landed", row.State(), row.ExpiresAt-row.Now)
	}
	if row.Holder != "instance-a" || row.Fence != 1 {
		t.Fatalf("released row %+v", row)
	}
	if n := p.stopping.Load(); n != 1 {
		t.Fatalf("worker stopped %d times", n)
	}
	if p.drains.Load() != 1 || !p.drainedBeforeStop.Load() {
		t.Fatalf("a graceful stop sent %d Drain (before Stopping: %v), want one, first", p.drains.Load(), p.drainedBeforeStop.Load())
	}
	stopped, i := h.events.wait(t, 0, "worker.stopped", is(WorkerStopped, "instance-a"))
	released, j := h.events.wait(t, 0, "lease.released", is(LeaseReleased, "instance-a"))
	if j < i || released.Reason != ReasonShutdown || released.Fence != 1 || stopped.Fence != 1 {
		t.Fatalf("want worker.stopped then lease.released reason=shutdown fence 1; got %+v then %+v", stopped, released)
	}
}

// A contender that never held must leave no trace when it stops: no
// worker events and not a byte of the holder's row changed.
func TestStoppingAnInstanceThatNeverHeldChangesNothing(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	holder := mustAcquire(t, NewStore(db, time.Minute), "cleanup", "instance-a")
	before := rowBytes(t, db, "cleanup")
	p := &probe{}
	r := h.start(Options{Name: "cleanup", Instance: "instance-b", Timing: fastTiming, Store: NewStore(db, fastTiming.TTL), Worker: p.props})
	c, _ := h.events.wait(t, 0, "lease.contended", is(LeaseContended, "instance-b"))
	if c.Holder != holder.Holder || c.Fence != holder.Fence {
		t.Fatalf("contended event %+v, want holder %s fence %d", c, holder.Holder, holder.Fence)
	}
	h.stopAndWait(r)
	if after := rowBytes(t, db, "cleanup"); after != before {
		t.Fatalf("a contender changed the row:\nbefore %s\nafter  %s", before, after)
	}
	if p.started.Load() != 0 || len(p.custodies()) != 0 {
		t.Fatal("a contender started a worker")
	}
	for _, kind := range []EventKind{WorkerStarted, WorkerStopped, WorkerFailed,
		WorkerRestarted, LeaseAcquired, LeaseReleased, LeaseLost} {
		if n := h.events.count(is(kind, "instance-b")); n != 0 {
			t.Errorf("%d %s events from a contender that never held", n, kind)
		}
	}
}

// The renewal that is in flight when a shutdown releases the lease must not
// land after the release and revive the grant for a whole TTL: that would
// hold up the handover exactly as a lost release does.
func TestARenewalInFlightAtShutdownCannotReviveTheReleasedLease(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	store := newFaultyStore(NewStore(db, fastTiming.TTL))
	t.Cleanup(store.resume)
	p := &probe{}
	r := h.start(Options{Name: "jetstream-consumer", Instance: "instance-a", Timing: fastTiming, Store: store, Worker: p.props})
	h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))
	store.hold(false)
	<-store.entered // a renewal has left the actor and waits on the network
	h.stop(r)
	r.wait(t)
	if st := readRow(t, db, "jetstream-consumer").State(); st != fence.StateReleased {
		t.Fatalf("after shutdown the lease is %s", st)
	}
	store.resume() // the renewal reaches the database after the release
	select {
	case err := <-store.heldRenewals:
		t.Logf("late renewal answered: %v", err)
	case <-time.After(waitFor):
		t.Fatal("the held renewal never answered")
	}
	if row := readRow(t, db, "jetstream-consumer"); row.State() != fence.StateReleased {
		t.Fatalf("a renewal that landed after the release revived the lease: %s for %d ms more", row.State(), row.ExpiresAt-row.Now)
	}
}

func TestRenewalBlackoutStopsTheWorkerBeforeTheTTL(t *testing.T) {
	cases := []struct {
		name   string
		fault  func(*faultyStore)
		reason string
	}{
		{"hung", func(s *faultyStore) { s.hold(false) }, ReasonBlackout},
		{"failing", func(s *faultyStore) { s.failRenewals(errors.New("injected: disk I/O error")) }, ReasonError},
		// A libSQL server that is down answers nothing: that is a blackout
		// even though every call returns at once (go-libsql's shape).
		{"refused", func(s *faultyStore) {
			s.failRenewals(errors.New("failed to execute query UPDATE leases\nerror code = 1: Error executing statement: Hrana: `http error: `error trying to connect: tcp connect error: Connection refused (os error 111)``"))
		}, ReasonBlackout},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			db := testsupport.OpenDB(t)
			h := newHarness(t)
			store := newFaultyStore(NewStore(db, fastTiming.TTL))
			t.Cleanup(store.resume)
			p := &probe{}
			h.start(Options{Name: "labeler-subscriber", Instance: "instance-a", Timing: fastTiming, Store: store, Worker: p.props})
			h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))
			h.events.wait(t, 0, "lease.renewed", is(LeaseRenewed, "instance-a"))
			tc.fault(store)
			lost, _ := h.events.wait(t, 0, "lease.lost", is(LeaseLost, "instance-a"))
			h.events.wait(t, 0, "worker.stopped", is(WorkerStopped, "instance-a"))
			if lost.Reason != tc.reason || lost.Fence != 1 {
				t.Fatalf("lease.lost %+v, want reason %s fence 1", lost, tc.reason)
			}
			lastOK := store.lastRenewal()
			stoppedAt, _ := p.stoppingAt.Load().(time.Time)
			if lastOK.IsZero() || stoppedAt.IsZero() {
				t.Fatalf("last renewal %v, worker stopped %v", lastOK, stoppedAt)
			}
			gap := stoppedAt.Sub(lastOK)
			// The deadline runs from the start of the last successful
			// renewal, before the answer this is measured from; the slack
			// is for the timer, the mailbox and the worker's Stopping on
			// a loaded host, and stays well inside the TTL.
			if limit := fastTiming.RenewDeadline + blackoutStopSlack; gap > limit {
				t.Fatalf("worker stopped %s after the last successful renewal, want <= renew_deadline + %s = %s", gap, blackoutStopSlack, limit)
			}
			if gap >= fastTiming.TTL {
				t.Fatalf("worker outlived the TTL of its last renewal: %s", gap)
			}
			t.Logf("worker stopped %s after the last successful renewal", gap)
			if p.stopping.Load() != 1 {
				t.Fatalf("worker stopped %d times", p.stopping.Load())
			}
		})
	}
}

// blackoutStopSlack is how late, past renew_deadline, a worker may see
// Stopping after a blackout in these tests (fastTiming leaves TTL -
// renew_deadline = 1 s before another holder could be granted the lease).
const blackoutStopSlack = 400 * time.Millisecond

// A holder frozen past its TTL (its process paused: no call it makes
// reaches the database) is replaced; it stops its own worker by its
// deadline, before the replacement's worker can start, and on resuming
// nothing it does under its old custody lands.
func TestAHolderPausedPastItsTTLIsReplacedAndCannotWriteWhenResumed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	dbA, dbB := testsupport.OpenDBAt(t, path), testsupport.OpenDBAt(t, path)
	createProbeTable(t, dbA)
	h := newHarness(t)
	storeA := newFaultyStore(NewStore(dbA, fastTiming.TTL))
	t.Cleanup(storeA.resume)
	pa, pb := &probe{}, &probe{}
	h.start(Options{Name: "jetstream-consumer", Instance: "instance-a", Timing: fastTiming, Store: storeA, Worker: pa.props})
	h.events.wait(t, 0, "worker.started by a", is(WorkerStarted, "instance-a"))
	h.start(Options{Name: "jetstream-consumer", Instance: "instance-b", Timing: fastTiming, Store: NewStore(dbB, fastTiming.TTL), Worker: pb.props})
	h.events.wait(t, 0, "lease.contended by b", is(LeaseContended, "instance-b"))

	storeA.hold(true)
	lost, _ := h.events.wait(t, 0, "lease.lost by a", is(LeaseLost, "instance-a"))
	_, aStopped := h.events.wait(t, 0, "worker.stopped by a", is(WorkerStopped, "instance-a"))
	acq, bAcquired := h.events.wait(t, 0, "lease.acquired by b", is(LeaseAcquired, "instance-b"))
	if lost.Reason != ReasonBlackout {
		t.Fatalf("a lost the lease with reason %q, want blackout", lost.Reason)
	}
	if aStopped > bAcquired {
		t.Fatal("b acquired while a's worker was still running")
	}
	if acq.Fence != 2 {
		t.Fatalf("b's fence %d, want 2", acq.Fence)
	}
	h.events.wait(t, 0, "worker.started by b", is(WorkerStarted, "instance-b"))

	storeA.resume()
	if err := <-storeA.heldRenewals; !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("a's held renewal landed with %v, want fence.ErrSuperseded", err)
	}
	old := pa.custodies()[0]
	before := rowBytes(t, dbA, "jetstream-consumer")
	err := fence.Fenced(t.Context(), dbA, old, func(tx *sql.Tx) error { return writeProbe(tx, old.Fence) })
	if !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("a fenced write under a's old custody: got %v, want fence.ErrSuperseded", err)
	}
	if n := probeWrites(t, dbA); n != 0 || rowBytes(t, dbA, "jetstream-consumer") != before {
		t.Fatalf("a's old custody changed something: %d writes", n)
	}
	if n := h.events.count(is(WorkerStarted, "instance-a")); n != 1 {
		t.Fatalf("a started %d workers", n)
	}
	if row := readRow(t, dbA, "jetstream-consumer"); row.Holder != "instance-b" || row.Fence != 2 {
		t.Fatalf("row after a resumed: %+v", row)
	}
}

// A holder whose row was taken while it still trusted its grant (e.g. its
// clock ran slow) learns it on its next renewal and stops its worker at
// once, without releasing anything.
func TestAHolderSupersededOnItsNextRenewalStopsItsWorkerAtOnce(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	p := &probe{}
	h.start(Options{Name: "backfill", Instance: "instance-a", Timing: fastTiming, Store: NewStore(db, fastTiming.TTL), Worker: p.props})
	h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))
	if _, err := db.Exec(`UPDATE leases SET holder = 'instance-b', fence = fence + 1, expires_at = ` +
		database.NowMS + ` + 60000 WHERE name = 'backfill'`); err != nil {
		t.Fatal(err)
	}
	before := rowBytes(t, db, "backfill")
	lost, _ := h.events.wait(t, 0, "lease.lost", is(LeaseLost, "instance-a"))
	h.events.wait(t, 0, "worker.stopped", is(WorkerStopped, "instance-a"))
	h.events.wait(t, 0, "lease.contended after the loss", is(LeaseContended, "instance-a"))
	if lost.Reason != ReasonSuperseded || lost.Fence != 1 {
		t.Fatalf("lease.lost %+v, want reason superseded fence 1", lost)
	}
	if after := rowBytes(t, db, "backfill"); after != before {
		t.Fatalf("the superseded holder touched the new holder's row:\nbefore %s\nafter  %s", before, after)
	}
	if n := h.events.count(is(LeaseReleased, "instance-a")); n != 0 {
		t.Fatal("a superseded holder released")
	}
	if n := p.drains.Load(); n != 0 {
		t.Fatalf("a superseded worker was sent %d Drain: a lost custody stops at once", n)
	}
}

// quickTiming makes a renewal due every 20 ms, for tests that loop.
var quickTiming = config.Timing{TTL: time.Second, RenewInterval: 20 * time.Millisecond,
	RenewDeadline: 500 * time.Millisecond, RetryInterval: 100 * time.Millisecond}

// A shutdown request and the news of a takeover arriving together, in
// either order and every interleaving the scheduler produces, stop the
// worker exactly once and never panic the LeaseActor.
func TestShutdownAndLossAtTheSameInstantStopTheWorkerOnce(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	shared := NewStore(db, quickTiming.TTL)
	const rounds = 100
	outcomes := map[string]int{}
	for i := range rounds {
		name := fmt.Sprintf("lease-%d", i)
		store := newFaultyStore(shared)
		store.failAfter = fmt.Errorf("renew lease %q: %w", name, fence.ErrSuperseded)
		p := &probe{}
		r := h.start(Options{Name: name, Instance: "instance-a", Timing: quickTiming, Store: store, Worker: p.props})
		h.events.wait(t, 0, "worker.started for "+name, isFor(WorkerStarted, "instance-a", name))
		store.hold(false)
		<-store.entered
		if i%2 == 0 {
			store.resume()
			h.stop(r)
		} else {
			h.stop(r)
			store.resume()
		}
		r.wait(t)
		if n := p.stopping.Load(); n != 1 {
			t.Fatalf("round %d: worker received Stopping %d times", i, n)
		}
		if n := h.events.count(isFor(WorkerStopped, "instance-a", name)); n != 1 {
			t.Fatalf("round %d: %d worker.stopped events", i, n)
		}
		if n := r.panics.Load(); n != 0 {
			t.Fatalf("round %d: the lease actor panicked: %v", i, r.reason.Load())
		}
		lost := h.events.count(isFor(LeaseLost, "instance-a", name))
		released := h.events.count(isFor(LeaseReleased, "instance-a", name))
		if lost+released != 1 {
			t.Fatalf("round %d: %d lease.lost and %d lease.released; want exactly one end of custody", i, lost, released)
		}
		if lost == 1 {
			outcomes["lost"]++
		} else {
			outcomes["released"]++
		}
	}
	t.Logf("ends of custody over %d rounds: %v", rounds, outcomes)
}

// Losing and regaining custody again and again leaves no goroutine
// behind: not the renew loop's calls, not the timers, not the workers.
func TestRepeatedLossAndReacquireLeakNoGoroutines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	db, thiefDB := testsupport.OpenDBAt(t, path), testsupport.OpenDBAt(t, path)
	thief := NewStore(thiefDB, quickTiming.TTL)
	baseline := goleak.IgnoreCurrent()
	h := newHarness(t)
	p := &probe{}
	store := NewStore(db, quickTiming.TTL)
	r := h.start(Options{Name: "cleanup", Instance: "instance-a", Timing: quickTiming, Store: store, Worker: p.props})
	_, at := h.events.wait(t, 0, "lease.acquired", is(LeaseAcquired, "instance-a"))
	for cycle := range 20 {
		// Another instance takes the lease over and hands it straight
		// back. The holder's lease writes wait meanwhile: a renewal
		// landing between the expiry and the theft would extend the
		// grant that merely ran out (it is still the holder's).
		turn := HoldTurn(t, store)
		expireNow(t, thiefDB, "cleanup")
		c := mustAcquire(t, thief, "cleanup", "instance-b")
		turn()
		if err := thief.Release(t.Context(), c); err != nil {
			t.Fatal(err)
		}
		lost, i := h.events.wait(t, at+1, "lease.lost", is(LeaseLost, "instance-a"))
		if lost.Reason != ReasonSuperseded {
			t.Fatalf("cycle %d: lost with reason %q", cycle, lost.Reason)
		}
		var acq Event
		acq, at = h.events.wait(t, i+1, "lease.acquired", is(LeaseAcquired, "instance-a"))
		if acq.Fence != c.Fence+1 {
			t.Fatalf("cycle %d: re-acquired with fence %d, want %d", cycle, acq.Fence, c.Fence+1)
		}
	}
	testsupport.Eventually(t, "21 workers started, 20 stopped", func() bool { return p.started.Load() == 21 && p.stopping.Load() == 20 })
	h.stopAndWait(r)
	h.shutdown()
	// protoactor's dead-letter log throttle (started when a message reaches
	// a stopped actor) ends on its own after its 1 s window: not ours.
	testsupport.VerifyNone(t, baseline)
}

// zombieTiming has a TTL long next to the retry interval, so a grant left
// to run out is easy to tell from one handed back.
var zombieTiming = config.Timing{TTL: 4 * time.Second, RenewInterval: 100 * time.Millisecond,
	RenewDeadline: time.Second, RetryInterval: 200 * time.Millisecond}

// Renewals that hung past the deadline (the holder gave the lease up as a
// blackout) may still reach the database afterwards, before the grant ran
// out, and extend it for a whole TTL that nobody uses: the holder itself
// then contends against its own dead grant. Such a late success must be
// handed back at once, as a late grant is.
func TestARenewalThatLandsAfterTheHolderGaveUpIsHandedBack(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	store := newFaultyStore(NewStore(db, zombieTiming.TTL))
	t.Cleanup(store.resume)
	p := &probe{}
	h.start(Options{Name: "jetstream-consumer", Instance: "instance-a", Timing: zombieTiming, Store: store, Worker: p.props})
	h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))
	store.hold(false)
	lost, i := h.events.wait(t, 0, "lease.lost", is(LeaseLost, "instance-a"))
	if lost.Reason != ReasonBlackout {
		t.Fatalf("lost with reason %q", lost.Reason)
	}
	h.events.wait(t, i, "lease.contended against its own grant", is(LeaseContended, "instance-a"))
	resumed := time.Now()
	store.resume()
	// The held renewal lands and succeeds, or finds the grant already
	// handed back (the contender saw its own unused grant and released
	// it): either way it must not leave the lease idle.
	if err := <-store.heldRenewals; err != nil && !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("the first held renewal: %v", err)
	}
	acq, _ := h.events.wait(t, i, "lease.acquired again", is(LeaseAcquired, "instance-a"))
	took := acq.At.Sub(resumed)
	t.Logf("re-acquired %s after the held renewals landed", took)
	if took >= zombieTiming.TTL/2 {
		t.Fatalf("the lease sat idle %s after a late renewal extended it: the late grant was not handed back", took)
	}
	if acq.Fence != 2 {
		t.Fatalf("re-acquired with fence %d, want 2", acq.Fence)
	}
	if h.events.count(func(e Event) bool {
		return e.Kind == LeaseReleased && e.Fence == 1 && e.Reason == ReasonStaleGrant
	}) != 1 {
		all, _ := h.events.snapshot()
		t.Fatalf("the hand-back of fence 1 was not published once:\n%s", formatEvents(all))
	}
}

// A LeaseActor stopped outright (its parent stopped it rather than asking)
// skips the graceful path; its worker is stopped first by the actor
// system, and the release still lands before the LeaseActor terminates.
func TestALeaseActorStoppedOutrightStillReleasesBeforeItTerminates(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	store := newFaultyStore(NewStore(db, fastTiming.TTL))
	store.releaseLag = 100 * time.Millisecond
	p := &probe{}
	r := h.start(Options{Name: "cleanup", Instance: "instance-a", Timing: fastTiming, Store: store, Worker: p.props})
	h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))
	h.sys.Root.Stop(r.pid)
	r.wait(t)
	if st := readRow(t, db, "cleanup").State(); st != fence.StateReleased {
		t.Fatalf("terminated with the lease %s", st)
	}
	if p.stopping.Load() != 1 {
		t.Fatalf("worker stopped %d times", p.stopping.Load())
	}
	rel, _ := h.events.wait(t, 0, "lease.released", is(LeaseReleased, "instance-a"))
	if rel.Reason != ReasonShutdown || rel.Fence != 1 {
		t.Fatalf("lease.released %+v", rel)
	}
}

// lateFirstAcquire holds the first Acquire until land is closed and fails
// every other one until then, so the first is abandoned and lands late.
// newLateFirstAcquire wraps inner; the test's cleanup lets a first acquire
// still held through.
func newLateFirstAcquire(t *testing.T, inner StoreAPI) *lateFirstAcquire {
	s := &lateFirstAcquire{StoreAPI: inner, land: make(chan struct{}), retried: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-s.land:
		default:
			close(s.land)
		}
	})
	return s
}

type lateFirstAcquire struct {
	StoreAPI
	land    chan struct{}
	mu      sync.Mutex
	calls   int
	retried chan struct{} // closed at the second call
}

func (s *lateFirstAcquire) Acquire(ctx context.Context, name, holder string) (Grant, error) {
	s.mu.Lock()
	s.calls++
	n := s.calls
	s.mu.Unlock()
	switch {
	case n == 1:
		<-s.land
		return s.StoreAPI.Acquire(ctx, name, holder)
	case n == 2:
		close(s.retried)
	}
	select {
	case <-s.land:
		return s.StoreAPI.Acquire(ctx, name, holder)
	default:
		return Grant{}, errors.New("injected: database error")
	}
}

// An acquire the LeaseActor stopped waiting for may still land and grant
// the lease; it is handed back at once, and both changes of custody are
// published (docs/spec.md §5: every custody change), so the fences in the log run
// without a gap.
func TestAGrantThatLandsAfterTheAcquireWasAbandonedIsHandedBackAndPublished(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	store := newLateFirstAcquire(t, NewStore(db, zombieTiming.TTL))
	p := &probe{}
	h.start(Options{Name: "jetstream-consumer", Instance: "instance-a", Timing: zombieTiming, Store: store, Worker: p.props})
	select {
	case <-store.retried: // the first acquire was abandoned
	case <-time.After(waitFor):
		t.Fatal("the hung acquire was never abandoned")
	}
	close(store.land)
	late, i := h.events.wait(t, 0, "the late grant published", func(e Event) bool {
		return e.Kind == LeaseAcquired && e.Reason == ReasonStaleGrant
	})
	back, _ := h.events.wait(t, i, "its hand-back published", func(e Event) bool {
		return e.Kind == LeaseReleased && e.Reason == ReasonStaleGrant
	})
	acq, _ := h.events.wait(t, 0, "the lease acquired for use", func(e Event) bool {
		return e.Kind == LeaseAcquired && e.Reason == ""
	})
	h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))
	if late.Fence != 1 || back.Fence != 1 || acq.Fence != 2 {
		all, _ := h.events.snapshot()
		t.Fatalf("late grant %d, hand-back %d, used grant %d; want 1, 1, 2\n%s", late.Fence, back.Fence, acq.Fence, formatEvents(all))
	}
}

// An acquire still running when the LeaseActor stops (the driver ignores
// contexts) may grant the lease after the actor stopped taking answers.
// The grant must not sit unused for a TTL: it is released before the
// actor has terminated, whichever side of the stop it lands on.
func TestAGrantObtainedAsTheLeaseActorStopsIsReleasedBeforeItTerminates(t *testing.T) {
	for _, landing := range []string{"during the stop", "after the abandon"} {
		t.Run(landing, func(t *testing.T) {
			db := testsupport.OpenDB(t)
			h := newHarness(t)
			store := newLateFirstAcquire(t, NewStore(db, zombieTiming.TTL))
			p := &probe{}
			r := h.start(Options{Name: "jetstream-consumer", Instance: "instance-a", Timing: zombieTiming, Store: store, Worker: p.props})
			select {
			case <-store.retried: // the first acquire was abandoned; it is still running
			case <-time.After(waitFor):
				t.Fatal("the hung acquire was never abandoned")
			}
			if landing == "after the abandon" {
				close(store.land)
				h.events.wait(t, 0, "the late grant handed back", func(e Event) bool {
					return e.Kind == LeaseReleased && e.Reason == ReasonStaleGrant
				})
				h.stopAndWait(r)
			} else {
				h.stop(r)
				close(store.land)
				r.wait(t)
			}
			row := readRow(t, db, "jetstream-consumer")
			if row.State() == fence.StateHeld {
				t.Fatalf("the lease is still held (fence %d, %d ms left) after the LeaseActor terminated", row.Fence, row.ExpiresAt-row.Now)
			}
		})
	}
}

// A hand-back publishes every change of custody it ends: a grant the
// machine never announced (found as its own by an acquire) gets its
// lease.acquired first; a release that finds the grant taken says
// lease.lost (superseded) only for such a grant, since a grant given up
// earlier was announced lost already.
func TestStaleGrantEventsReportEveryCustodyAHandBackEnds(t *testing.T) {
	superseded := fmt.Errorf("release: %w", fence.ErrSuperseded)
	kinds := func(h *holder, f int64) string {
		var s []string
		for _, c := range h.out {
			if e, ok := c.(EmitCmd); ok {
				if e.Event.Fence != f {
					t.Fatalf("event %+v is not about the handed-back grant %d", e.Event, f)
				}
				s = append(s, string(e.Event.Kind)+"/"+e.Event.Reason)
			}
		}
		return strings.Join(s, " ")
	}
	for _, tc := range []struct {
		acquired bool
		err      error
		want     string
	}{
		{true, nil, "lease.acquired/stale-grant lease.released/stale-grant"},
		{true, superseded, "lease.acquired/stale-grant lease.lost/superseded"},
		{false, nil, "lease.released/stale-grant"},
		{false, superseded, ""},
	} {
		var h *holder
		var f int64
		if tc.acquired {
			// A contender's attempt finds a grant of its own it never saw.
			h = &holder{t: t, m: NewMachine("cleanup", "a", fastTiming, rand.New(rand.NewPCG(1, 2)), 0)}
			h.step(Start{})
			acq := h.only(AcquireCmd{}).(AcquireCmd)
			f = 5
			h.at(time.Millisecond, AcquireResult{Seq: acq.Seq, Grant: Grant{Holder: "a", Fence: f, Own: true, TimeLeft: time.Second}})
		} else {
			// A holder gives its grant up in a blackout, then stops.
			h, f = newHolder(t), 1
			h.loseToBlackout()
			h.at(h.now+time.Millisecond, WorkerTerminated{Gen: 1})
			h.at(h.now+time.Millisecond, StopRequested{})
		}
		rel := h.only(ReleaseCmd{}).(ReleaseCmd)
		h.at(h.now+time.Millisecond, ReleaseResult{Seq: rel.Seq, Err: tc.err})
		if got := kinds(h, f); got != tc.want {
			t.Errorf("acquired=%v err=%v: %q, want %q", tc.acquired, tc.err, got, tc.want)
		}
	}
}
