package health

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"
)

// A hold DID is network data: a captain record naming a loopback or cloud
// metadata host must not make every instance fetch it. The worker as
// registered refuses both at dial time and reports why; the loopback hold
// is never reached.
func TestTheWorkerDoesNotReachNonPublicHoldsUnlessAllowed(t *testing.T) {
	db := testsupport.OpenDB(t)
	fake := newFakeHold(t)
	addCaptain(t, db, fake.did)
	addCaptain(t, db, "did:web:169.254.169.254")

	cfg := config.Default()
	cfg.Health.CheckInterval, cfg.Health.Timeout = 5*time.Second, 2*time.Second
	reg, mux := prometheus.NewRegistry(), http.NewServeMux()
	w, err := Worker(workers.Deps{Config: cfg, DB: db, Log: zerolog.Nop(), Metrics: reg, Admin: mux, Instance: "inst-a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Job(context.Background(), noCustody); err != nil {
		t.Fatalf("job: %v", err)
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, DebugPath, nil))
	var doc snapshotJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || len(doc.Holds) != 2 {
		t.Fatalf("%s: %v %s", DebugPath, err, rec.Body.String())
	}
	for _, s := range doc.Holds {
		if s.Healthy || !strings.Contains(s.LastError, "refused hold health check target") ||
			!strings.Contains(s.LastError, "network.allow_private") {
			t.Errorf("%s: healthy %v, error %q; want a refusal naming network.allow_private", s.HoldDID, s.Healthy, s.LastError)
		}
	}
	if n := fake.hits.Load(); n != 0 {
		t.Errorf("the loopback hold was reached %d times", n)
	}
}
