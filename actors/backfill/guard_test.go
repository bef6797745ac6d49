package backfill

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"
)

// PDS endpoints come from DID documents anyone can publish: the worker as
// registered does not call a PDS on a loopback address, and records why;
// the relay and the PLC directory, which the operator configured (here on
// loopback too), are still used.
func TestTheWorkerDoesNotReachNonPublicPDSesUnlessAllowed(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	pds := e.pds(3, "did:plc:alice")
	e.plc.Register("did:plc:meta", "http://169.254.169.254")
	relay.Add(colManifest, "did:plc:alice", "did:plc:meta")

	cfg := config.Default()
	cfg.Backfill.RelayEndpoints = []string{relay.URL()}
	cfg.Backfill.Interval = time.Hour
	cfg.Identity.PLCURL = e.plc.URL()
	w, err := Worker(workers.Deps{Config: cfg, DB: e.db, Log: zerolog.Nop(), Metrics: prometheus.NewRegistry()}, fakeApplier)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Job(context.Background(), e.acquire("instance-a")); err != nil {
		t.Fatalf("job: %v", err)
	}
	if n := len(relay.Requests()); n == 0 {
		t.Fatal("the configured relay was not asked")
	}
	if n := len(pds.Requests()); n != 0 {
		t.Errorf("the loopback PDS was asked %d times", n)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfilled`); n != 0 {
		t.Errorf("%d records applied from a refused PDS", n)
	}
	for _, did := range []string{"did:plc:alice", "did:plc:meta"} {
		var state, msg string
		if err := e.db.QueryRow(`SELECT state, error FROM backfill_repos WHERE did = ?1 AND collection = ?2`, did, colManifest).Scan(&state, &msg); err != nil {
			t.Fatalf("%s: %v", did, err)
		}
		if state != "failed" || !strings.Contains(msg, "network.allow_private") {
			t.Errorf("%s: %s %q, want failed with a refusal naming network.allow_private", did, state, msg)
		}
	}
}
