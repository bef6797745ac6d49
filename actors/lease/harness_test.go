package lease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/workers"
)

// waitFor bounds every wait on an event or a state; a test that needs
// longer has found a bug, not a slow
const waitFor = 15 * time.Second

// fastTiming keeps actor tests short while respecting the config
// invariants (RenewInterval < TTL/2, RenewInterval < RenewDeadline < TTL).
var fastTiming = config.Timing{TTL: 2 * time.Second, RenewInterval: 100 * time.Millisecond,
	RenewDeadline: time.Second, RetryInterval: 200 * time.Millisecond}

// rowBytes is the row of lease name rendered by SQLite's quote(): the exact
// stored values and their storage classes, for "unchanged" assertions.
func rowBytes(t testing.TB, db *database.DB, name string) string {
	t.Helper()
	var s string
	err := db.QueryRow(`SELECT quote(name)||'|'||quote(holder)||'|'||quote(fence)||'|'||
quote(acquired_at)||'|'||quote(renewed_at)||'|'||quote(expires_at) FROM leases WHERE name = ?1`, name).Scan(&s)
	if errors.Is(err, sql.ErrNoRows) {
		return "<no row>"
	}
	if err != nil {
		t.Fatalf("read lease %q: %v", name, err)
	}
	return s
}

// readRow reads one lease row with the database clock.
func readRow(t testing.TB, db *database.DB, name string) fence.Row {
	t.Helper()
	rows, err := fence.List(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no lease row %q", name)
	return fence.Row{}
}

// eventLog records every custody event published on an actor system's
// EventStream. Its handler never blocks the publisher (a LeaseActor): it
// appends under a mutex and wakes waiters by closing a channel.
type eventLog struct {
	mu      sync.Mutex
	all     []Event
	changed chan struct{}
}

func newEventLog(sys *actor.ActorSystem) *eventLog {
	l := &eventLog{changed: make(chan struct{})}
	sys.EventStream.Subscribe(func(evt any) {
		e, ok := evt.(Event)
		if !ok {
			return
		}
		l.mu.Lock()
		l.all = append(l.all, e)
		close(l.changed)
		l.changed = make(chan struct{})
		l.mu.Unlock()
	})
	return l
}

func (l *eventLog) snapshot() ([]Event, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.all...), l.changed
}

// wait returns the first event at or after index from that matches, and
// its index; it fails the test after waitFor.
func (l *eventLog) wait(t testing.TB, from int, what string, match func(Event) bool) (Event, int) {
	t.Helper()
	deadline := time.NewTimer(waitFor)
	defer deadline.Stop()
	for {
		all, changed := l.snapshot()
		for i := from; i < len(all); i++ {
			if match(all[i]) {
				return all[i], i
			}
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("no %s within %s; events:\n%s", what, waitFor, formatEvents(all))
		}
	}
}

// count is how many recorded events match.
func (l *eventLog) count(match func(Event) bool) int {
	all, _ := l.snapshot()
	n := 0
	for _, e := range all {
		if match(e) {
			n++
		}
	}
	return n
}

func formatEvents(all []Event) string {
	var s string
	for _, e := range all {
		s += fmt.Sprintf("  %s %s %s fence=%d reason=%s err=%v\n", e.At.Format("15:04:05.000"), e.Instance, e.Kind, e.Fence, e.Reason, e.Err)
	}
	return s
}

// is matches an event of kind from instance (any lease).
func is(kind EventKind, instance string) func(Event) bool {
	return func(e Event) bool { return e.Kind == kind && e.Instance == instance }
}

// isFor matches an event of kind from instance for lease.
func isFor(kind EventKind, instance, lease string) func(Event) bool {
	return func(e Event) bool { return e.Kind == kind && e.Instance == instance && e.Lease == lease }
}

// harness is one actor system with its event log. Every LeaseActor started
// on it runs under a parent that records the LeaseActor's own failures
// (a panic in the LeaseActor is a bug) and its termination.
type harness struct {
	t      *testing.T
	sys    *actor.ActorSystem
	events *eventLog

	mu      sync.Mutex
	running []*runner
	// afterStop runs at the test's end, once every LeaseActor has stopped
	// (nothing can start a nudge or a contender write any more).
	afterStop []func()
	shutOnce  sync.Once
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	h := &harness{t: t, sys: sys, events: newEventLog(sys)}
	t.Cleanup(func() {
		h.mu.Lock()
		running, after := h.running, h.afterStop
		h.mu.Unlock()
		for _, r := range running {
			h.stopAndWait(r)
		}
		for _, f := range after {
			f()
		}
		h.shutdown()
	})
	return h
}

// shutdown shuts the actor system down (once).
func (h *harness) shutdown() { h.shutOnce.Do(h.sys.Shutdown) }

// runner is one LeaseActor under test.
type runner struct {
	pid    *actor.PID
	done   chan struct{}
	panics atomic.Int32
	reason atomic.Value
}

// failureRecorder is the supervisor of the LeaseActor: it records the
// LeaseActor's own failure and stops it.
type failureRecorder struct{ r *runner }

func (f failureRecorder) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID,
	_ *actor.RestartStatistics, reason any, _ any) {
	f.r.panics.Add(1)
	f.r.reason.Store(fmt.Sprint(reason))
	sup.StopChildren(child)
}

// start spawns a LeaseActor for o. o.Publish defaults to the EventStream.
func (h *harness) start(o Options) *runner {
	h.t.Helper()
	if o.Publish == nil {
		es := h.sys.EventStream
		o.Publish = func(e Event) { es.Publish(e) }
	}
	r := &runner{done: make(chan struct{})}
	pids := make(chan *actor.PID, 1)
	props, err := NewProps(o)
	if err != nil {
		h.t.Fatalf("NewProps: %v", err)
	}
	h.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch c.Message().(type) {
		case *actor.Started:
			pids <- c.Spawn(props)
		case *actor.Terminated:
			close(r.done)
			c.Stop(c.Self())
		}
	}, actor.WithSupervisor(failureRecorder{r})))
	r.pid = <-pids
	h.mu.Lock()
	h.running = append(h.running, r)
	h.mu.Unlock()
	return r
}

// stop asks the LeaseActor to stop gracefully.
func (h *harness) stop(r *runner) { h.sys.Root.Send(r.pid, &StopRequested{}) }

// stopAndWait stops the LeaseActor gracefully and waits until it has
// terminated.
func (h *harness) stopAndWait(r *runner) {
	h.t.Helper()
	if !r.terminated() {
		h.stop(r)
	}
	r.wait(h.t)
}

// wait waits until the LeaseActor has terminated.
func (r *runner) wait(t testing.TB) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(waitFor):
		t.Fatalf("lease actor %s did not terminate within %s", r.pid, waitFor)
	}
}

func (r *runner) terminated() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// probe is a test worker: it counts its lifecycle messages and, on demand,
// panics or makes a fenced write. One probe serves every worker spawned
// from its props (one per grant of custody).
type probe struct {
	started, stopping, restarting atomic.Int32
	// drains counts Drain messages; drainedBeforeStop that one came first.
	drains            atomic.Int32
	drainedBeforeStop atomic.Bool
	// stoppingAt is when the last worker received Stopping.
	stoppingAt atomic.Value
	// panicOnStart (a string) makes every start (spawn or restart) panic
	// with it; "" stops that.
	panicOnStart atomic.Value
	mu           sync.Mutex
	custody      []fence.Custody
	self         *actor.PID
}

// panicWith asks a running worker to panic with reason.
type panicWith struct{ reason any }

// fencedWrite asks a running worker to write under its custody and to fail
// (panic) with the error if the write is refused, as a real worker does.
type fencedWrite struct {
	db   *database.DB
	done chan error
}

func (p *probe) props(c fence.Custody) *actor.Props {
	p.mu.Lock()
	p.custody = append(p.custody, c)
	p.mu.Unlock()
	return actor.PropsFromProducer(func() actor.Actor { return &probeWorker{p: p, c: c} })
}

func (p *probe) pid() *actor.PID {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.self
}

func (p *probe) custodies() []fence.Custody {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]fence.Custody(nil), p.custody...)
}

type probeWorker struct {
	p *probe
	c fence.Custody
}

func (w *probeWorker) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		w.p.started.Add(1)
		w.p.mu.Lock()
		w.p.self = ctx.Self()
		w.p.mu.Unlock()
		if reason, _ := w.p.panicOnStart.Load().(string); reason != "" {
			panic(reason)
		}
	case *actor.Restarting:
		w.p.restarting.Add(1)
	case *workers.Drain:
		w.p.drains.Add(1)
		if w.p.stopping.Load() == 0 {
			w.p.drainedBeforeStop.Store(true)
		}
	case *actor.Stopping:
		w.p.stoppingAt.Store(time.Now())
		w.p.stopping.Add(1)
	case panicWith:
		panic(msg.reason)
	case fencedWrite:
		err := fence.Fenced(context.Background(), msg.db, w.c, func(tx *sql.Tx) error {
			_, err := tx.Exec(`INSERT INTO probe_writes (fence) VALUES (?1)`, w.c.Fence)
			return err
		})
		msg.done <- err
		if err != nil {
			panic(err)
		}
	}
}

// createProbeTable adds the table fencedWrite writes to.
func createProbeTable(t testing.TB, db *database.DB) {
	t.Helper()
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS probe_writes (fence INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// faultyStore wraps a StoreAPI so a test can hold (hang) or fail calls, and
// records when each call was made and answered.
type faultyStore struct {
	inner StoreAPI

	mu       sync.Mutex
	gate     chan struct{} // non-nil: renewals (and, with pauseAll, every call) wait for it to close
	pauseAll bool
	fail     error // non-nil: renewals return it without reaching the database
	// failAfter, when set, replaces the answer of a held renewal.
	failAfter error
	entered   chan struct{} // receives (non-blocking) when a renewal starts waiting at the gate
	// lastRenewOK is when the last successful renewal answered.
	lastRenewOK time.Time
	acquires    []time.Time
	releaseLag  time.Duration
	// heldRenewals receives the answer of every renewal that was held.
	heldRenewals chan error
}

func newFaultyStore(inner StoreAPI) *faultyStore {
	return &faultyStore{inner: inner, entered: make(chan struct{}, 1), heldRenewals: make(chan error, 1000)}
}

// hold makes renewals (all calls with all=true) wait until resume.
func (f *faultyStore) hold(all bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gate == nil {
		f.gate = make(chan struct{})
	}
	f.pauseAll = all
}

// resume lets every held call through.
func (f *faultyStore) resume() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gate != nil {
		close(f.gate)
		f.gate = nil
	}
}

func (f *faultyStore) failRenewals(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

func (f *faultyStore) lastRenewal() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastRenewOK
}

func (f *faultyStore) acquireTimes() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.acquires...)
}

// waitGate blocks while calls of this kind are held. It reports whether the
// call was held.
func (f *faultyStore) waitGate(renewal bool) bool {
	f.mu.Lock()
	gate, all := f.gate, f.pauseAll
	f.mu.Unlock()
	if gate == nil || (!renewal && !all) {
		return false
	}
	if renewal {
		select {
		case f.entered <- struct{}{}:
		default:
		}
	}
	<-gate
	return true
}

func (f *faultyStore) Acquire(ctx context.Context, name, holder string) (Grant, error) {
	f.mu.Lock()
	f.acquires = append(f.acquires, time.Now())
	f.mu.Unlock()
	f.waitGate(false)
	return f.inner.Acquire(ctx, name, holder)
}

func (f *faultyStore) Renew(ctx context.Context, c fence.Custody) (err error) {
	held := f.waitGate(true)
	if held {
		defer func() {
			select {
			case f.heldRenewals <- err:
			default:
			}
		}()
	}
	f.mu.Lock()
	fail, failAfter := f.fail, f.failAfter
	f.mu.Unlock()
	if fail != nil {
		return fail
	}
	if held && failAfter != nil {
		return failAfter
	}
	if held {
		// A held call models a statement already handed to the driver,
		// which ignores contexts (go-libsql): cancelling it now does nothing.
		ctx = context.WithoutCancel(ctx)
	}
	err = f.inner.Renew(ctx, c)
	if err == nil {
		f.mu.Lock()
		f.lastRenewOK = time.Now()
		f.mu.Unlock()
	}
	return err
}

func (f *faultyStore) Release(ctx context.Context, c fence.Custody) error {
	f.waitGate(false)
	f.mu.Lock()
	lag := f.releaseLag
	f.mu.Unlock()
	if lag > 0 {
		// A slow database round trip, not a wait for a condition.
		t := time.NewTimer(lag)
		<-t.C
	}
	return f.inner.Release(ctx, c)
}
