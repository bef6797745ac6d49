package billing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
)

// Endpoints resolves a hold DID to the hold's base URL. *identity.Resolver
// implements it.
type Endpoints interface {
	HoldEndpoint(ctx context.Context, did string) (string, error)
}

// Outcomes recorded in billing_tier_pushes.outcome.
const (
	OutcomePushed       = "pushed"
	OutcomeUserNotFound = "user_not_found"
)

var (
	crewSQL = `SELECT ` + database.Text("hold_did") + `, ` + database.Text("member_did") + `, MAX(added_at) FROM hold_crew
WHERE hold_did <> '' AND member_did <> ''
GROUP BY hold_did, member_did ORDER BY hold_did, member_did`

	pushesSQL = `SELECT ` + database.Text("hold_did") + `, ` + database.Text("user_did") + `, tier_rank, ` +
		database.Text("outcome") + `, crew_added_at FROM billing_tier_pushes`
)

const (
	recordSQL = `INSERT INTO billing_tier_pushes
  (hold_did, user_did, tier_rank, tier_name, outcome, crew_added_at, fence, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ` + database.NowMS + `)
ON CONFLICT (hold_did, user_did) DO UPDATE SET
  tier_rank     = excluded.tier_rank,
  tier_name     = excluded.tier_name,
  outcome       = excluded.outcome,
  crew_added_at = excluded.crew_added_at,
  fence         = excluded.fence,
  updated_at    = excluded.updated_at`
)

// Options configures a Refresher.
type Options struct {
	// DB is the shared database (hold_crew read, billing_tier_pushes written).
	DB *database.DB
	// Source gives every subscriber's tier.
	Source Source
	// Endpoints resolves hold DIDs.
	Endpoints Endpoints
	// HTTP sends updateCrewTier; it should carry a timeout (billing.timeout).
	// nil means a client without one that refuses non-public addresses
	// (netguard): hold endpoints come from records anyone can publish.
	HTTP *http.Client
	// DefaultRank is pushed to a member without a subscription who was
	// pushed another rank before (billing.default_tier_rank, >= 0).
	DefaultRank int
	// Log receives one info line per round and a warning per failure.
	Log zerolog.Logger
	// Metrics counts pushes and rounds; nil counts nothing.
	Metrics *Metrics
}

// Refresher runs billing tier refresh rounds. Rounds are serialised: two
// overlapping rounds under one custody would both see a change as due and
// push it twice.
type Refresher struct {
	o  Options
	mu sync.Mutex
	// answered, when set (tests), runs after a hold's answer is received
	// and before it is recorded.
	answered func()
}

// New validates the options. It returns an error for a missing DB, Source
// or Endpoints, or a negative DefaultRank.
func New(o Options) (*Refresher, error) {
	switch {
	case o.DB == nil:
		return nil, errors.New("billing: nil database")
	case o.Source == nil:
		return nil, errors.New("billing: nil source")
	case o.Endpoints == nil:
		return nil, errors.New("billing: nil endpoint resolver")
	case o.DefaultRank < 0:
		return nil, fmt.Errorf("billing: default rank must not be negative, got %d", o.DefaultRank)
	}
	if o.HTTP == nil {
		o.HTTP = outbound.Guard{Purpose: "hold tier update"}.Client(0)
	}
	return &Refresher{o: o}, nil
}

// Report is what one round did. Counts are crew memberships.
type Report struct {
	// Subscribers is the number of users with a tier in the source.
	Subscribers int
	// Due is how many memberships needed a push at the start of the round.
	Due int
	// Pushed were accepted by their hold and recorded.
	Pushed int
	// UserNotFound were refused by their hold with UserNotFound and recorded.
	UserNotFound int
	// Failed are left for the next round (hold down, AuthRequired, other errors).
	Failed int
}

// Run is the job function (workers.Spec.Job): one round under c. Failures
// of single holds are logged and retried at the next interval; the error
// is for a round that could not run (source, database) or a superseded
// custody (wraps fence.ErrSuperseded).
func (r *Refresher) Run(ctx context.Context, c fence.Custody) error {
	_, err := r.Round(ctx, c)
	return err
}

type membership struct {
	hold, user string
	addedAt    int64 // newest hold_crew.added_at, Unix ms
}

type lastPush struct {
	rank        int
	outcome     string
	crewAddedAt int64
}

type change struct {
	membership
	rank int
}

// Round reads the source and the crew, and pushes every changed tier. It
// waits for a round already running on this Refresher to finish.
func (r *Refresher) Round(ctx context.Context, c fence.Custody) (Report, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	start := time.Now()
	var rep Report
	err := r.round(ctx, c, &rep)
	r.finish(c, rep, err, time.Since(start))
	return rep, err
}

func (r *Refresher) round(ctx context.Context, c fence.Custody, rep *Report) error {
	// A superseded holder learns it here even in a round with nothing to
	// push, and does not spend a billing API call first.
	if err := r.checkCustody(ctx, c); err != nil {
		return fmt.Errorf("billing: round start: %w", err)
	}
	tiers, err := r.o.Source.Tiers(ctx)
	if err != nil {
		return fmt.Errorf("billing: read tiers: %w", err)
	}
	rep.Subscribers = len(tiers)
	if r.o.Metrics != nil {
		r.o.Metrics.subscribers.Set(float64(len(tiers)))
	}
	crew, last, err := r.readState(ctx)
	if err != nil {
		return err
	}
	byHold := r.plan(tiers, crew, last)
	for _, changes := range byHold {
		rep.Due += len(changes)
	}
	for _, changes := range byHold {
		if err := r.pushHold(ctx, c, changes, rep); err != nil {
			return err
		}
	}
	return nil
}

func (r *Refresher) readState(ctx context.Context) ([]membership, map[[2]string]lastPush, error) {
	var crew []membership
	last := map[[2]string]lastPush{}
	err := database.Bounded(ctx, func() error {
		rows, err := r.o.DB.Query(crewSQL)
		if err != nil {
			return err
		}
		for rows.Next() {
			var m membership
			if err := rows.Scan(&m.hold, &m.user, &m.addedAt); err != nil {
				rows.Close()
				return err
			}
			crew = append(crew, m)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = r.o.DB.Query(pushesSQL)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var hold, user string
			var p lastPush
			if err := rows.Scan(&hold, &user, &p.rank, &p.outcome, &p.crewAddedAt); err != nil {
				return err
			}
			last[[2]string{hold, user}] = p
		}
		return rows.Err()
	})
	if err != nil {
		return nil, nil, fmt.Errorf("billing: read crew and last pushes: %w", err)
	}
	return crew, last, nil
}

// plan returns the due changes grouped by hold, holds and members in DID
// order (crew is sorted).
func (r *Refresher) plan(tiers map[string]Tier, crew []membership, last map[[2]string]lastPush) [][]change {
	var out [][]change
	for _, m := range crew {
		tier, subscribed := tiers[m.user]
		rank := r.o.DefaultRank
		if subscribed {
			rank = tier.Rank
		}
		prev, told := last[[2]string{m.hold, m.user}]
		due := false
		switch {
		case !told:
			due = subscribed
		case prev.outcome == OutcomeUserNotFound:
			due = prev.rank != rank || prev.crewAddedAt != m.addedAt
		default:
			due = prev.rank != rank
		}
		if !due {
			continue
		}
		if n := len(out); n == 0 || out[n-1][0].hold != m.hold {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], change{membership: m, rank: rank})
	}
	return out
}

// pushHold pushes one hold's changes. It returns an error only when the
// round must stop (custody superseded, database failure, ctx done).
func (r *Refresher) pushHold(ctx context.Context, c fence.Custody, changes []change, rep *Report) error {
	hold := changes[0].hold
	endpoint, err := r.o.Endpoints.HoldEndpoint(ctx, hold)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rep.Failed += len(changes)
		r.count("failed", len(changes))
		r.o.Log.Warn().Str("lease", c.Lease).Int64("fence", c.Fence).Str("hold", logval.String(hold)).Err(logval.Error(err)).
			Int("pending", len(changes)).Msg("billing: hold endpoint did not resolve; retrying next interval")
		return nil
	}
	for i, ch := range changes {
		// Check custody right before the push: a superseded holder must not
		// push what it could not record.
		if err := r.checkCustody(ctx, c); err != nil {
			return fmt.Errorf("billing: before pushing to %s: %w", hold, err)
		}
		name, err := r.send(ctx, endpoint, ch)
		if err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		if r.answered != nil {
			r.answered()
		}
		outcome := OutcomePushed
		switch {
		case err == nil:
			if !storableTierName(name) {
				// The push took; only the hold's name for it cannot be
				// kept (a NUL the database would refuse, failing every run
				// after; or a name far too long to be one).
				r.o.Log.Warn().Str("hold", logval.String(hold)).Str("tier_name", logval.String(name)).
					Msg("billing: hold answered a tier name that is not stored")
				name = ""
			}
		case xrpcName(err) == ErrNameUserNotFound:
			outcome = OutcomeUserNotFound
			name = ""
		default:
			log := r.o.Log.Warn().Str("lease", c.Lease).Int64("fence", c.Fence).Str("hold", logval.String(hold)).
				Str("endpoint", logval.String(endpoint)).Str("user", logval.String(ch.user)).Int("tier_rank", ch.rank).Err(logval.Error(err))
			switch {
			case xrpcName(err) == ErrNameAuthRequired:
				rest := len(changes) - i
				rep.Failed += rest
				r.count("auth_required", rest)
				log.Int("skipped", rest).Msg("billing: hold requires authentication for updateCrewTier; skipping it until next interval")
				return nil
			case holdDown(err):
				rest := len(changes) - i
				rep.Failed += rest
				r.count("failed", rest)
				log.Int("skipped", rest).Msg("billing: hold not answering; skipping it until next interval")
				return nil
			default:
				rep.Failed++
				r.count("failed", 1)
				log.Msg("billing: hold refused the tier; retrying next interval")
				continue
			}
		}
		if err := r.record(ctx, c, ch, name, outcome); err != nil {
			return err
		}
		if outcome == OutcomePushed {
			rep.Pushed++
		} else {
			rep.UserNotFound++
			r.o.Log.Info().Str("hold", logval.String(hold)).Str("user", ch.user).Int("tier_rank", ch.rank).
				Msg("billing: hold does not know this crew member; not retried until the crew record or tier changes")
		}
		r.count(outcome, 1)
	}
	return nil
}

// send pushes one change to the hold. A graceful stop (ctx ends with
// cause workers.ErrDrain) does not cut the push short: the hold acts on a
// call it has received whether or not we wait for its answer, and only the
// recorded answer keeps the next holder from pushing the same change
// again. The push stays bounded by the HTTP client's timeout
// (billing.timeout) and by how long the job runner waits for a stopping
// job. Any other end of ctx (custody lost) aborts it at once.
func (r *Refresher) send(ctx context.Context, endpoint string, ch change) (string, error) {
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(context.Cause(ctx), workers.ErrDrain) {
			cancel()
		}
	})
	defer stop()
	return updateCrewTier(pctx, r.o.HTTP, endpoint, ch.user, ch.rank)
}

// checkCustody is a fenced no-op: it fails (wrapping fence.ErrSuperseded)
// unless c is still the current custody.
func (r *Refresher) checkCustody(ctx context.Context, c fence.Custody) error {
	return fence.Fenced(ctx, r.o.DB, c, func(*sql.Tx) error { return nil })
}

// record writes the hold's answer under the fence. The hold has already
// acted on it, so a worker told to stop at this moment still records it
// (the fence still decides): dropping it would make the next holder push
// the same change again. Job returns right after, so nothing is written
// once the worker has stopped.
func (r *Refresher) record(ctx context.Context, c fence.Custody, ch change, name, outcome string) error {
	ctx = context.WithoutCancel(ctx)
	err := fence.Fenced(ctx, r.o.DB, c, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, recordSQL, ch.hold, ch.user, ch.rank, name, outcome, ch.addedAt, c.Fence)
		return err
	})
	if err != nil {
		return fmt.Errorf("billing: record %s tier %d at %s: %w", ch.user, ch.rank, ch.hold, err)
	}
	return nil
}

func (r *Refresher) count(outcome string, n int) {
	if r.o.Metrics != nil && n > 0 {
		r.o.Metrics.pushes.WithLabelValues(outcome).Add(float64(n))
	}
}

func (r *Refresher) finish(c fence.Custody, rep Report, err error, took time.Duration) {
	outcome := "ok"
	switch {
	case errors.Is(err, fence.ErrSuperseded):
		outcome = "superseded"
	case err != nil:
		outcome = "error"
	}
	if r.o.Metrics != nil {
		r.o.Metrics.rounds.WithLabelValues(outcome).Inc()
	}
	ev := r.o.Log.Info()
	if err != nil {
		ev = r.o.Log.Warn().Err(logval.Error(err))
	}
	ev.Str("event", "billing.round").Str("lease", c.Lease).Int64("fence", c.Fence).Str("outcome", outcome).
		Int("subscribers", rep.Subscribers).Int("due", rep.Due).Int("pushed", rep.Pushed).
		Int("user_not_found", rep.UserNotFound).Int("failed", rep.Failed).
		Int64("duration_ms", took.Milliseconds()).Msg("billing tier refresh")
}

// Metrics are the refresh's Prometheus collectors.
type Metrics struct {
	pushes      *prometheus.CounterVec
	rounds      *prometheus.CounterVec
	subscribers prometheus.Gauge
}

// NewMetrics builds and registers appview_billing_tier_pushes_total{outcome},
// appview_billing_rounds_total{outcome} and appview_billing_subscribers. It
// returns the registerer's error.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_billing_tier_pushes_total",
			Help: "updateCrewTier calls by outcome (pushed, user_not_found, auth_required, failed).",
		}, []string{"outcome"}),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_billing_rounds_total",
			Help: "Billing tier refresh rounds on this instance, by outcome (ok, error, superseded).",
		}, []string{"outcome"}),
		subscribers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "appview_billing_subscribers",
			Help: "Users with a tier in the billing source at the last successful read.",
		}),
	}
	for _, c := range []prometheus.Collector{m.pushes, m.rounds, m.subscribers} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register billing metrics: %w", err)
		}
	}
	return m, nil
}

// maxTierNameBytes bounds the tier name a hold answers that is stored.
const maxTierNameBytes = 256

// storableTierName reports whether a hold's tierName can be stored as
// given: at most maxTierNameBytes, no NUL (database.ErrTextNUL).
func storableTierName(name string) bool {
	return len(name) <= maxTierNameBytes && !strings.ContainsRune(name, 0)
}
