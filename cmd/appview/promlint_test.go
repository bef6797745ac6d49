package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// Every metric a fully wired instance exports (every worker registered:
// billing, labeler and backfill enabled, their peers unreachable) passes
// Prometheus' own linter: names with base units and _total for counters,
// help texts, no reserved suffixes on the wrong type.
func TestMetricsOfAFullyWiredInstancePassPromlint(t *testing.T) {
	const nowhere = "127.0.0.1:1" // connection refused at once
	dir := t.TempDir()
	p := startServe(t, dir, childEnv(
		"APPVIEW_HEALTH_CHECK_INTERVAL=200ms",
		"APPVIEW_HEALTH_TIMEOUT=100ms",
		"APPVIEW_ADMIN_ADDR=127.0.0.1:0",
		"APPVIEW_JETSTREAM_URLS=ws://"+nowhere+"/subscribe",
		"APPVIEW_BACKFILL_ENABLED=true",
		"APPVIEW_BACKFILL_RELAY_ENDPOINTS=http://"+nowhere,
		"APPVIEW_IDENTITY_PLC_URL=http://"+nowhere,
		"APPVIEW_LABELER_URL=http://"+nowhere,
		"APPVIEW_BILLING_ENABLED=true",
		"APPVIEW_BILLING_STRIPE_SECRET_KEY=sk_test_promlint",
		"APPVIEW_BILLING_STRIPE_API_URL=http://"+nowhere,
	))
	base := p.started()
	// A hold to check, so the health checker's series exist too.
	db, err := database.Open(context.Background(), database.Options{URL: "file:" + filepath.Join(dir, "data", "appview.db"), BusyTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`INSERT INTO hold_captains (hold_did, owner_did, public, allow_all_crew, enable_bluesky_posts, deployed_at)
VALUES ('did:web:hold.invalid', 'did:plc:captain', 1, 0, 0, 0)`); err != nil {
		t.Fatal(err)
	}
	// Series of labelled families appear once a worker has used them: wait
	// for one round of each worker (all fail fast against nowhere).
	var body, missing string
	defer func() {
		if t.Failed() {
			t.Logf("last missing family: %s", missing)
		}
	}()
	p.waitFor(startTimeout, "every worker's metrics on /metrics", func() bool {
		var code int
		missing = ""
		code, body = get(base + "/metrics")
		if code != 200 {
			return false
		}
		for _, family := range []string{"appview_lease_held", "appview_jetstream_frames_total", "appview_backfill_errors_total",
			"appview_labeler_connections_total", "appview_billing_rounds_total", "appview_hold_checks_total", "appview_hold_healthy",
			"appview_webhook_deliveries_total", "appview_consumer_batches_total"} {
			if !strings.Contains(body, "# TYPE "+family+" ") {
				missing = family
				return false
			}
		}
		return true
	})
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatalf("lint: %v", err)
	}
	for _, pr := range problems {
		t.Errorf("%s: %s", pr.Metric, pr.Text)
	}
}
