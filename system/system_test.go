package system

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
)

// Timing bounds for the tests. Lease timings are short so that expiry,
// renewal and takeover happen within seconds; waits are generous because
// the race detector on two cores is slow.
const (
	testTTL           = 3 * time.Second
	testRenewInterval = 500 * time.Millisecond
	testRenewDeadline = 2 * time.Second
	testRetryInterval = 200 * time.Millisecond
	waitBound         = 15 * time.Second
	pollEvery         = 10 * time.Millisecond
	stopBound         = 10 * time.Second
	instance          = "test-instance"
)

// TestMain fails the package if goroutines outlive the tests; the one
// standing exception (protoactor-go's dead-letter throttle) is in
// internal/testsupport (VerifyTestMain).
func TestMain(m *testing.M) { testsupport.VerifyTestMain(m) }

// harness is one System on a fresh file database, with every custody
// event it publishes recorded in order.
type harness struct {
	t   *testing.T
	db  *database.DB
	sys *System
	log *testsupport.LockedBuffer

	mu     sync.Mutex
	events []lease.Event
}

func testConfig() config.Config {
	cfg := config.Default()
	cfg.InstanceID = instance
	cfg.Leases.TTL = testTTL
	cfg.Leases.RenewInterval = testRenewInterval
	cfg.Leases.RenewDeadline = testRenewDeadline
	cfg.Leases.RetryInterval = testRetryInterval
	return cfg
}

// newHarness builds (but does not start) a System running workers.
func newHarness(t *testing.T, cfg config.Config, specs ...workers.Spec) *harness {
	t.Helper()
	db := testsupport.OpenDB(t)
	reg := &Registry{}
	for _, w := range specs {
		if err := reg.Register(w); err != nil {
			t.Fatal(err)
		}
	}
	h := &harness{t: t, db: db, log: &testsupport.LockedBuffer{}}
	var err error
	h.sys, err = New(Options{Config: cfg, DB: db, Log: NewLogger(h.log, zerolog.DebugLevel),
		Registry: reg, Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	// The handler runs on the publisher's goroutine: append and return.
	h.sys.actors.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(lease.Event); ok {
			h.mu.Lock()
			h.events = append(h.events, e)
			h.mu.Unlock()
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", h.log.String())
		}
	})
	return h
}

// takeOver grants lease to another instance for ttl (database clock), with
// the next fence, as if this one had stalled past its TTL.
func (h *harness) takeOver(lease string, ttl time.Duration) error {
	_, err := h.db.Exec(`UPDATE leases SET holder = 'other-instance', fence = fence + 1,
		acquired_at = `+database.NowMS+`, renewed_at = `+database.NowMS+`, expires_at = `+database.NowMS+` + ?2
		WHERE name = ?1`, lease, ttl.Milliseconds())
	return err
}

func (h *harness) start() {
	h.t.Helper()
	if err := h.sys.Start(); err != nil {
		h.t.Fatal(err)
	}
}

// stop stops the System within stopBound and closes the database, so
// that goleak sees neither actors nor the pool's goroutines.
func (h *harness) stop() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), stopBound)
	defer cancel()
	if err := h.sys.Stop(ctx); err != nil {
		h.t.Fatalf("Stop: %v", err)
	}
	if err := h.db.Close(); err != nil {
		h.t.Fatalf("close database: %v", err)
	}
}

// seen returns the recorded events matching kind and lease.
func (h *harness) seen(kind lease.EventKind, name string) []lease.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []lease.Event
	for _, e := range h.events {
		if e.Kind == kind && e.Lease == name {
			out = append(out, e)
		}
	}
	return out
}

// waitEvent waits for the n-th event of kind on lease and returns it.
func (h *harness) waitEvent(kind lease.EventKind, name string, n int) lease.Event {
	h.t.Helper()
	var got []lease.Event
	testsupport.Eventually(h.t, fmt.Sprintf("%d× %s on %s", n, kind, name), func() bool {
		got = h.seen(kind, name)
		return len(got) >= n
	})
	return got[n-1]
}

// row reads one lease row with the database clock's now.
type leaseRow struct {
	holder                       string
	fence, renewed, expires, now int64
}

func (h *harness) row(name string) (leaseRow, bool) {
	h.t.Helper()
	var r leaseRow
	err := h.db.QueryRow(`SELECT holder, fence, renewed_at, expires_at, `+database.NowMS+` FROM leases WHERE name = ?1`, name).
		Scan(&r.holder, &r.fence, &r.renewed, &r.expires, &r.now)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return r, true
}

func (h *harness) assertHeld(name string, fence int64) {
	h.t.Helper()
	r, ok := h.row(name)
	if !ok || r.holder != instance || r.fence != fence || r.expires <= r.now {
		h.t.Fatalf("lease %s = %+v (exists %v), want held by %s with fence %d", name, r, ok, instance, fence)
	}
}

// assertReleasedInPlace checks docs/spec.md §4's release: the row is kept, holder
// and fence unchanged, expired now (renewed_at = expires_at <= now).
func (h *harness) assertReleasedInPlace(name string, fence int64) {
	h.t.Helper()
	r, ok := h.row(name)
	if !ok || r.holder != instance || r.fence != fence || r.expires > r.now || r.renewed != r.expires {
		h.t.Fatalf("lease %s = %+v (exists %v), want released in place by %s keeping fence %d", name, r, ok, instance, fence)
	}
}

// probe records an actor worker's lifecycle.
type probe struct {
	mu       sync.Mutex
	started  []fence.Custody
	stopping int
}

func (p *probe) actorWorker(name string, leased bool) workers.Spec {
	return workers.Spec{Name: name, Leased: leased, Actor: func(c fence.Custody) *actor.Props {
		return actor.PropsFromProducer(func() actor.Actor { return &probeActor{p: p, c: c} })
	}}
}

func (p *probe) startedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.started)
}

type probeActor struct {
	p *probe
	c fence.Custody
}

func (a *probeActor) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		a.p.mu.Lock()
		a.p.started = append(a.p.started, a.c)
		a.p.mu.Unlock()
	case *actor.Stopping:
		a.p.mu.Lock()
		a.p.stopping++
		a.p.mu.Unlock()
	case *actor.Stopped:
	}
}

// runs counts job runs by fence.
type runs struct {
	mu      sync.Mutex
	byFence map[int64]int
	total   atomic.Int64
}

func (r *runs) add(c fence.Custody) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byFence == nil {
		r.byFence = map[int64]int{}
	}
	r.byFence[c.Fence]++
	return int(r.total.Add(1))
}

func (r *runs) under(fence int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byFence[fence]
}

func TestStartRunsEveryKindOfWorkerAndStopReleasesEveryLease(t *testing.T) {
	leasedActor, unleasedActor := &probe{}, &probe{}
	var leasedJob, unleasedJob runs
	h := newHarness(t, testConfig(),
		leasedActor.actorWorker("leased-actor", true),
		unleasedActor.actorWorker("unleased-actor", false),
		workers.Spec{Name: "leased-job", Leased: true, Interval: 20 * time.Millisecond,
			Job: func(ctx context.Context, c fence.Custody) error { leasedJob.add(c); return nil }},
		workers.Spec{Name: "unleased-job", Leased: false,
			Job: func(ctx context.Context, c fence.Custody) error { unleasedJob.add(c); return nil }},
	)
	h.start()
	for _, name := range []string{"leased-actor", "unleased-actor", "leased-job", "unleased-job"} {
		h.waitEvent(lease.WorkerStarted, name, 1)
	}
	testsupport.Eventually(h.t, "both actors started, the periodic job run 3 times, the once-only job once", func() bool {
		return leasedActor.startedCount() == 1 && unleasedActor.startedCount() == 1 &&
			leasedJob.total.Load() >= 3 && unleasedJob.total.Load() == 1
	})
	if c := leasedActor.started[0]; c.Fence != 1 || c.Holder != instance || c.Lease != "leased-actor" {
		t.Errorf("leased actor custody = %+v, want leased-actor held by %s with fence 1", c, instance)
	}
	if c := unleasedActor.started[0]; c.Fence != 0 {
		t.Errorf("unleased actor custody = %+v, want fence 0 (unfenced)", c)
	}
	if leasedJob.under(1) != int(leasedJob.total.Load()) || unleasedJob.under(0) != 1 {
		t.Errorf("jobs ran under the wrong fences: leased %v, unleased %v", leasedJob.byFence, unleasedJob.byFence)
	}
	h.assertHeld("leased-actor", 1)
	h.assertHeld("leased-job", 1)
	for _, name := range []string{"unleased-actor", "unleased-job"} {
		if _, ok := h.row(name); ok {
			t.Errorf("unleased worker %s has a lease row", name)
		}
		if n := len(h.seen(lease.LeaseAcquired, name)); n != 0 {
			t.Errorf("unleased worker %s published %d lease.acquired", name, n)
		}
	}

	h.stop()
	h.db = reopen(t, h.db)
	for _, name := range []string{"leased-actor", "leased-job"} {
		if rel := h.seen(lease.LeaseReleased, name); len(rel) != 1 || rel[0].Fence != 1 || rel[0].Reason != lease.ReasonShutdown {
			t.Errorf("%s: lease.released events %+v, want one with fence 1, reason shutdown", name, rel)
		}
		h.assertReleasedInPlace(name, 1)
	}
	for _, name := range []string{"leased-actor", "unleased-actor", "leased-job", "unleased-job"} {
		if n := len(h.seen(lease.WorkerStopped, name)); n != 1 {
			t.Errorf("%s: %d worker.stopped, want 1", name, n)
		}
	}
	if leasedActor.stopping != 1 || unleasedActor.stopping != 1 {
		t.Errorf("actors saw Stopping %d and %d times, want once each", leasedActor.stopping, unleasedActor.stopping)
	}
	h.db.Close()
	testsupport.VerifyNone(t)
}

// reopen opens the closed harness database again, to read it after Stop.
func reopen(t *testing.T, closed *database.DB) *database.DB {
	t.Helper()
	db, err := database.Open(context.Background(), database.Options{URL: "file:" + closed.Path, BusyTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestStopWaitsForARunningJobToReturnBeforeReleasing(t *testing.T) {
	running, returned := make(chan struct{}), make(chan struct{})
	var releasedAfterReturn, wroteWhileStopping atomic.Bool
	var h *harness
	h = newHarness(t, testConfig(), workers.Spec{Name: "slow-job", Leased: true,
		Job: func(ctx context.Context, c fence.Custody) error {
			close(running)
			<-ctx.Done()
			// Custody is still held until the release, but a stopping
			// job's fenced writes are refused by its cancelled context.
			err := fence.Fenced(ctx, h.db, c, func(*sql.Tx) error { wroteWhileStopping.Store(true); return nil })
			close(returned)
			return err
		}})
	h.sys.actors.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(lease.Event); ok && e.Kind == lease.LeaseReleased {
			select {
			case <-returned:
				releasedAfterReturn.Store(true)
			default:
			}
		}
	})
	h.start()
	<-running
	h.stop()
	select {
	case <-returned:
	default:
		t.Fatal("Stop returned before the job did")
	}
	if !releasedAfterReturn.Load() {
		t.Error("the lease was released before the job returned")
	}
	if wroteWhileStopping.Load() {
		t.Error("a fenced write ran after the job's context was cancelled")
	}
	testsupport.VerifyNone(t)
}

func TestAGracefulStopEndsAJobWithCauseErrDrainAndALossWithCanceled(t *testing.T) {
	causes := make(chan error, 2)
	var h *harness
	h = newHarness(t, testConfig(), workers.Spec{Name: "cause", Leased: true,
		Job: func(ctx context.Context, c fence.Custody) error {
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		}})
	h.start()
	h.waitEvent(lease.WorkerStarted, "cause", 1)
	// Another instance takes the lease over: the next renewal finds it
	// superseded and stops the worker at once, without a drain.
	if _, err := h.db.Exec(`UPDATE leases SET holder = 'other-instance', fence = fence + 1 WHERE name = ?1`, "cause"); err != nil {
		t.Fatal(err)
	}
	h.waitEvent(lease.LeaseLost, "cause", 1)
	if cause := <-causes; !errors.Is(cause, context.Canceled) || errors.Is(cause, workers.ErrDrain) {
		t.Errorf("a job whose custody was lost ended with cause %v, want context.Canceled", cause)
	}
	if _, err := h.db.Exec(`UPDATE leases SET expires_at = 0 WHERE name = ?1`, "cause"); err != nil {
		t.Fatal(err)
	}
	h.waitEvent(lease.WorkerStarted, "cause", 2)
	h.stop()
	if cause := <-causes; !errors.Is(cause, workers.ErrDrain) {
		t.Errorf("a job stopped gracefully ended with cause %v, want workers.ErrDrain", cause)
	}
	testsupport.VerifyNone(t)
}

func TestJobWithIntervalZeroRunsOnceThenHoldsCustodyIdle(t *testing.T) {
	var r runs
	h := newHarness(t, testConfig(), workers.Spec{Name: "once", Leased: true,
		Job: func(ctx context.Context, c fence.Custody) error { r.add(c); return nil }})
	h.start()
	h.waitEvent(lease.WorkerStarted, "once", 1)
	// Several renewals later the job has still run only once, and the
	// lease is still held: the worker idles holding custody.
	h.waitEvent(lease.LeaseRenewed, "once", 3)
	if got := r.total.Load(); got != 1 {
		t.Fatalf("job ran %d times, want once", got)
	}
	h.assertHeld("once", 1)
	h.stop()
	h.db = reopen(t, h.db)
	h.assertReleasedInPlace("once", 1)
	h.db.Close()
	testsupport.VerifyNone(t)
}

func TestJobErrorsAreRetriedWithoutRestartingTheWorker(t *testing.T) {
	var once, periodic runs
	h := newHarness(t, testConfig(),
		workers.Spec{Name: "once-flaky", Leased: true, Job: func(ctx context.Context, c fence.Custody) error {
			if once.add(c) <= 2 {
				return errors.New("flaky")
			}
			return nil
		}},
		workers.Spec{Name: "periodic-failing", Leased: true, Interval: 20 * time.Millisecond,
			Job: func(ctx context.Context, c fence.Custody) error {
				periodic.add(c)
				return errors.New("always fails")
			}},
	)
	h.start()
	testsupport.Eventually(h.t, "the once-only job retried until it succeeded (3 runs) and the periodic one run 5 times", func() bool {
		return once.total.Load() >= 3 && periodic.total.Load() >= 5
	})
	// Give a wrongly repeated once-only job the chance to show itself: a
	// renewal after its success.
	n := len(h.seen(lease.LeaseRenewed, "once-flaky"))
	h.waitEvent(lease.LeaseRenewed, "once-flaky", n+1)
	if got := once.total.Load(); got != 3 {
		t.Errorf("once-only job ran %d times, want 3 (two failures, one success)", got)
	}
	for _, name := range []string{"once-flaky", "periodic-failing"} {
		if n := len(h.seen(lease.WorkerRestarted, name)); n != 0 {
			t.Errorf("%s: %d worker.restarted; an error is retried, not a failure", name, n)
		}
		if n := len(h.seen(lease.WorkerStarted, name)); n != 1 {
			t.Errorf("%s: %d worker.started, want 1", name, n)
		}
		h.assertHeld(name, 1)
	}
	if once.under(1) != 3 {
		t.Errorf("once-only job runs by fence %v, want all under fence 1", once.byFence)
	}
	h.stop()
	testsupport.VerifyNone(t)
}

func TestJobPanicRestartsTheWorkerUnderTheSameCustody(t *testing.T) {
	var r runs
	h := newHarness(t, testConfig(), workers.Spec{Name: "panicky", Leased: true,
		Job: func(ctx context.Context, c fence.Custody) error {
			if r.add(c) == 1 {
				panic("boom")
			}
			return nil
		}})
	h.start()
	restarted := h.waitEvent(lease.WorkerRestarted, "panicky", 1)
	if restarted.Fence != 1 || restarted.Attempt != 1 || restarted.Err == nil || !strings.Contains(restarted.Err.Error(), "boom") {
		t.Errorf("worker.restarted = %+v, want fence 1, attempt 1, the panic as cause", restarted)
	}
	testsupport.Eventually(h.t, "the job run again after the restart", func() bool { return r.total.Load() == 2 })
	if r.under(1) != 2 {
		t.Errorf("runs by fence %v, want both under fence 1 (a restart keeps custody)", r.byFence)
	}
	h.assertHeld("panicky", 1)
	if n := len(h.seen(lease.LeaseLost, "panicky")) + len(h.seen(lease.LeaseReleased, "panicky")); n != 0 {
		t.Errorf("custody changed hands over a restart (%d lost/released events)", n)
	}
	h.stop()
	if !strings.Contains(h.log.String(), `"event":"worker.restarted","lease":"panicky"`) {
		t.Errorf("worker.restarted was not logged:\n%s", h.log.String())
	}
	testsupport.VerifyNone(t)
}

func TestJobThatAlwaysPanicsGivesTheLeaseUp(t *testing.T) {
	h := newHarness(t, testConfig(), workers.Spec{Name: "doomed", Leased: true,
		Job: func(ctx context.Context, c fence.Custody) error { panic("always") }})
	h.start()
	failed := h.waitEvent(lease.WorkerFailed, "doomed", 1)
	released := h.waitEvent(lease.LeaseReleased, "doomed", 1)
	if failed.Fence != 1 || released.Fence != 1 || released.Reason != lease.ReasonWorkerFailed {
		t.Errorf("worker.failed %+v then lease.released %+v; want fence 1 and reason %s", failed, released, lease.ReasonWorkerFailed)
	}
	h.stop()
	testsupport.VerifyNone(t)
}

func TestJobReturningErrSupersededStopsTheWorker(t *testing.T) {
	var r runs
	var h *harness
	h = newHarness(t, testConfig(), workers.Spec{Name: "usurped", Leased: true,
		Job: func(ctx context.Context, c fence.Custody) error {
			if r.add(c) > 1 {
				return nil
			}
			// Another instance takes the lease (as if this one had stalled
			// past its TTL); the job's next fenced write finds out.
			if err := h.takeOver(c.Lease, testTTL); err != nil {
				return err
			}
			return fence.Fenced(ctx, h.db, c, func(*sql.Tx) error { return nil })
		}})
	h.start()
	lost := h.waitEvent(lease.LeaseLost, "usurped", 1)
	if lost.Reason != lease.ReasonSuperseded || lost.Fence != 1 || lost.Err == nil || !strings.Contains(lost.Err.Error(), "fenced write") {
		t.Fatalf("lease.lost = %+v, want reason superseded, fence 1, caused by the job's fenced write", lost)
	}
	h.waitEvent(lease.WorkerStopped, "usurped", 1)
	if n := len(h.seen(lease.WorkerRestarted, "usurped")); n != 0 {
		t.Errorf("%d worker.restarted: a superseded worker is stopped, never restarted", n)
	}
	if n := len(h.seen(lease.LeaseReleased, "usurped")); n != 0 {
		t.Errorf("%d lease.released: a superseded holder must not touch the row", n)
	}
	if r.under(1) != 1 {
		t.Errorf("runs by fence %v: the job ran again under the lost custody", r.byFence)
	}
	// The usurper never renews: once its grant expires this instance takes
	// the lease back with a new fence and starts a fresh worker.
	again := h.waitEvent(lease.LeaseAcquired, "usurped", 2)
	if again.Fence != 3 {
		t.Errorf("re-acquired with fence %d, want 3 (1 ours, 2 the usurper's)", again.Fence)
	}
	testsupport.Eventually(h.t, "the job run under the new custody", func() bool { return r.under(3) == 1 })
	h.stop()
	testsupport.VerifyNone(t)
}

// A worker whose last write the database failed makes the instance
// unready only while it holds the lease: once another instance has taken
// the lease, Ready reports the database by this process's lease writes
// again, and /readyz does not fail until the lease comes back.
func TestReadyForgetsAWorkersFailedWriteOnceItsLeaseIsLost(t *testing.T) {
	var r runs
	var h *harness
	h = newHarness(t, testConfig(), workers.Spec{Name: "broken", Leased: true,
		Job: func(ctx context.Context, c fence.Custody) error {
			if r.add(c) > 1 {
				return nil
			}
			return fence.Fenced(ctx, h.db, c, func(tx *sql.Tx) error {
				_, err := tx.Exec(`INSERT INTO no_such_table VALUES (1)`)
				return err
			})
		}})
	h.start()
	testsupport.Eventually(h.t, "the failed write reported by Ready", func() bool {
		err := h.sys.Ready()
		return err != nil && strings.Contains(err.Error(), "broken worker")
	})
	// Another instance takes the lease for longer than the test.
	if err := h.takeOver("broken", time.Hour); err != nil {
		t.Fatal(err)
	}
	h.waitEvent(lease.LeaseLost, "broken", 1)
	testsupport.Eventually(h.t, "Ready healthy once the lease is lost", func() bool { return h.sys.Ready() == nil })
	h.stop()
	testsupport.VerifyNone(t)
}

func TestLeasesDisabledRunsLeasedWorkersUnfencedWithoutRows(t *testing.T) {
	cfg := testConfig()
	cfg.Leases.Enabled = false
	var r runs
	h := newHarness(t, cfg, workers.Spec{Name: "cleanup-like", Leased: true,
		Job: func(ctx context.Context, c fence.Custody) error { r.add(c); return nil }})
	h.start()
	testsupport.Eventually(h.t, "the job run", func() bool { return r.total.Load() == 1 })
	if r.under(0) != 1 {
		t.Errorf("runs by fence %v, want fence 0 (unfenced)", r.byFence)
	}
	if _, ok := h.row("cleanup-like"); ok {
		t.Error("a lease row was written with leases disabled")
	}
	// Its leases-off record is there from the start, refreshed every
	// renew interval, and gone after the stop.
	seenAt := func() (int64, bool) {
		var at int64
		err := h.db.QueryRow(`SELECT seen_at FROM unleased_instances WHERE instance = ?1`, instance).Scan(&at)
		return at, err == nil
	}
	first, ok := seenAt()
	if !ok {
		t.Fatal("no leases-off record once started")
	}
	testsupport.Eventually(h.t, "the leases-off record refreshed", func() bool { at, ok := seenAt(); return ok && at > first })
	select {
	case err := <-h.sys.Conflict():
		t.Fatalf("a conflict with nobody beside it: %v", err)
	default:
	}
	h.stop()
	if _, ok := seenAt(); ok {
		t.Error("the leases-off record outlived the stop")
	}
	testsupport.VerifyNone(t)
}

// An instance with leases off that finds, after its start, a lease held
// on the database (a leased instance started at the same moment, past the
// start's check) or another leases-off instance that started before it
// reports it on Conflict, once.
func TestLeasesDisabledReportsAnInstanceStartedBesideIt(t *testing.T) {
	for _, tc := range []struct {
		name, beside string
		want         string
	}{
		{"a held lease", `INSERT INTO leases (name, holder, fence, acquired_at, renewed_at, expires_at)
VALUES ('cleanup', 'leased', 1, 0, 0, 9000000000000)`, "leases are held on this database (cleanup by leased (fence 1))"},
		{"an earlier unleased start", `INSERT INTO unleased_instances (instance, nonce, started_at, seen_at, every_ms)
VALUES ('earlier', 'n0', 0, 9000000000000, 1000)`, "earlier (seen 0s ago) started before this one with leases off too"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Leases.Enabled = false
			h := newHarness(t, cfg, workers.Spec{Name: "idle", Leased: true,
				Job: func(ctx context.Context, c fence.Custody) error { <-ctx.Done(); return nil }})
			h.start()
			if _, err := h.db.Exec(tc.beside); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-h.sys.Conflict():
				if !errors.Is(err, ErrBesideUnleased) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("conflict %v, want ErrBesideUnleased naming %q", err, tc.want)
				}
			case <-time.After(10 * testRenewInterval):
				t.Fatal("no conflict reported within ten refreshes")
			}
			h.stop()
			testsupport.VerifyNone(t)
		})
	}
}

func TestStopBeforeStartAndStartTwiceAreHarmless(t *testing.T) {
	h := newHarness(t, testConfig(), workers.Spec{Name: "idle", Leased: false,
		Job: func(ctx context.Context, c fence.Custody) error { return nil }})
	h.start()
	if err := h.sys.Start(); err == nil {
		t.Error("a second Start returned nil")
	}
	h.stop()

	h2 := newHarness(t, testConfig())
	h2.stop()
	testsupport.VerifyNone(t)
}

// stuckActor blocks in Drain until release is closed: a worker whose
// graceful stop hangs (a request with no answer and a long timeout).
type stuckActor struct{ release chan struct{} }

func (a *stuckActor) Receive(ctx actor.Context) {
	if _, ok := ctx.Message().(*workers.Drain); ok {
		<-a.release
	}
}

// A worker stuck past the LeaseActor's bound on its stop is reported and
// left behind, and the lease is released; Stop then runs out of time
// waiting for the stuck actor. It said "a lease not released runs out its
// TTL" (exit 1 from serve), though every lease had been released: now its
// error wraps ErrStoppedLate, and the lease row is released in place.
func TestAStopThatRunsOutWithEveryLeaseReleasedIsLateNotIncomplete(t *testing.T) {
	release := make(chan struct{})
	h := newHarness(t, testConfig(), workers.Spec{Name: "stuck", Leased: true, Actor: func(fence.Custody) *actor.Props {
		return actor.PropsFromProducer(func() actor.Actor { return &stuckActor{release: release} })
	}})
	h.start()
	// The LeaseActor spawns its worker as it handles the grant, before any
	// later message (the stop) reaches it.
	testsupport.Eventually(t, "the lease to be acquired", func() bool { return len(h.seen(lease.LeaseAcquired, "stuck")) == 1 })
	r, _ := h.row("stuck")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second) // past the 10 s bound on a worker's stop
	defer cancel()
	err := h.sys.Stop(ctx)
	close(release) // the stuck actor may now finish, for goleak
	if !errors.Is(err, ErrStoppedLate) {
		t.Fatalf("Stop = %v, want an error wrapping ErrStoppedLate", err)
	}
	h.assertReleasedInPlace("stuck", r.fence)
	if len(h.seen(lease.WorkerStuck, "stuck")) != 1 {
		t.Fatalf("no worker.stuck event for the stuck worker")
	}
	if err := h.db.Close(); err != nil {
		t.Fatal(err)
	}
}
