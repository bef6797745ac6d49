package lease

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/testsupport"
)

// slowRetry makes a contender's own retries slow (8-12 s, and the grant it
// waits for has 30 s left), so an acquire within milliseconds of a release
// can only come from the nudge.
var slowRetry = config.Timing{TTL: 30 * time.Second, RenewInterval: time.Second,
	RenewDeadline: 10 * time.Second, RetryInterval: 10 * time.Second}

// nudgeEndpoint is an instance's loopback admin mux serving POST
// /lease/nudge?lease=NAME by sending Nudge to its LeaseActor, as
// system.NudgeHandler does.
type nudgeEndpoint struct {
	srv *httptest.Server
	pid atomic.Pointer[actor.PID]
	got atomic.Int32
}

func newNudgeEndpoint(t *testing.T, sys *actor.ActorSystem, lease string) *nudgeEndpoint {
	t.Helper()
	e := &nudgeEndpoint{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /lease/nudge", func(w http.ResponseWriter, r *http.Request) {
		pid := e.pid.Load()
		if r.URL.Query().Get("lease") != lease || pid == nil {
			http.Error(w, "no such leased worker", http.StatusNotFound)
			return
		}
		e.got.Add(1)
		sys.Root.Send(pid, &Nudge{})
		w.WriteHeader(http.StatusNoContent)
	})
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *nudgeEndpoint) url() string { return e.srv.URL + "/lease/nudge" }

// newContenders returns an instance's contenders, nudged by store's
// releases as system.New wires them; it is waited for once h's
// LeaseActors have stopped (a release at the test's end still nudges)
// and before the database closes (opened before h).
func (h *harness) newContenders(store *Store, instance, url string) *Contenders {
	c := &Contenders{DB: store.db, Instance: instance, URL: url, TTL: store.ttl, Nonce: store.Nonce()}
	store.Released = c.Nudge
	h.mu.Lock()
	h.afterStop = append(h.afterStop, c.Wait)
	h.mu.Unlock()
	return c
}

func TestAReleaseNudgesTheContenderIntoAcquiringAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	dbA, dbB := testsupport.OpenDBAt(t, path), testsupport.OpenDBAt(t, path)
	h := newHarness(t)
	const name = "jetstream-consumer"
	epA, epB := newNudgeEndpoint(t, h.sys, name), newNudgeEndpoint(t, h.sys, name)
	pa, pb := &probe{}, &probe{}
	sa, sb := NewStore(dbA, slowRetry.TTL), NewStore(dbB, slowRetry.TTL)
	ra := h.start(Options{Name: name, Instance: "instance-a", Timing: slowRetry, Store: sa,
		Worker: pa.props, Contenders: h.newContenders(sa, "instance-a", epA.url())})
	epA.pid.Store(ra.pid)
	h.events.wait(t, 0, "worker.started by a", is(WorkerStarted, "instance-a"))
	rb := h.start(Options{Name: name, Instance: "instance-b", Timing: slowRetry, Store: sb,
		Worker: pb.props, Contenders: h.newContenders(sb, "instance-b", epB.url())})
	epB.pid.Store(rb.pid)
	h.events.wait(t, 0, "lease.contended by b", is(LeaseContended, "instance-b"))
	testsupport.Eventually(t, "b recorded as a contender", func() bool {
		var n int
		err := dbA.QueryRow(`SELECT count(*) FROM lease_contenders WHERE name = ?1 AND instance = 'instance-b' AND nudge_url = ?2`,
			name, epB.url()).Scan(&n)
		return err == nil && n == 1
	})

	h.stop(ra)
	released, _ := h.events.wait(t, 0, "lease.released by a", is(LeaseReleased, "instance-a"))
	// From the start of the stream, not after a's release: each actor
	// publishes on its own, so their order is the events' At, not the
	// stream's. b acquires nothing before this.
	acquired, _ := h.events.wait(t, 0, "lease.acquired by b", is(LeaseAcquired, "instance-b"))
	handover := acquired.At.Sub(released.At)
	t.Logf("handover took %s (b's own retry was 8-12 s away)", handover)
	// Anything well before b's own retry (8 s at the earliest) is the
	// nudge; 5 s leaves a loaded -race host all the room it needs.
	if handover > 5*time.Second {
		t.Fatalf("b acquired %s after the release: the nudge did not work", handover)
	}
	if acquired.Fence != released.Fence+1 {
		t.Fatalf("b's fence %d after a's %d", acquired.Fence, released.Fence)
	}
	if epB.got.Load() != 1 || epA.got.Load() != 0 {
		t.Fatalf("nudges received: a %d, b %d; want only b, once", epA.got.Load(), epB.got.Load())
	}
	testsupport.Eventually(t, "b's worker running", func() bool { return pb.started.Load() == 1 })
}

// Nudges are advisory and cheap to send, so a misbehaving peer may send
// many: however many arrive, the contender makes at most one acquire
// attempt per NudgeSpacing.
func TestAFloodOfNudgesCausesAtMostOneAcquirePerSpacing(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	const name = "cleanup"
	mustAcquire(t, NewStore(db, time.Minute), name, "instance-a")
	store := newFaultyStore(NewStore(db, slowRetry.TTL))
	r := h.start(Options{Name: name, Instance: "instance-b", Timing: slowRetry, Store: store, Worker: (&probe{}).props})
	h.events.wait(t, 0, "lease.contended", is(LeaseContended, "instance-b"))

	const flood = 300 * time.Millisecond
	tick := time.NewTicker(200 * time.Microsecond)
	start := time.Now()
	sent := 0
	for time.Since(start) < flood {
		<-tick.C
		for range 5 {
			h.sys.Root.Send(r.pid, &Nudge{})
			sent++
		}
	}
	tick.Stop()
	end := time.Now()
	// Let the nudges already queued be processed: a status request is
	// answered after every message sent before it.
	if _, err := h.sys.Root.RequestFuture(r.pid, &StatusRequest{}, waitFor).Result(); err != nil {
		t.Fatal(err)
	}
	drained := time.Now()
	var during int
	for _, at := range store.acquireTimes() {
		if !at.Before(start) {
			during++
		}
	}
	// Attempts may trail the flood while the mailbox drains.
	window := drained.Sub(start)
	limit := int(window/NudgeSpacing) + 2
	t.Logf("%d nudges in %s (drained after %s): %d acquire attempts, limit %d", sent, end.Sub(start), window, during, limit)
	if during > limit {
		t.Fatalf("%d acquire attempts in %s for %d nudges; want at most one per %s (%d)", during, window, sent, NudgeSpacing, limit)
	}
	if during == 0 {
		t.Fatal("no acquire attempt at all: nudges were ignored")
	}
}
