package main

import (
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"
	"github.com/atcr-io/appview/system"
)

// The lease names the spec lists (docs/spec.md §4) are exactly the names
// of the registered leased workers, with every optional worker turned
// on; the hold health checker, the one unleased worker, holds none.
func TestTheSpecsLeaseNamesAreTheRegisteredLeasedWorkers(t *testing.T) {
	spec, err := os.ReadFile("../../docs/spec.md")
	if err != nil {
		t.Fatal(err)
	}
	para := regexp.MustCompile("(?s)\nLease names: (.*?)\n\n").FindSubmatch(spec)
	if para == nil {
		t.Fatal(`docs/spec.md has no "Lease names:" paragraph`)
	}
	var want []string
	for _, m := range regexp.MustCompile("`([a-z0-9-]+)`").FindAllSubmatch(para[1], -1) {
		want = append(want, string(m[1]))
	}
	if !strings.Contains(string(para[1]), "health checker is not leased") {
		t.Errorf("docs/spec.md §4 no longer says the health checker is not leased: %q", para[1])
	}

	cfg, err := config.Load(config.Sources{Workers: workerKeys(), Sets: []string{
		"labeler.url=wss://labeler.example", "billing.enabled=true", "billing.stripe_secret_key=sk_test_x"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Workers {
		cfg.Workers[i].Enabled = true // every worker with keys of its own, too
	}
	specs, err := buildWorkers(workers.Deps{Config: cfg, DB: testsupport.OpenDB(t), Log: zerolog.Nop(),
		Metrics: prometheus.NewRegistry(), Admin: http.NewServeMux(), Instance: "test"})
	if err != nil {
		t.Fatal(err)
	}
	var leased, unleased []string
	for _, s := range specs {
		if s.Leased {
			leased = append(leased, s.Name)
		} else {
			unleased = append(unleased, s.Name)
		}
	}
	if len(specs) != len(registered(nil)) {
		t.Errorf("%d of %d registered workers built with everything on", len(specs), len(registered(nil)))
	}
	slices.Sort(want)
	slices.Sort(leased)
	if !slices.Equal(leased, want) {
		t.Errorf("leased workers %v, docs/spec.md §4 lists %v", leased, want)
	}
	if !slices.Equal(unleased, []string{"health"}) {
		t.Errorf("unleased workers %v, want the hold health checker alone", unleased)
	}
}

// The consumer's and the backfill's processors count into one set of
// processor collectors, built once per process: registering both workers
// on one registry succeeds, and each collector is there once.
func TestTheConsumerAndTheBackfillShareTheProcessorCollectors(t *testing.T) {
	cfg := config.Default()
	cfg.Backfill.Enabled = true
	cfg.Backfill.RelayEndpoints = []string{"http://127.0.0.1:1"}
	reg := prometheus.NewRegistry()
	d := workers.Deps{Config: cfg, DB: testsupport.OpenDB(t), Log: zerolog.Nop(), Metrics: reg, Admin: http.NewServeMux(), Instance: "me"}
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
