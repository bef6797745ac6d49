package health

import (
	"fmt"

	"github.com/atcr-io/appview/internal/workers"
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
func Worker(d workers.Deps) (workers.Spec, error) {
	return worker(d, d.Resolver())
}

func worker(d workers.Deps, endpoints Endpoints) (workers.Spec, error) {
	cfg := d.Config.Health
	cache := NewCache(d.Instance)
	if err := d.Metrics.Register(cache); err != nil {
		return workers.Spec{}, fmt.Errorf("register hold health gauges: %w", err)
	}
	checks, err := NewChecksCounter(d.Metrics)
	if err != nil {
		return workers.Spec{}, err
	}
	c, err := NewChecker(Options{
		DB:          d.DB,
		Endpoints:   endpoints,
		HTTP:        workers.Outbound(d.Config, "hold health check").Client(0),
		Timeout:     cfg.Timeout,
		Concurrency: cfg.Concurrency,
		Cache:       cache,
		Log:         d.Log.With().Str("worker", WorkerName).Logger(),
		Checks:      checks,
	})
	if err != nil {
		return workers.Spec{}, err
	}
	if d.Admin != nil {
		d.Admin.Handle(DebugPath, cache)
	}
	return workers.Spec{Name: WorkerName, Leased: false, Job: c.Run, Interval: cfg.CheckInterval}, nil
}
