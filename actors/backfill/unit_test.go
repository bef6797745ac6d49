package backfill

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/workers"
	"github.com/rs/zerolog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/system"
)

func TestRateLimitedRequestsWaitAsToldAndThenSucceed(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	pds := e.pds(3, "did:plc:a")
	relay.Add(colManifest, "did:plc:a")
	var limited atomic.Int32
	pds.Intercept(func(w http.ResponseWriter, r *http.Request, req testsupport.Request) bool {
		if limited.Add(1) <= 2 {
			w.Header().Set("Retry-After", "0")
			testsupport.XRPCError(w, http.StatusTooManyRequests, "RateLimitExceeded", "slow down")
			return true
		}
		return false
	})
	o := e.options(relay.URL())
	o.Collections = []string{colManifest}
	o.Retry.Initial = time.Hour // Retry-After, not the backoff, decides the wait
	if err := e.backfiller(o).Run(context.Background(), e.acquire("instance-a")); err != nil {
		t.Fatal(err)
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled`); got != 3 {
		t.Fatalf("%d records after rate limiting, want 3", got)
	}
	if got := testutil.ToFloat64(e.metrics.Errors.WithLabelValues(classRateLimited)); got != 2 {
		t.Errorf("errors{rate_limited} = %v, want 2", got)
	}
}

func TestAPeerAskingToWaitTooLongOrRefusingTheRepoIsSkippedWithoutRetries(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	pds := e.pds(1, "did:plc:slow")
	other := e.pds(1, "did:plc:known")
	e.plc.Register("did:plc:gone", other.URL()) // resolves, but the PDS does not host it
	relay.Add(colManifest, "did:plc:slow", "did:plc:gone", "did:plc:known")
	pds.Intercept(func(w http.ResponseWriter, r *http.Request, req testsupport.Request) bool {
		w.Header().Set("Retry-After", "3600")
		testsupport.XRPCError(w, http.StatusTooManyRequests, "RateLimitExceeded", "come back in an hour")
		return true
	})
	o := e.options(relay.URL())
	o.Collections = []string{colManifest}
	if err := e.backfiller(o).Run(context.Background(), e.acquire("instance-a")); err != nil {
		t.Fatal(err)
	}
	if n := pds.Count("did:plc:slow", colManifest); n != 1 {
		t.Errorf("asked the PDS that wants an hour %d times, want 1", n)
	}
	if n := other.Count("did:plc:gone", colManifest); n != 1 {
		t.Errorf("asked for a repo the PDS does not host %d times, want 1 (4xx is not retried)", n)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_repos WHERE state = 'failed'`); n != 2 {
		t.Errorf("%d repositories failed, want 2", n)
	}
	// Noted, so their next lifecycle event makes the consumer re-read them.
	if n := e.count(`SELECT COUNT(*) FROM repo_incomplete WHERE reason = 'backfill-failed'`); n != 2 {
		t.Errorf("%d failed repositories noted in repo_incomplete, want 2", n)
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled`); got != 1 {
		t.Errorf("%d records, want known's 1", got)
	}
	if got := testutil.ToFloat64(e.metrics.Errors.WithLabelValues(classClient)); got != 1 {
		t.Errorf("errors{client} = %v, want 1", got)
	}
}

func TestRecordURIsMustNameTheRepositoryAndCollectionListed(t *testing.T) {
	if rkey, err := rkeyOf("at://did:plc:a/io.atcr.tag/latest", "did:plc:a", "io.atcr.tag"); err != nil || rkey != "latest" {
		t.Fatalf("rkeyOf = %q, %v", rkey, err)
	}
	for _, uri := range []string{
		"at://did:plc:b/io.atcr.tag/latest",
		"at://did:plc:a/io.atcr.manifest/latest",
		"at://did:plc:a/io.atcr.tag/",
		"at://did:plc:a/io.atcr.tag",
		"https://did:plc:a/io.atcr.tag/latest",
		"at://did:plc:a/io.atcr.tag/a/b",
	} {
		if _, err := rkeyOf(uri, "did:plc:a", "io.atcr.tag"); err == nil {
			t.Errorf("rkeyOf(%q) accepted", uri)
		}
	}
}

func TestWorkerRegistersALeasedJobOnceOrPeriodic(t *testing.T) {
	d := workers.Deps{Config: config.Default(), DB: openDB(t), Metrics: prometheus.NewRegistry()}
	d.Config.Backfill.Enabled = false
	if _, err := Worker(d, fakeApplier); !errors.Is(err, workers.ErrDisabled) {
		t.Fatalf("disabled: %v, want ErrDisabled", err)
	}
	d.Config.Backfill.Enabled = true
	d.Config.Backfill.RelayEndpoints = nil
	var cerr *config.Error
	if err := d.Config.Validate(); !errors.As(err, &cerr) || cerr.Key != "backfill.relay_endpoints" {
		t.Fatalf("no relays: %v, want a config error on backfill.relay_endpoints", err)
	}
	d.Config.Backfill.RelayEndpoints = []string{"https://relay.example.com"}
	w, err := Worker(d, fakeApplier)
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != LeaseName || !w.Leased || w.Job == nil || w.Actor != nil || w.Interval != 0 {
		t.Fatalf("Worker = %+v, want a leased job named %s with interval 0", w, LeaseName)
	}
	if err := new(system.Registry).Register(w); err != nil {
		t.Fatalf("the registry refuses the worker: %v", err)
	}

	d.Metrics = prometheus.NewRegistry()
	d.Config.Backfill.Interval = time.Hour
	w, err = Worker(d, fakeApplier)
	if err != nil || w.Interval != time.Hour {
		t.Fatalf("periodic Worker = %+v, %v; want interval 1h", w, err)
	}
}

// A record a PDS lists under a 100 KB uri is skipped, and its log line
// carries the uri and the error cut with a marker.
func TestASkippedRecordsLogLineIsBounded(t *testing.T) {
	var logs bytes.Buffer
	r := &run{b: &Backfiller{o: Options{Now: time.Now}, skipLog: zerolog.New(&logs)}}
	uri := "at://did:plc:a/io.atcr.tag/" + strings.Repeat("k", 100_000) + "/x"
	events, invalid := r.events("io.atcr.tag", "did:plc:a", []recordRef{{URI: uri, Value: []byte(`{}`)}})
	if len(events) != 0 || invalid != 1 {
		t.Fatalf("%d events, %d invalid; want the record skipped", len(events), invalid)
	}
	line := strings.TrimSpace(logs.String())
	if len(line) > 4<<10 || strings.Count(line, "…[truncated ") != 2 {
		t.Fatalf("a %d-byte skip line, want at most 4 KiB with the uri and the error cut: %.300s", len(line), line)
	}
}
