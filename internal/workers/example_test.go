package workers_test

import (
	"context"
	"database/sql"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/workers"
)

// Worker is a whole leased worker (docs/architecture.md): it lives in its
// own package under actors/ and is registered by one line in
// cmd/appview/workers.go, `digest.Worker,`. This copy is compiled with the
// tests so the documented example cannot drift from the types.
func Worker(d workers.Deps) (workers.Spec, error) {
	if d.Config.Cleanup.Interval <= 0 { // stands in for the worker's own enable switch
		return workers.Spec{}, workers.ErrDisabled
	}
	return workers.Spec{
		Name:     "daily-digest", // also the lease name
		Leased:   true,
		Interval: 24 * time.Hour,
		Job: func(ctx context.Context, c fence.Custody) error {
			return fence.Fenced(ctx, d.DB, c, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO digests (sent_at, fence) VALUES (unixepoch() * 1000, ?1)`, c.Fence)
				return err // commits only while this instance still holds the lease
			})
		},
	}, nil
}

// Example_leasedWorker shows the registration a worker package provides.
func Example_leasedWorker() {
	var _ func(workers.Deps) (workers.Spec, error) = Worker
}
