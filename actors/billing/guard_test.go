package billing

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/workers"
)

// Hold DIDs come from crew records anyone can publish: the worker as
// registered does not push to a hold on a loopback address (nor resolve
// its did:web there), and says which key would allow it. Stripe, the
// operator's endpoint, is still reached.
func TestTheWorkerDoesNotReachNonPublicHoldsUnlessAllowed(t *testing.T) {
	f := newFixture(t)
	h := newFakeHold(t)
	f.crew(t, h, alice, "a", 1)
	f.stripe.subscribe(alice, 2)
	c := f.acquire(t, "inst-a")

	cfg := config.Default()
	cfg.Billing.Enabled, cfg.Billing.StripeSecretKey, cfg.Billing.StripeAPIURL = true, secretKey, f.stripe.URL
	cfg.Billing.Interval = time.Hour
	var logs bytes.Buffer
	w, err := Worker(workers.Deps{Config: cfg, DB: f.db, Log: zerolog.New(&logs), Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Job(context.Background(), c) // the round's failures are counted and logged, not returned
	if n := h.attempts.Load(); n != 0 {
		t.Errorf("the loopback hold was reached %d times", n)
	}
	if !strings.Contains(logs.String(), "refused") || !strings.Contains(logs.String(), "network.allow_private") {
		t.Errorf("no failure names network.allow_private; log:\n%s", logs.String())
	}
}
