package backfill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/cenkalti/backoff/v5"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
)

// errDisabled wraps workers.ErrDisabled with the key that disables this worker.
var errDisabled = fmt.Errorf("backfill disabled (backfill.enabled is false): %w", workers.ErrDisabled)

// Delays between attempts of an unfinished run under interval 0 (see Once).
const (
	onceRetryMinDefault = time.Minute
	onceRetryMaxDefault = 30 * time.Minute
)

// Worker describes the backfill to the registry: a leased Job named
// LeaseName. With backfill.interval 0 the job is Once (one completed run,
// then the registry holds the lease idle, so a run happens once per
// deployment rather than once per instance) and a new holder skips the run
// when one completed less than backfill.rerun_after ago; with an interval
// the job is Run, every interval. Records go to applier inside the
// backfill's fenced transactions. Errors: workers.ErrDisabled (wrapped); a *config.Error for
// an empty backfill.relay_endpoints; a metrics registration error.
func Worker(d workers.Deps, applier Applier) (workers.Spec, error) {
	cfg := d.Config.Backfill
	if !cfg.Enabled {
		return workers.Spec{}, errDisabled
	}
	metrics, err := NewMetrics(d.Metrics)
	if err != nil {
		return workers.Spec{}, err
	}
	o := Options{
		DB:             d.DB,
		Log:            d.Log,
		Applier:        applier,
		Resolver:       d.Resolver(),
		RelayEndpoints: cfg.RelayEndpoints,
		// Relays are the operator's; PDS endpoints come from DID
		// documents, which anyone can publish.
		HTTP:        workers.Outbound(d.Config, "backfill").TrustURLs(cfg.RelayEndpoints...).Client(0),
		Concurrency: cfg.Concurrency,
		Metrics:     metrics,
	}
	if cfg.Interval == 0 {
		o.RerunAfter = cfg.RerunAfter
	}
	b, err := New(o)
	if err != nil {
		return workers.Spec{}, err
	}
	job := b.Run
	if cfg.Interval == 0 {
		job = b.Once
	}
	return workers.Spec{Name: LeaseName, Leased: true, Job: job, Interval: cfg.Interval}, nil
}

// Once calls Run until a run completes or is skipped: an unfinished run
// (a collection no relay could list, or a database error) is resumed after
// a jittered exponential delay (Options.OnceRetryMin..OnceRetryMax),
// because under interval 0 nothing else would ever finish it. It returns
// nil when done, ctx's error when custody ends, or an error wrapping
// fence.ErrSuperseded.
func (b *Backfiller) Once(ctx context.Context, c fence.Custody) error {
	bo := &backoff.ExponentialBackOff{
		InitialInterval:     b.o.OnceRetryMin,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         b.o.OnceRetryMax,
	}
	bo.Reset()
	for {
		err := b.Run(ctx, c)
		if err == nil || ctx.Err() != nil || errors.Is(err, fence.ErrSuperseded) {
			return err
		}
		wait := bo.NextBackOff()
		// Run said at warn that the run fails, once (failing.go).
		b.log.Debug().Err(logval.Error(err)).Int64("retry_in_ms", wait.Milliseconds()).Msg("backfill run unfinished; resuming it later")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("backfill: %w (last run: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// ProcessorWorker is Worker feeding the registry's processor, the same one
// the Jetstream consumer uses, so backfilled records obey the same
// idempotency and newer-wins rules; pm are the process's processor
// collectors (processor.NewMetrics, built once and shared with the
// consumer's processor).
func ProcessorWorker(pm *processor.Metrics) func(workers.Deps) (workers.Spec, error) {
	return func(d workers.Deps) (workers.Spec, error) {
		p := processor.New(processor.Options{Log: d.Log.With().Str("worker", LeaseName).Logger(), Metrics: pm, Handles: d.HandleResolver()})
		return Worker(d, preparedApplier{p: p, db: d.DB})
	}
}

// preparedApplier is the processor as an Applier that also resolves a
// page's handles before its transaction (processor.PrepareBatch).
type preparedApplier struct {
	p  *processor.Processor
	db *database.DB
}

func (a preparedApplier) ApplyTx(ctx context.Context, tx *sql.Tx, c fence.Custody, evs []jetstream.Event) (Applied, error) {
	r, err := a.p.ApplyTx(ctx, tx, c, evs)
	return Applied{Applied: r.Applied + r.Unchanged, Skipped: r.SkippedTotal()}, err
}

// Prepare implements Preparer.
func (a preparedApplier) Prepare(ctx context.Context, evs []jetstream.Event) context.Context {
	return a.p.PrepareBatch(ctx, a.db, evs)
}
