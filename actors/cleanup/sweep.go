package cleanup

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
)

// DefaultChunkRows is the chunk size when Options.ChunkRows is 0.
const DefaultChunkRows = 500

// Options configures a Sweeper.
type Options struct {
	// DB is the shared database.
	DB *database.DB
	// Rules are the prune rules, applied in order (Rules(cfg) in production).
	Rules []Rule
	// ChunkRows bounds the rows one fenced delete transaction removes; 0
	// means DefaultChunkRows.
	ChunkRows int
	// Log receives one info line per sweep and a warning per failing rule.
	Log zerolog.Logger
	// Metrics counts deleted rows and sweeps; nil counts nothing.
	Metrics *Metrics
}

// Sweeper applies prune rules under a custody.
type Sweeper struct {
	db      *database.DB
	rules   []Rule
	chunk   int
	log     zerolog.Logger
	metrics *Metrics
}

// New validates the options and returns a Sweeper. It returns an error for
// a rule that is malformed or names a protected table (leases,
// schema_migrations), or a negative ChunkRows.
func New(o Options) (*Sweeper, error) {
	if o.DB == nil {
		return nil, errors.New("cleanup: nil database")
	}
	if o.ChunkRows < 0 {
		return nil, fmt.Errorf("cleanup: chunk rows must not be negative, got %d", o.ChunkRows)
	}
	seen := map[string]bool{}
	for _, r := range o.Rules {
		if err := r.validate(); err != nil {
			return nil, err
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("cleanup rule %q: duplicate name", r.Name)
		}
		seen[r.Name] = true
	}
	chunk := o.ChunkRows
	if chunk == 0 {
		chunk = DefaultChunkRows
	}
	return &Sweeper{db: o.DB, rules: append([]Rule(nil), o.Rules...), chunk: chunk, log: o.Log, metrics: o.Metrics}, nil
}

// Report is what one sweep did.
type Report struct {
	// Deleted is the number of rows deleted per rule name (every rule
	// present, 0 when nothing matched or the rule failed).
	Deleted map[string]int64
	// Failed maps a failing rule's name to its error.
	Failed map[string]error
	// Duration is the sweep's wall-clock time.
	Duration time.Duration
}

// Run is the job function (workers.Spec.Job): one sweep under c. It logs
// the sweep and returns its error, so the job runner retries at the next
// interval.
func (s *Sweeper) Run(ctx context.Context, c fence.Custody) error {
	_, err := s.Sweep(ctx, c)
	return err
}

// Sweep applies every rule once under custody c and returns what it
// deleted. Rules fail independently: a failing rule is logged and the next
// one runs. A superseded custody (the error wraps fence.ErrSuperseded) or a
// done ctx stops the sweep at once; rows deleted by chunks already
// committed stay deleted.
func (s *Sweeper) Sweep(ctx context.Context, c fence.Custody) (Report, error) {
	start := time.Now()
	rep := Report{Deleted: make(map[string]int64, len(s.rules)), Failed: map[string]error{}}
	for _, r := range s.rules {
		rep.Deleted[r.Name] = 0
	}
	now, err := s.dbNow(ctx)
	if err != nil {
		rep.Duration = time.Since(start)
		s.finish(c, rep, err)
		return rep, err
	}
	var errs []error
	var stop error
	for _, r := range s.rules {
		n, err := s.apply(ctx, c, r, now-r.Age.Milliseconds())
		rep.Deleted[r.Name] = n
		if s.metrics != nil && n > 0 {
			s.metrics.deleted.WithLabelValues(r.Name).Add(float64(n))
		}
		if err == nil {
			continue
		}
		rep.Failed[r.Name] = err
		errs = append(errs, err)
		if errors.Is(err, fence.ErrSuperseded) || ctx.Err() != nil {
			stop = err
			break
		}
		s.log.Warn().Str("lease", c.Lease).Int64("fence", c.Fence).Str("rule", r.Name).
			Err(err).Msg("cleanup rule failed; other rules continue")
	}
	rep.Duration = time.Since(start)
	err = errors.Join(errs...)
	if stop != nil {
		err = stop
	}
	s.finish(c, rep, err)
	return rep, err
}

// apply deletes r's rows older than cutoff (Unix ms), one fenced chunk at a
// time, until a chunk comes back short.
func (s *Sweeper) apply(ctx context.Context, c fence.Custody, r Rule, cutoff int64) (int64, error) {
	query := r.deleteSQL()
	var total int64
	for {
		var n int64
		err := fence.Fenced(ctx, s.db, c, func(tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, query, cutoff, s.chunk)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
		if err != nil {
			return total, fmt.Errorf("cleanup rule %q (table %s): %w", r.Name, r.Table, err)
		}
		total += n
		if n < int64(s.chunk) {
			return total, nil
		}
	}
}

func (s *Sweeper) dbNow(ctx context.Context) (int64, error) {
	var now int64
	err := database.Bounded(ctx, func() error {
		return s.db.QueryRow("SELECT " + database.NowMS).Scan(&now)
	})
	if err != nil {
		return 0, fmt.Errorf("cleanup: read database clock: %w", err)
	}
	return now, nil
}

// finish logs the sweep's one info line (warn when it failed) and records
// its outcome.
func (s *Sweeper) finish(c fence.Custody, rep Report, err error) {
	outcome := "ok"
	switch {
	case errors.Is(err, fence.ErrSuperseded):
		outcome = "superseded"
	case err != nil:
		outcome = "error"
	}
	if s.metrics != nil {
		s.metrics.sweeps.WithLabelValues(outcome).Inc()
		s.metrics.duration.Observe(rep.Duration.Seconds())
	}
	deleted := zerolog.Dict()
	var total int64
	for _, r := range s.rules {
		deleted = deleted.Int64(r.Name, rep.Deleted[r.Name])
		total += rep.Deleted[r.Name]
	}
	ev := s.log.Info()
	if err != nil {
		ev = s.log.Warn().Err(err)
	}
	ev.Str("event", "cleanup.sweep").Str("lease", c.Lease).Int64("fence", c.Fence).
		Str("outcome", outcome).Int64("deleted_total", total).Dict("deleted", deleted).
		Int64("duration_ms", rep.Duration.Milliseconds()).Msg("cleanup sweep")
}

// Metrics are the sweep's Prometheus collectors.
type Metrics struct {
	deleted  *prometheus.CounterVec
	sweeps   *prometheus.CounterVec
	duration prometheus.Histogram
}

// NewMetrics builds and registers the collectors:
// appview_cleanup_rows_deleted_total{rule}, appview_cleanup_sweeps_total{outcome}
// (ok, error, superseded) and appview_cleanup_sweep_duration_seconds. It
// returns the registerer's error (e.g. prometheus.AlreadyRegisteredError).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_cleanup_rows_deleted_total",
			Help: "Rows deleted by the cleanup sweep, by prune rule.",
		}, []string{"rule"}),
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_cleanup_sweeps_total",
			Help: "Cleanup sweeps run on this instance, by outcome (ok, error, superseded).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "appview_cleanup_sweep_duration_seconds",
			Help:    "Wall-clock duration of one cleanup sweep, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 8),
		}),
	}
	for _, c := range []prometheus.Collector{m.deleted, m.sweeps, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register cleanup metrics: %w", err)
		}
	}
	return m, nil
}
