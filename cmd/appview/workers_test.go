package main

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"
	"github.com/atcr-io/appview/system"
)

// The consumer's and the backfill's processors count into one set of
// processor collectors, built once per process: registering both workers
// on one registry succeeds, and each collector is there once.
func TestTheConsumerAndTheBackfillShareTheProcessorCollectors(t *testing.T) {
	cfg := config.Default()
	cfg.Backfill.Enabled = true
	cfg.Backfill.RelayEndpoints = []string{"http://127.0.0.1:1"}
	reg := prometheus.NewRegistry()
	d := workers.Deps{Config: cfg, DB: testsupport.OpenDB(t).DB, Log: zerolog.Nop(), Metrics: reg, Admin: http.NewServeMux(), Instance: "me"}
	var r system.Registry
	if err := registerWorkers(&r, d); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, w := range r.Workers() {
		names[w.Name] = true
	}
	if !names["jetstream-consumer"] || !names["backfill"] {
		t.Fatalf("workers %v, want the consumer and the backfill", names)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		if f.GetName() == "appview_processor_batch_apply_seconds" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("appview_processor_batch_apply_seconds gathered %d times, want once", n)
	}
}
