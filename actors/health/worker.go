package health

import (
	"fmt"

	"github.com/atcr-io/appview/system"
)

// WorkerName names the unleased worker (it is not a lease name: every
// instance runs it).
const WorkerName = "health"

// DebugPath is where the cache is served on the admin endpoint.
const DebugPath = "/debug/holds"

// Worker builds the hold health checker: an unleased Job run every
// health.check_interval on every instance, its cache served at
// /debug/holds on d.Admin (when set) and collected into d.Metrics. Hold
// DIDs are resolved with identity (identity.plc_url). It returns a
// *config.Error for an invalid health.timeout or health.concurrency, and the
// metrics registerer's error.
func Worker(d system.Deps) (system.Worker, error) {
	return worker(d, d.Resolver())
}

func worker(d system.Deps, endpoints Endpoints) (system.Worker, error) {
	cfg := d.Config.Health
	cache := NewCache(d.Instance)
	if err := d.Metrics.Register(cache); err != nil {
		return system.Worker{}, fmt.Errorf("register hold health gauges: %w", err)
	}
	checks, err := NewChecksCounter(d.Metrics)
	if err != nil {
		return system.Worker{}, err
	}
	c, err := NewChecker(Options{
		DB:          d.DB,
		Endpoints:   endpoints,
		Timeout:     cfg.Timeout,
		Concurrency: cfg.Concurrency,
		Cache:       cache,
		Log:         d.Log.With().Str("worker", WorkerName).Logger(),
		Checks:      checks,
	})
	if err != nil {
		return system.Worker{}, err
	}
	if d.Admin != nil {
		d.Admin.Handle(DebugPath, cache)
	}
	return system.Worker{Name: WorkerName, Leased: false, Job: c.Run, Interval: cfg.CheckInterval}, nil
}
