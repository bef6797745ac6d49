package backfill

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the backfill's Prometheus collectors. Build them once per
// process (NewMetrics) and share them across grants of custody.
type Metrics struct {
	// Runs counts Run calls by outcome: completed, skipped (a recent run
	// completed), incomplete (a collection could not be listed from any
	// relay), interrupted (custody ended or was superseded) and failed (a
	// database error).
	Runs *prometheus.CounterVec
	// RunDuration observes the seconds each Run call took, by outcome.
	RunDuration *prometheus.HistogramVec
	// Repos counts (collection, DID) pairs finished, by outcome: done,
	// failed (skipped: unresolvable DID or broken PDS) or inactive (the PDS
	// does not serve a deactivated, taken-down or suspended account).
	Repos *prometheus.CounterVec
	// Records counts records by collection and outcome: applied or
	// skipped (by the applier), invalid (unusable uri or value).
	Records *prometheus.CounterVec
	// Errors counts failures by class: rate_limited, server, client,
	// network, decode, resolve, protocol, invalid_record, relay, db_error
	// (a record the database refused even on its own). Retried
	// attempts count too, so a PDS that rate-limits shows here.
	Errors *prometheus.CounterVec
	// Deferred counts requests a peer refused with 429 and a stated reset
	// (RateLimit-Reset or Retry-After), by host: each was made again after
	// the reset, without using up a retry.
	Deferred *prometheus.CounterVec
	// RateLimitWait sums the seconds requests waited, by host, for a
	// peer's rate-limit window (after a 429, when RateLimit-Remaining was
	// 0, or paced while it was low).
	RateLimitWait *prometheus.CounterVec
	// Requests counts the requests that got an answer, by host and
	// status code ("200", "429", ...), and those that got none
	// (code "error"): the rate a peer sees, and its 429s.
	Requests *prometheus.CounterVec
}

// Run outcomes, the `outcome` label of the run metrics.
const (
	runCompleted   = "completed"
	runSkipped     = "skipped"
	runIncomplete  = "incomplete"
	runInterrupted = "interrupted"
	runFailed      = "failed"
)

// NewMetrics builds the collectors and registers them on reg (nil: not
// registered). It returns an error when one is already registered.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_backfill_runs_total",
			Help: "Backfill job runs, by outcome (completed, skipped, incomplete, interrupted, failed).",
		}, []string{"outcome"}),
		RunDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "appview_backfill_run_duration_seconds",
			Help:    "Wall time of a backfill job run, by outcome.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9), // 1 s .. ~18 h
		}, []string{"outcome"}),
		Repos: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_backfill_repos_total",
			Help: "Repositories backfilled per collection, by outcome (done, failed, inactive).",
		}, []string{"collection", "outcome"}),
		Records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_backfill_records_total",
			Help: "Records backfilled, by collection and outcome (applied, skipped, invalid).",
		}, []string{"collection", "outcome"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_backfill_errors_total",
			Help: "Backfill errors by class, retried attempts included.",
		}, []string{"class"}),
		Deferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_backfill_rate_limit_deferrals_total",
			Help: "Backfill requests deferred by a peer's 429 until its stated reset, by host.",
		}, []string{"host"}),
		RateLimitWait: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_backfill_rate_limit_wait_seconds_total",
			Help: "Seconds backfill requests waited for a peer's rate-limit window, by host.",
		}, []string{"host"}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_backfill_requests_total",
			Help: "Backfill requests by host and HTTP status code (\"error\": no answer), retries included.",
		}, []string{"host", "code"}),
	}
	for _, c := range errorClasses {
		m.Errors.WithLabelValues(c)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.Runs, m.RunDuration, m.Repos, m.Records, m.Errors, m.Deferred, m.RateLimitWait, m.Requests} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register backfill metrics: %w", err)
		}
	}
	return m, nil
}
