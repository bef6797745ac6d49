package health

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/outbound"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/identity"
)

func TestMain(m *testing.M) { testsupport.VerifyTestMain(m) }

// fakeHold answers GET /xrpc/_health with its current status code; with
// hang set it answers nothing until the client gives up. Everything else
// (e.g. /.well-known/did.json) is 404, so did:web resolution falls back to
// the host.
type fakeHold struct {
	*httptest.Server
	did    string
	status atomic.Int32
	hang   atomic.Bool
	hits   atomic.Int32
	// retryAfter, when set, is sent as Retry-After.
	retryAfter atomic.Pointer[string]
	// hung receives a value each time a check starts hanging.
	hung chan struct{}
}

func newFakeHold(t *testing.T) *fakeHold {
	t.Helper()
	h := &fakeHold{hung: make(chan struct{}, 16)}
	h.status.Store(http.StatusOK)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+HealthPath, func(w http.ResponseWriter, r *http.Request) {
		h.hits.Add(1)
		if h.hang.Load() {
			h.hung <- struct{}{}
			<-r.Context().Done()
			return
		}
		if ra := h.retryAfter.Load(); ra != nil {
			w.Header().Set("Retry-After", *ra)
		}
		w.WriteHeader(int(h.status.Load()))
		_, _ = w.Write([]byte(`{"version":"test"}`))
	})
	h.Server = httptest.NewServer(mux)
	t.Cleanup(h.Close)
	u, _ := url.Parse(h.URL)
	h.did = "did:web:" + strings.ReplaceAll(u.Host, ":", "%3A")
	return h
}

func addCaptain(t *testing.T, db *database.DB, did string) {
	t.Helper()
	if _, err := db.Exec(`INSERT INTO hold_captains (hold_did, owner_did, public, allow_all_crew, enable_bluesky_posts, deployed_at)
	  VALUES (?1, 'did:plc:owner', 1, 0, 0, 0)`, did); err != nil {
		t.Fatal(err)
	}
}

func addManifest(t *testing.T, db *database.DB, digest, holdDID string) {
	t.Helper()
	if _, err := db.Exec(`INSERT INTO manifests (did, repository, digest, rkey, hold_did, media_type, schema_version, created_at, indexed_at)
	  VALUES ('did:plc:alice', 'app', ?1, ?1, ?2, 'application/vnd.oci.image.manifest.v1+json', 2, 0, 0)`, digest, holdDID); err != nil {
		t.Fatal(err)
	}
}

// loopback is a client whose guard lets the fake holds (on 127.0.0.1)
// through, as network.allow_private does.
var loopback = outbound.Guard{AllowPrivate: true}.Client(0)

// resolver resolves loopback did:web holds over plain HTTP.
func resolver() *identity.Resolver { return &identity.Resolver{WebScheme: "http", HTTP: loopback} }

func newChecker(t *testing.T, db *database.DB, cache *Cache, timeout time.Duration) *Checker {
	t.Helper()
	c, err := NewChecker(Options{DB: db, Endpoints: resolver(), HTTP: loopback, Timeout: timeout, Concurrency: 2,
		Cache: cache, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustRound(t *testing.T, c *Checker) {
	t.Helper()
	if err := c.Round(context.Background()); err != nil {
		t.Fatalf("round: %v", err)
	}
}

func mustGet(t *testing.T, cache *Cache, did string) Status {
	t.Helper()
	s, ok := cache.Get(did)
	if !ok {
		t.Fatalf("%s not in cache", did)
	}
	return s
}

func TestHoldThatGoesDownIsMarkedUnhealthyByTheNextRound(t *testing.T) {
	db := testsupport.OpenDB(t)
	hold := newFakeHold(t)
	addCaptain(t, db, hold.did)
	cache := NewCache("inst-a")
	c := newChecker(t, db, cache, 2*time.Second)

	mustRound(t, c)
	s := mustGet(t, cache, hold.did)
	if !s.Healthy || s.ConsecutiveFailures != 0 || s.LastError != "" || s.Endpoint != hold.URL ||
		s.LastCheckedMS == 0 || s.LastHealthyMS != s.LastCheckedMS {
		t.Fatalf("healthy hold: %+v", s)
	}

	hold.status.Store(http.StatusServiceUnavailable)
	mustRound(t, c)
	s = mustGet(t, cache, hold.did)
	if s.Healthy || s.ConsecutiveFailures != 1 || !strings.Contains(s.LastError, "503") {
		t.Fatalf("hold answering 503, one round later: %+v", s)
	}
	lastHealthy := s.LastHealthyMS

	hold.status.Store(http.StatusInternalServerError)
	mustRound(t, c)
	if s = mustGet(t, cache, hold.did); s.ConsecutiveFailures != 2 || s.LastHealthyMS != lastHealthy {
		t.Fatalf("second failure: %+v (last healthy was %d)", s, lastHealthy)
	}

	hold.status.Store(http.StatusNoContent) // any 2xx is healthy
	mustRound(t, c)
	if s = mustGet(t, cache, hold.did); !s.Healthy || s.ConsecutiveFailures != 0 || s.LastError != "" {
		t.Fatalf("recovered hold: %+v", s)
	}
}

// A hold that rate-limits its health endpoint answered: it used to be
// marked unhealthy, and checked again next round into its limit. A 429
// is no verdict: the hold keeps its status and is left alone as long as
// its Retry-After asks.
func TestARateLimitedHoldKeepsItsStatusAndIsLeftAloneAsAsked(t *testing.T) {
	db := testsupport.OpenDB(t)
	hold := newFakeHold(t)
	addCaptain(t, db, hold.did)
	cache := NewCache("inst-a")
	c := newChecker(t, db, cache, 2*time.Second)
	checks, err := NewChecksCounter(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c.o.Checks = checks
	mustRound(t, c)
	before := mustGet(t, cache, hold.did)

	hold.status.Store(http.StatusTooManyRequests)
	wait := "3600"
	hold.retryAfter.Store(&wait)
	mustRound(t, c)
	if s := mustGet(t, cache, hold.did); s != before {
		t.Fatalf("after a 429: %+v, want the status before it, %+v", s, before)
	}
	mustRound(t, c)
	if n := hold.hits.Load(); n != 2 {
		t.Fatalf("%d checks, want 2: the round after the 429 must not ask again within its Retry-After", n)
	}
	if v := testutil.ToFloat64(checks.WithLabelValues("rate_limited")); v != 1 {
		t.Fatalf("checks_total{rate_limited} = %v, want 1", v)
	}

	// Once the wait is over the hold is checked again.
	c.mu.Lock()
	c.limitedUntil[hold.did] = time.Now().Add(-time.Millisecond)
	c.mu.Unlock()
	hold.status.Store(http.StatusServiceUnavailable)
	hold.retryAfter.Store(nil)
	mustRound(t, c)
	if s := mustGet(t, cache, hold.did); s.Healthy || s.ConsecutiveFailures != 1 || hold.hits.Load() != 3 {
		t.Fatalf("after the wait, a 503: %+v after %d checks, want unhealthy after 3", s, hold.hits.Load())
	}
}

func TestUnreachableAndSilentHoldsAreUnhealthyWithinTheTimeout(t *testing.T) {
	db := testsupport.OpenDB(t)
	gone := newFakeHold(t)
	gone.Close() // connection refused from now on
	silent := newFakeHold(t)
	silent.hang.Store(true)
	fine := newFakeHold(t)
	for _, h := range []*fakeHold{gone, silent, fine} {
		addCaptain(t, db, h.did)
	}
	cache := NewCache("inst-a")
	c := newChecker(t, db, cache, 300*time.Millisecond)

	// The guard only keeps a broken round from hanging the test; the
	// round itself must end on its own, bounded by the check timeout.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Round(ctx); err != nil {
		t.Fatalf("round: %v", err)
	}
	if s := mustGet(t, cache, gone.did); s.Healthy || s.ConsecutiveFailures != 1 || s.LastError == "" {
		t.Errorf("unreachable hold: %+v", s)
	}
	if s := mustGet(t, cache, silent.did); s.Healthy || !strings.Contains(s.LastError, "no answer within 300ms") {
		t.Errorf("silent hold: %+v", s)
	}
	if s := mustGet(t, cache, fine.did); !s.Healthy {
		t.Errorf("a slow neighbour made a healthy hold unhealthy: %+v", s)
	}
}

func TestTwoCheckersKeepTheirOwnCaches(t *testing.T) {
	db := testsupport.OpenDB(t) // one shared database, as two instances would have
	hold := newFakeHold(t)
	addCaptain(t, db, hold.did)
	cacheA, cacheB := NewCache("inst-a"), NewCache("inst-b")
	a := newChecker(t, db, cacheA, 2*time.Second)
	b := newChecker(t, db, cacheB, 2*time.Second)

	mustRound(t, a)
	if _, ok := cacheB.Get(hold.did); ok {
		t.Fatal("instance B's cache filled by instance A's round")
	}
	hold.status.Store(http.StatusBadGateway)
	mustRound(t, b)
	if s := mustGet(t, cacheB, hold.did); s.Healthy {
		t.Errorf("B checked a failing hold and kept it healthy: %+v", s)
	}
	if s := mustGet(t, cacheA, hold.did); !s.Healthy {
		t.Errorf("B's round changed A's cache: %+v", s)
	}
	mustRound(t, a)
	if s := mustGet(t, cacheA, hold.did); s.Healthy || s.ConsecutiveFailures != 1 {
		t.Errorf("A after its own round: %+v", s)
	}
	if got := hold.hits.Load(); got != 3 {
		t.Errorf("hold was checked %d times for three rounds", got)
	}
}

func TestKnownHoldsAreReReadEachRound(t *testing.T) {
	db := testsupport.OpenDB(t)
	captain, shared, manifestOnly := newFakeHold(t), newFakeHold(t), newFakeHold(t)
	addCaptain(t, db, captain.did)
	addCaptain(t, db, shared.did)
	addManifest(t, db, "sha256:1", shared.did)
	addManifest(t, db, "sha256:2", manifestOnly.did)
	addManifest(t, db, "sha256:3", "") // a manifest with no hold
	cache := NewCache("inst-a")
	c := newChecker(t, db, cache, 2*time.Second)

	mustRound(t, c)
	holds, round := cache.Snapshot()
	if len(holds) != 3 || round == 0 {
		t.Fatalf("after round 1: %d holds (round %d), want 3: %+v", len(holds), round, holds)
	}
	if shared.hits.Load() != 1 {
		t.Errorf("a hold known from both tables was checked %d times in one round", shared.hits.Load())
	}

	if _, err := db.Exec(`DELETE FROM manifests WHERE hold_did = ?1`, manifestOnly.did); err != nil {
		t.Fatal(err)
	}
	mustRound(t, c)
	if _, ok := cache.Get(manifestOnly.did); ok {
		t.Error("a hold no longer known is still cached")
	}
	if holds, _ := cache.Snapshot(); len(holds) != 2 {
		t.Errorf("after round 2: %+v", holds)
	}
}

func TestStoppingMidRoundKeepsThePreviousResult(t *testing.T) {
	db := testsupport.OpenDB(t)
	hold := newFakeHold(t)
	addCaptain(t, db, hold.did)
	cache := NewCache("inst-a")
	c := newChecker(t, db, cache, time.Minute)
	mustRound(t, c)

	hold.hang.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, noCustody) }()
	select {
	case <-hold.hung:
	case <-time.After(10 * time.Second):
		t.Fatal("second check never reached the hold")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("round cut short returned %v, want context.Canceled", err)
	}
	if s := mustGet(t, cache, hold.did); !s.Healthy || s.ConsecutiveFailures != 0 {
		t.Errorf("a check cut short by shutdown was counted as a failure: %+v", s)
	}
}

func TestDebugHoldsAndMetricsServeTheCache(t *testing.T) {
	db := testsupport.OpenDB(t)
	up, down := newFakeHold(t), newFakeHold(t)
	down.status.Store(http.StatusServiceUnavailable)
	addCaptain(t, db, up.did)
	addCaptain(t, db, down.did)

	cfg := config.Default()
	cfg.Health.CheckInterval, cfg.Health.Timeout = 5*time.Second, 2*time.Second
	cfg.Network.AllowPrivate = true // the fake holds are on loopback
	reg, mux := prometheus.NewRegistry(), http.NewServeMux()
	w, err := worker(workers.Deps{Config: cfg, DB: db, Log: zerolog.Nop(), Metrics: reg, Admin: mux, Instance: "inst-a"}, resolver())
	if err != nil {
		t.Fatalf("worker: %v", err)
	}
	if w.Name != "health" || w.Leased || w.Job == nil || w.Interval != 5*time.Second {
		t.Fatalf("worker %+v", w)
	}
	if err := w.Job(context.Background(), noCustody); err != nil {
		t.Fatalf("job: %v", err)
	}

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, DebugPath, nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %d %q", DebugPath, rec.Code, rec.Header().Get("Content-Type"))
	}
	var doc snapshotJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatalf("decode %s: %v\n%s", DebugPath, err, rec.Body.String())
	}
	if doc.Instance != "inst-a" || doc.RoundMS == 0 || len(doc.Holds) != 2 {
		t.Fatalf("%s: %+v", DebugPath, doc)
	}
	byDID := map[string]Status{}
	for _, s := range doc.Holds {
		byDID[s.HoldDID] = s
	}
	if !byDID[up.did].Healthy || byDID[down.did].Healthy || byDID[down.did].ConsecutiveFailures != 1 {
		t.Errorf("%s holds: %+v", DebugPath, doc.Holds)
	}

	want := `
# HELP appview_hold_healthy 1 when the hold's last GET /xrpc/_health returned 2xx, else 0 (this instance's view).
# TYPE appview_hold_healthy gauge
appview_hold_healthy{hold="` + down.did + `"} 0
appview_hold_healthy{hold="` + up.did + `"} 1
# HELP appview_hold_consecutive_failures Failed health checks of the hold since its last healthy one.
# TYPE appview_hold_consecutive_failures gauge
appview_hold_consecutive_failures{hold="` + down.did + `"} 1
appview_hold_consecutive_failures{hold="` + up.did + `"} 0
# HELP appview_hold_checks_total Hold health checks run by this instance, by outcome (healthy, unhealthy, rate_limited: a 429, no verdict).
# TYPE appview_hold_checks_total counter
appview_hold_checks_total{outcome="healthy"} 1
appview_hold_checks_total{outcome="unhealthy"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"appview_hold_healthy", "appview_hold_consecutive_failures", "appview_hold_checks_total"); err != nil {
		t.Error(err)
	}
}

func TestConfigRefusesATimeoutThatDoesNotFitTheInterval(t *testing.T) {
	cfg := config.Default()
	cfg.Health.CheckInterval, cfg.Health.Timeout = 5*time.Second, 5*time.Second
	err := cfg.Validate()
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Key != "health.timeout" {
		t.Errorf("err %v, want *config.Error for health.timeout", err)
	}
}

var noCustody = fence.Custody{Lease: WorkerName}
