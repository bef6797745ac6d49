package cleanup

import (
	"github.com/atcr-io/appview/internal/workers"
)

// LeaseName is the lease the sweep runs under (docs/spec.md §4).
const LeaseName = "cleanup"

// Worker builds the registration of the cleanup sweep: a leased Job run
// every cleanup.interval with the default Rules. It returns a *config.Error
// for an invalid cleanup.chunk_rows, and the metrics registerer's error.
func Worker(d workers.Deps) (workers.Spec, error) {
	cfg := d.Config.Cleanup
	m, err := NewMetrics(d.Metrics)
	if err != nil {
		return workers.Spec{}, err
	}
	s, err := New(Options{
		DB:        d.DB,
		Rules:     Rules(d.Config),
		ChunkRows: cfg.ChunkRows,
		Log:       d.Log.With().Str("worker", LeaseName).Logger(),
		Metrics:   m,
	})
	if err != nil {
		return workers.Spec{}, err
	}
	return workers.Spec{Name: LeaseName, Leased: true, Job: s.Run, Interval: cfg.Interval}, nil
}
