package billing

import (
	"fmt"
	"net/http"

	"github.com/atcr-io/appview/internal/outbound"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/atcr-io/appview/internal/config"
)

// LeaseName is the lease the refresh runs under (docs/spec.md §4).
const LeaseName = "billing-tier-refresh"

// errDisabled wraps workers.ErrDisabled with the key that disables this worker.
var errDisabled = fmt.Errorf("billing tier refresh disabled (billing.enabled is false): %w", workers.ErrDisabled)

// Worker builds the billing tier refresh: a leased Job every
// billing.interval reading tiers from Stripe (billing.stripe_api_url,
// billing.stripe_secret_key) and resolving holds with identity
// (identity.plc_url). It returns an error wrapping workers.ErrDisabled when billing.enabled is false,
// a *config.Error for an invalid billing key, and the metrics registerer's
// error.
func Worker(d workers.Deps) (workers.Spec, error) {
	cfg := d.Config.Billing
	switch {
	case !cfg.Enabled:
		return workers.Spec{}, errDisabled
	case cfg.StripeSecretKey == "": // config.Validate refuses this; keep a bare Deps honest
		return workers.Spec{}, &config.Error{Key: "billing.stripe_secret_key", Reason: "required when billing.enabled is true"}
	}
	// Stripe is the operator's endpoint; hold endpoints come from records
	// anyone can publish, so those requests pass the outbound guard.
	stripe := &http.Client{Timeout: cfg.Timeout, CheckRedirect: outbound.SameHostRedirect}
	holds := workers.Outbound(d.Config, "hold tier update").Client(cfg.Timeout)
	log := d.Log.With().Str("worker", LeaseName).Logger()
	return worker(d, &Stripe{BaseURL: cfg.StripeAPIURL, SecretKey: cfg.StripeSecretKey, HTTP: stripe, Log: log},
		d.Resolver(), holds)
}

func worker(d workers.Deps, src Source, endpoints Endpoints, client *http.Client) (workers.Spec, error) {
	m, err := NewMetrics(d.Metrics)
	if err != nil {
		return workers.Spec{}, err
	}
	r, err := New(Options{
		DB:          d.DB,
		Source:      src,
		Endpoints:   endpoints,
		HTTP:        client,
		DefaultRank: d.Config.Billing.DefaultTierRank,
		Log:         d.Log.With().Str("worker", LeaseName).Logger(),
		Metrics:     m,
	})
	if err != nil {
		return workers.Spec{}, err
	}
	return workers.Spec{Name: LeaseName, Leased: true, Job: r.Run, Interval: d.Config.Billing.Interval}, nil
}
