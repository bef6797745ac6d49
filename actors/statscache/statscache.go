package statscache

import (
	"context"
	"database/sql"
	"fmt"
	"sort"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/processor"
)

// Options configures the actor.
type Options struct {
	DB      *database.DB
	Custody fence.Custody
	Log     zerolog.Logger
	// Metrics may be nil.
	Metrics *Metrics

	// live, when set (by New), is told which actor holds the view, for
	// the /debug/stats handler.
	live *live
}

// NewProps returns the props of a StatsCache for one grant of custody.
func NewProps(o Options) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &cache{o: o, log: o.Log.With().Str("component", "statscache").Str("custody", o.Custody.String()).Logger()}
	})
}

type repoKey struct{ did, repository string }

type cache struct {
	o     Options
	log   zerolog.Logger
	holds map[repoKey]map[string]processor.HoldStat
	// ctx is cancelled in Stopping so a reconcile in flight writes nothing
	// after the actor stopped (fence.Fenced checks it before commit).
	ctx    context.Context
	cancel context.CancelFunc
}

// Receive handles the actor's messages.
func (c *cache) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		c.ctx, c.cancel = context.WithCancel(context.Background())
		if err := c.warm(); err != nil {
			c.log.Warn().Err(err).Msg("warm-up failed")
			panic(err)
		}
		c.o.live.set(ctx.ActorSystem(), ctx.Self())
	case *actor.Stopping:
		c.o.live.clear(ctx.Self())
		if c.cancel != nil {
			c.cancel()
		}
	case *actor.Stopped, *actor.Restarting:
		c.o.live.clear(ctx.Self())
		if c.cancel != nil {
			c.cancel()
		}
	case *processor.ObserveStats:
		if msg.Custody != c.o.Custody {
			c.o.Metrics.rejected()
			c.log.Warn().Str("message_custody", msg.Custody.String()).Msg("stale-custody Observe rejected")
			respond(ctx, &processor.StaleCustodyError{Have: c.o.Custody, Got: msg.Custody})
			return
		}
		respond(ctx, c.observe(msg.Stats))
	case *processor.GetStats:
		ctx.Respond(c.snapshot(repoKey{msg.OwnerDID, msg.Repository}))
	default:
		c.log.Warn().Str("message_type", fmt.Sprintf("%T", msg)).Msg("unexpected message ignored")
	}
}

// respond answers a Request; a plain Send (the consumer's fire-and-forget
// Observe) has no sender to answer.
func respond(ctx actor.Context, reply any) {
	if ctx.Sender() != nil {
		ctx.Respond(reply)
	}
}

// observe applies stats newer-wins by version (the hold repo's rev, as the
// processor decided in SQL); updatedAt is data only.
func (c *cache) observe(stats []processor.HoldStat) *processor.StatsObserved {
	out := &processor.StatsObserved{}
	for _, s := range stats {
		k := repoKey{s.OwnerDID, s.Repository}
		holds := c.holds[k]
		if s.Deleted {
			if _, ok := holds[s.HoldDID]; ok {
				delete(holds, s.HoldDID)
				if len(holds) == 0 {
					delete(c.holds, k)
				}
				out.Applied++
			} else {
				out.Ignored++
			}
			continue
		}
		if cur, ok := holds[s.HoldDID]; ok && cur.Version >= s.Version {
			out.Ignored++
			continue
		}
		if holds == nil {
			holds = map[string]processor.HoldStat{}
			c.holds[k] = holds
		}
		holds[s.HoldDID] = s
		out.Applied++
	}
	c.o.Metrics.size(len(c.holds))
	return out
}

func (c *cache) snapshot(k repoKey) *processor.StatsSnapshot {
	s := &processor.StatsSnapshot{OwnerDID: k.did, Repository: k.repository, Custody: c.o.Custody}
	for _, h := range c.holds[k] {
		s.Holds = append(s.Holds, h)
		s.PullCount = processor.SaturatingAdd(s.PullCount, h.PullCount)
		s.PushCount = processor.SaturatingAdd(s.PushCount, h.PushCount)
		s.LastPull = later(s.LastPull, h.LastPull)
		s.LastPush = later(s.LastPush, h.LastPush)
	}
	sort.Slice(s.Holds, func(i, j int) bool { return s.Holds[i].HoldDID < s.Holds[j].HoldDID })
	return s
}

func later(a, b *int64) *int64 {
	if a == nil || (b != nil && *b > *a) {
		return b
	}
	return a
}

// warmSQL reads every persisted per-hold row.
var warmSQL = `SELECT ` + database.Text("did") + `, ` + database.Text("repository") + `, ` + database.Text("hold_did") + `, ` +
	database.Text("rkey") + `, pull_count, push_count, last_pull, last_push, updated_at, source_us, ` +
	database.Text("version") + ` FROM repository_hold_stats`

// warm loads every persisted per-hold row, then reconciles the aggregate.
func (c *cache) warm() error {
	rows, err := c.o.DB.QueryContext(c.ctx, warmSQL)
	if err != nil {
		return fmt.Errorf("statscache warm-up: %w", err)
	}
	c.holds = map[repoKey]map[string]processor.HoldStat{}
	n := 0
	for rows.Next() {
		var s processor.HoldStat
		if err := rows.Scan(&s.OwnerDID, &s.Repository, &s.HoldDID, &s.RKey, &s.PullCount, &s.PushCount,
			&s.LastPull, &s.LastPush, &s.UpdatedAt, &s.SourceUS, &s.Version); err != nil {
			rows.Close()
			return fmt.Errorf("statscache warm-up: %w", err)
		}
		k := repoKey{s.OwnerDID, s.Repository}
		if c.holds[k] == nil {
			c.holds[k] = map[string]processor.HoldStat{}
		}
		c.holds[k][s.HoldDID] = s
		n++
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return fmt.Errorf("statscache warm-up: %w", err)
	}
	c.o.Metrics.size(len(c.holds))
	var fixed int64
	err = fence.Fenced(c.ctx, c.o.DB, c.o.Custody, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(c.ctx, reconcileSQL, c.o.Custody.Fence)
		if err != nil {
			return fmt.Errorf("statscache reconcile: %w", err)
		}
		fixed, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return err
	}
	c.o.Metrics.reconciled(fixed)
	c.log.Info().Int("hold_rows", n).Int("repositories", len(c.holds)).Int64("reconciled", fixed).Msg("warm")
	return nil
}

// reconcileSQL recomputes every repository_stats row from the persisted
// per-hold and star rows and rewrites only those that differ (a partial
// sum left by anyone), stamping the reconciling custody's fence and the
// database clock. The sums saturate as the processor's do, so rows stored
// before counts were range-checked cannot fail the warm-up.
var reconcileSQL = `INSERT INTO repository_stats (did, repository, pull_count, push_count, last_pull, last_push, star_count, fence, updated_at)
SELECT k.did, k.repository, ` + processor.SaturatingSumSQL("h.pull_count") + `, ` + processor.SaturatingSumSQL("h.push_count") + `,
  MAX(h.last_pull), MAX(h.last_push),
  ` + processor.StarCountSQL("k") + `, ?1, ` + database.NowMS + `
FROM (SELECT did, repository FROM repository_hold_stats UNION SELECT did, repository FROM repository_stats) AS k
LEFT JOIN repository_hold_stats AS h ON h.did = k.did AND h.repository = k.repository
WHERE true
GROUP BY k.did, k.repository
ON CONFLICT (did, repository) DO UPDATE SET pull_count = excluded.pull_count, push_count = excluded.push_count,
  last_pull = excluded.last_pull, last_push = excluded.last_push, star_count = excluded.star_count,
  fence = excluded.fence, updated_at = excluded.updated_at
WHERE (repository_stats.pull_count, repository_stats.push_count, repository_stats.last_pull, repository_stats.last_push,
       repository_stats.star_count)
   IS NOT (excluded.pull_count, excluded.push_count, excluded.last_pull, excluded.last_push, excluded.star_count)`

// Metrics are the StatsCache's Prometheus collectors.
type Metrics struct {
	rejectedTotal   prometheus.Counter
	reconciledTotal prometheus.Counter
	repositories    prometheus.Gauge
}

// NewMetrics registers appview_statscache_rejected_total (messages under a
// stale custody), appview_statscache_reconciled_total (repository_stats
// rows repaired at warm-up) and appview_statscache_repositories (in the
// view) on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		rejectedTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "appview_statscache_rejected_total",
			Help: "StatsCache messages rejected because they carried a custody (lease fence) other than the cache's.",
		}),
		reconciledTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "appview_statscache_reconciled_total",
			Help: "repository_stats rows a starting StatsCache found different from the sum over persisted holds and rewrote.",
		}),
		repositories: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "appview_statscache_repositories",
			Help: "Repositories with at least one hold's stats in the StatsCache view.",
		}),
	}
	for _, c := range []prometheus.Collector{m.rejectedTotal, m.reconciledTotal, m.repositories} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register statscache metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) rejected() {
	if m != nil {
		m.rejectedTotal.Inc()
	}
}

func (m *Metrics) reconciled(n int64) {
	if m != nil {
		m.reconciledTotal.Add(float64(n))
	}
}

func (m *Metrics) size(n int) {
	if m != nil {
		m.repositories.Set(float64(n))
	}
}

// Rejected is the appview_statscache_rejected_total counter (for tests and dashboards).
func (m *Metrics) Rejected() prometheus.Counter { return m.rejectedTotal }

// Reconciled is the appview_statscache_reconciled_total counter.
func (m *Metrics) Reconciled() prometheus.Counter { return m.reconciledTotal }
