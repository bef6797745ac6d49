package lease

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

// lostAnswerStore commits the first acquire and its nonce in the database
// but reports an error, as a remote database does when the connection
// drops after the nonce's commit.
type lostAnswerStore struct {
	StoreAPI
	n atomic.Int32
}

func (s *lostAnswerStore) Acquire(ctx context.Context, name, holder string) (Grant, error) {
	g, err := s.StoreAPI.Acquire(ctx, name, holder)
	if s.n.Add(1) == 1 && err == nil && g.Granted {
		return Grant{}, errors.New("connection reset by peer (answer lost after commit)")
	}
	return g, err
}

func TestShutdownAfterALostAcquireAnswerReleasesTheGrant(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	timing := config.Timing{TTL: 20 * time.Second, RenewInterval: 100 * time.Millisecond, RenewDeadline: time.Second, RetryInterval: 200 * time.Millisecond}
	store := &lostAnswerStore{StoreAPI: NewStore(db, timing.TTL)}
	p := &probe{}
	r := h.start(Options{Name: "cleanup", Instance: "instance-a", Timing: timing, Store: store, Worker: p.props})
	// Second attempt finds its own grant: contended by itself.
	h.events.wait(t, 0, "lease.contended", is(LeaseContended, "instance-a"))
	h.stopAndWait(r)
	row := readRow(t, db, "cleanup")
	if row.State() == fence.StateHeld {
		t.Fatalf("instance-a stopped leaving its own grant held for %d ms more (row %+v): a successor waits out the TTL", row.ExpiresAt-row.Now, row)
	}
}

func TestALostAcquireAnswerDoesNotIdleTheLeaseForATTL(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	timing := config.Timing{TTL: 20 * time.Second, RenewInterval: 100 * time.Millisecond, RenewDeadline: time.Second, RetryInterval: 200 * time.Millisecond}
	store := &lostAnswerStore{StoreAPI: NewStore(db, timing.TTL)}
	p := &probe{}
	h.start(Options{Name: "cleanup", Instance: "instance-a", Timing: timing, Store: store, Worker: p.props})
	// Well inside the 20 s TTL the unanswered grant would otherwise hold.
	testsupport.Eventually(t, "a worker running, not the lease idle under instance-a's own unanswered grant",
		func() bool { return p.started.Load() > 0 })
}

func TestShutdownAfterABlackoutLossReleasesTheUnusedGrant(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	timing := config.Timing{TTL: 20 * time.Second, RenewInterval: 100 * time.Millisecond, RenewDeadline: time.Second, RetryInterval: 200 * time.Millisecond}
	store := newFaultyStore(NewStore(db, timing.TTL))
	p := &probe{}
	r := h.start(Options{Name: "cleanup", Instance: "instance-a", Timing: timing, Store: store, Worker: p.props})
	h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))
	store.failRenewals(errors.New("connection refused"))
	h.events.wait(t, 0, "lease.lost", is(LeaseLost, "instance-a"))
	h.events.wait(t, 0, "worker.stopped", is(WorkerStopped, "instance-a"))
	store.failRenewals(nil) // the database is back
	h.events.wait(t, 0, "lease.contended", is(LeaseContended, "instance-a"))
	h.stopAndWait(r)
	row := readRow(t, db, "cleanup")
	if row.State() == fence.StateHeld {
		t.Fatalf("stopped leaving its own unused grant held for %d ms more (row %+v)", row.ExpiresAt-row.Now, row)
	}
}

// slowAnswerRelease commits every release at once but answers it late (a
// slow network back from a remote database).
type slowAnswerRelease struct {
	StoreAPI
	lag time.Duration
}

func (s *slowAnswerRelease) Release(ctx context.Context, c fence.Custody) error {
	err := s.StoreAPI.Release(ctx, c)
	<-time.After(s.lag) // the answer's way back, not a wait for a condition
	return err
}

func TestAHandBackAnsweredAfterANewGrantDoesNotClearHeld(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	metrics := newTestMetrics(t)
	timing := config.Timing{TTL: 20 * time.Second, RenewInterval: 100 * time.Millisecond, RenewDeadline: time.Second, RetryInterval: 200 * time.Millisecond}
	store := &slowAnswerRelease{StoreAPI: &lostAnswerStore{StoreAPI: NewStore(db, timing.TTL)}, lag: 800 * time.Millisecond}
	p := &probe{}
	h.start(Options{Name: "cleanup", Instance: "instance-a", Timing: timing, Store: store, Worker: p.props, Metrics: metrics})
	checkHeldAfterHandBack(t, h, metrics)
}

// The same through the pre-existing hand-back of an abandoned acquire.
func TestALateAcquireHandBackAnsweredAfterANewGrantDoesNotClearHeld(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	metrics := newTestMetrics(t)
	inner := newLateFirstAcquire(t, NewStore(db, zombieTiming.TTL))
	store := &slowAnswerRelease{StoreAPI: inner, lag: 800 * time.Millisecond}
	p := &probe{}
	h.start(Options{Name: "cleanup", Instance: "instance-a", Timing: zombieTiming, Store: store, Worker: p.props, Metrics: metrics})
	<-inner.retried
	close(inner.land)
	checkHeldAfterHandBack(t, h, metrics)
}

func TestALeaseActorStoppedOutrightReportsAPlainWorkerStop(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	store := NewStore(db, fastTiming.TTL)
	p := &probe{}
	r := h.start(Options{Name: "cleanup", Instance: "instance-a", Timing: fastTiming, Store: store, Worker: p.props})
	h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))
	h.sys.Root.Stop(r.pid)
	r.wait(t)
	h.events.wait(t, 0, "worker.stopped", is(WorkerStopped, "instance-a"))
	all, _ := h.events.snapshot()
	t.Log(formatEvents(all))
	for _, e := range all {
		if e.Kind == WorkerStopped && e.Err != nil {
			t.Fatalf("a worker stopped by its LeaseActor's own stop reported %v", e.Err)
		}
	}
	if n := h.events.count(is(WorkerStopped, "instance-a")); n != 1 {
		t.Fatalf("worker.stopped published %d times", n)
	}
}

// newTestMetrics registers the lease metrics on a registry of their own.
func newTestMetrics(t *testing.T) *Metrics {
	t.Helper()
	metrics, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return metrics
}

// checkHeldAfterHandBack waits for the grant of fence 2 and the hand-back
// of fence 1 (in either order) on lease cleanup, and checks the gauges
// still show fence 2 held.
func checkHeldAfterHandBack(t *testing.T, h *harness, metrics *Metrics) {
	t.Helper()
	h.events.wait(t, 0, "lease.acquired fence 2", func(e Event) bool {
		return e.Kind == LeaseAcquired && e.Fence == 2
	})
	h.events.wait(t, 0, "lease.released fence 1", func(e Event) bool {
		return e.Kind == LeaseReleased && e.Fence == 1
	})
	waitObserved(t, metrics, "cleanup", LeaseReleased)
	all, _ := h.events.snapshot()
	if got := testutil.ToFloat64(metrics.Held.WithLabelValues("cleanup")); got != 1 {
		t.Fatalf("appview_lease_held = %v while holding fence 2:\n%s", got, formatEvents(all))
	}
	if got := testutil.ToFloat64(metrics.Fence.WithLabelValues("cleanup")); got != 2 {
		t.Fatalf("appview_lease_fence = %v while holding fence 2:\n%s", got, formatEvents(all))
	}
}

// waitObserved waits until metrics has counted a transition of kind on
// lease: the event has been through Metrics.observe, so what it did (or
// did not do) to the gauges shows.
func waitObserved(t *testing.T, metrics *Metrics, lease string, kind EventKind) {
	t.Helper()
	testsupport.Eventually(t, string(kind)+" observed by the metrics", func() bool {
		ch := make(chan prometheus.Metric, 64)
		metrics.Transitions.Collect(ch)
		close(ch)
		for m := range ch {
			var d dto.Metric
			if err := m.Write(&d); err != nil {
				t.Fatal(err)
			}
			labels := map[string]string{}
			for _, l := range d.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["lease"] == lease && labels["event"] == string(kind) && d.GetCounter().GetValue() > 0 {
				return true
			}
		}
		return false
	})
}
