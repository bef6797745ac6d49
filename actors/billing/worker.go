package billing

import (
	"errors"
	"net/http"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/system"
)

// LeaseName is the lease the refresh runs under (SPEC §4).
const LeaseName = "billing-tier-refresh"

// ErrDisabled is returned by Worker when billing.enabled is false: the
// caller does not register the worker.
var ErrDisabled = errors.New("billing tier refresh disabled (billing.enabled is false)")

// Worker builds the billing tier refresh: a leased Job every
// billing.interval reading tiers from Stripe (billing.stripe_api_url,
// billing.stripe_secret_key) and resolving holds with identity
// (identity.plc_url). It returns ErrDisabled when billing.enabled is false,
// a *config.Error for an invalid billing key, and the metrics registerer's
// error.
func Worker(d system.Deps) (system.Worker, error) {
	cfg := d.Config.Billing
	switch {
	case !cfg.Enabled:
		return system.Worker{}, ErrDisabled
	case cfg.StripeSecretKey == "": // config.Validate refuses this; keep a bare Deps honest
		return system.Worker{}, &config.Error{Key: "billing.stripe_secret_key", Reason: "required when billing.enabled is true"}
	}
	client := &http.Client{Timeout: cfg.Timeout}
	log := d.Log.With().Str("worker", LeaseName).Logger()
	return worker(d, &Stripe{BaseURL: cfg.StripeAPIURL, SecretKey: cfg.StripeSecretKey, HTTP: client, Log: log},
		d.Resolver(), client)
}

func worker(d system.Deps, src Source, endpoints Endpoints, client *http.Client) (system.Worker, error) {
	m, err := NewMetrics(d.Metrics)
	if err != nil {
		return system.Worker{}, err
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
		return system.Worker{}, err
	}
	return system.Worker{Name: LeaseName, Leased: true, Job: r.Run, Interval: d.Config.Billing.Interval}, nil
}
