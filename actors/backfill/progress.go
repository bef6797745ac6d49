package backfill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/atcr-io/appview/internal/admin"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// Progress is how far the latest backfill run has got, read
// from the checkpoint tables alone, so that any instance (and the
// read-only `appview backfill status`) sees the holder's progress.
//
// The relays list repositories page by page, so the total is not known
// up front: ReposKnown counts the (collection, DID) pairs the run has
// reached so far, and it only stops growing once every collection's
// listing is done (ListingDone). Until then ETA is a lower bound.
type Progress struct {
	// Run is false when no backfill run was ever recorded; every other
	// field is then zero.
	Run   bool  `json:"run"`
	RunID int64 `json:"run_id,omitempty"`
	// Holder and Fence name the custody that last worked on the run.
	Holder string `json:"holder,omitempty"`
	Fence  int64  `json:"fence,omitempty"`
	// StartedAt, CompletedAt (nil while running) and UpdatedAt are from
	// the database's clock; the JSON leaves them out when there is no run
	// (not "0001-01-01T00:00:00Z").
	StartedAt   time.Time  `json:"started_at,omitzero"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	UpdatedAt   time.Time  `json:"updated_at,omitzero"`
	// ReposDone and ReposFailed are finished (collection, DID) pairs;
	// ReposKnown adds the ones in progress.
	ReposDone   int64 `json:"repos_done"`
	ReposFailed int64 `json:"repos_failed"`
	ReposKnown  int64 `json:"repos_known"`
	// Records is how many records the run has handed to the processor.
	Records int64 `json:"records_applied"`
	// Collections counts the collections the run has started listing;
	// CollectionsListed those whose listing is complete.
	Collections       int64 `json:"collections"`
	CollectionsListed int64 `json:"collections_listed"`
	// ListingDone is true once every started collection is fully listed
	// (ReposKnown is then the run's total).
	ListingDone bool `json:"listing_done"`
	// ReposPerSecond and RecordsPerSecond are averages over the run so far
	// (up to completion for a completed run).
	ReposPerSecond   float64 `json:"repos_per_second"`
	RecordsPerSecond float64 `json:"records_per_second"`
	// ETASeconds estimates the time left at the current repository rate;
	// -1 when unknown (no repository finished yet, or the run is
	// StateStopped), 0 when completed. A lower bound while ListingDone is
	// false.
	ETASeconds float64 `json:"eta_seconds"`
	// Fraction is finished / known repositories, 0..1 (1 when completed).
	Fraction float64 `json:"fraction"`
	// State is what is known of the run (StateRunning, StateFailing,
	// StateCompleted, StateStopped or StateUnknown); "" when there is no
	// run. The run's row outlives the process that worked on it, so an
	// unfinished run is running only while an instance holds the
	// backfill lease.
	State string `json:"state,omitempty"`
	// FailedAttempts counts the attempts at the run that ended in an
	// error; LastError and LastErrorAt are the latest one's (failing.go).
	FailedAttempts int64      `json:"failed_attempts"`
	LastError      string     `json:"last_error,omitempty"`
	LastErrorAt    *time.Time `json:"last_error_at,omitempty"`
	// Lease is the backfill lease as read with the run, at the same
	// instant of the database clock (its state and time left included);
	// nil when the lease was never taken (backfill never ran with leases
	// enabled).
	Lease *fence.Listed `json:"lease,omitempty"`
}

// Run states (Progress.State).
const (
	// StateCompleted: the run finished (completed_at is set).
	StateCompleted = "completed"
	// StateRunning: the run is unfinished and an instance holds the
	// backfill lease: its holder works on the run, or a new holder is
	// about to resume it.
	StateRunning = "running"
	// StateFailing: the run is unfinished, an instance holds the backfill
	// lease (or leases are disabled), and its latest attempt ended in an
	// error (LastError) with no attempt begun since: it is retried later.
	StateFailing = "failing"
	// StateStopped: the run is unfinished and no instance holds the
	// backfill lease (it was released, its holder's grant expired, or it
	// was never taken): nothing works on the run, and the next holder
	// resumes it from its checkpoint.
	StateStopped = "stopped"
	// StateUnknown: the run is unfinished and was last written with
	// leases disabled (fence 0), so no lease says whether an instance
	// still works on it; UpdatedAt is when it last progressed.
	StateUnknown = "unknown"
)

// Finished is ReposDone + ReposFailed.
func (p Progress) Finished() int64 { return p.ReposDone + p.ReposFailed }

// progressSQL reads the latest run; {errors} is its failure columns
// (progressErrorColumns, or their defaults on a database not yet migrated
// to them: `backfill status` of a newer binary does not migrate).
var progressSQL = `SELECT r.id, ` + database.Text("r.holder") + `, r.fence, r.started_at, r.completed_at, r.updated_at,
  r.repos_done, r.repos_failed, r.records, {errors},
  (SELECT COUNT(*) FROM backfill_repos b WHERE b.run_id = r.id),
  (SELECT COUNT(*) FROM backfill_collections c WHERE c.run_id = r.id),
  (SELECT COUNT(*) FROM backfill_collections c WHERE c.run_id = r.id AND c.done = 1),
  ` + database.NowMS + `,
  ` + database.Text("l.holder") + `, l.fence, l.acquired_at, l.renewed_at, l.expires_at
FROM backfill_runs r LEFT JOIN leases l ON l.name = '` + LeaseName + `'
ORDER BY r.id DESC LIMIT 1`

var (
	progressErrorColumns = `r.failed_attempts, ` + database.Text("r.last_error") + `, r.last_error_at`
	progressNoErrors     = `0, '', NULL`
)

// ReadProgress reads the latest run's Progress. It only reads.
func ReadProgress(ctx context.Context, db *database.DB) (Progress, error) {
	var (
		p                                     Progress
		started, updated, nowMS               int64
		completed, lastErrorAt                sql.NullInt64
		leaseHolder                           sql.NullString
		leaseFence, acquired, renewed, expiry sql.NullInt64
	)
	read := func(cols string) error {
		return db.QueryRowContext(ctx, strings.Replace(progressSQL, "{errors}", cols, 1)).Scan(&p.RunID, &p.Holder, &p.Fence, &started, &completed, &updated,
			&p.ReposDone, &p.ReposFailed, &p.Records, &p.FailedAttempts, &p.LastError, &lastErrorAt,
			&p.ReposKnown, &p.Collections, &p.CollectionsListed, &nowMS,
			&leaseHolder, &leaseFence, &acquired, &renewed, &expiry)
	}
	err := read(progressErrorColumns)
	if err != nil && strings.Contains(strings.ToLower(err.Error()), "no such column") {
		err = read(progressNoErrors)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return Progress{ETASeconds: -1}, nil
	}
	if err != nil {
		return Progress{}, fmt.Errorf("read backfill progress: %w", err)
	}
	p.Run = true
	p.StartedAt, p.UpdatedAt = time.UnixMilli(started).UTC(), time.UnixMilli(updated).UTC()
	// A repository counted done may have no row of its own in an older
	// database; the known total is never below the finished count.
	p.ReposKnown = max(p.ReposKnown, p.Finished())
	p.ListingDone = p.Collections > 0 && p.CollectionsListed == p.Collections
	end := nowMS
	if completed.Valid {
		c := time.UnixMilli(completed.Int64).UTC()
		p.CompletedAt, end = &c, completed.Int64
	}
	if secs := float64(end-started) / 1000; secs > 0 {
		p.ReposPerSecond = float64(p.Finished()) / secs
		p.RecordsPerSecond = float64(p.Records) / secs
	}
	switch {
	case completed.Valid:
		p.ETASeconds, p.Fraction = 0, 1
	case p.ReposPerSecond > 0:
		p.ETASeconds = float64(p.ReposKnown-p.Finished()) / p.ReposPerSecond
	default:
		p.ETASeconds = -1
	}
	if !completed.Valid && p.ReposKnown > 0 {
		p.Fraction = float64(p.Finished()) / float64(p.ReposKnown)
	}
	if leaseHolder.Valid {
		l := fence.Row{Name: LeaseName, Holder: leaseHolder.String, Fence: leaseFence.Int64,
			AcquiredAt: acquired.Int64, RenewedAt: renewed.Int64, ExpiresAt: expiry.Int64, Now: nowMS}.Listed()
		p.Lease = &l
	}
	if lastErrorAt.Valid {
		at := time.UnixMilli(lastErrorAt.Int64).UTC()
		p.LastErrorAt = &at
	}
	held := p.Lease != nil && p.Lease.State == fence.StateHeld
	switch {
	case completed.Valid:
		p.State = StateCompleted
	case (held || p.Fence == 0) && lastErrorAt.Valid && lastErrorAt.Int64 >= updated:
		// No attempt began since the failure: each begins by stamping
		// updated_at (resumeRunSQL), and a failure never does.
		p.State = StateFailing
	case held:
		p.State = StateRunning
	case p.Fence == 0:
		p.State = StateUnknown
	default:
		// Nothing progresses until a holder resumes the run: the time
		// left is not known.
		p.State, p.ETASeconds = StateStopped, -1
	}
	return p, nil
}

// progressTimeout bounds the read behind a scrape or /debug/backfill.
const progressTimeout = 2 * time.Second

// progressCollector exports Progress as gauges, read at scrape time (so
// every instance shows the holder's progress, and nothing is kept in
// memory between scrapes).
type progressCollector struct {
	db                                            *database.DB
	repos, records, rate, recordRate, eta, active *prometheus.Desc
	failing                                       *prometheus.Desc
}

// NewProgressCollector returns the collector of the backfill progress
// gauges: appview_backfill_progress_repos{state="done|failed|known"},
// appview_backfill_progress_records, appview_backfill_progress_repos_per_second,
// appview_backfill_progress_records_per_second,
// appview_backfill_progress_eta_seconds (-1: unknown) and
// appview_backfill_progress_running (1 while a run is unfinished and an
// instance holds the backfill lease, see Progress.State) and
// appview_backfill_progress_failing (1 while it is StateFailing). When
// the database cannot be read the scrape carries none of them.
func NewProgressCollector(db *database.DB) prometheus.Collector {
	return &progressCollector{
		db: db,
		repos: prometheus.NewDesc("appview_backfill_progress_repos",
			"Latest backfill run: (collection, DID) pairs by state: done, failed, known (reached so far; the total once listing is done).", []string{"state"}, nil),
		records: prometheus.NewDesc("appview_backfill_progress_records",
			"Latest backfill run: records applied so far.", nil, nil),
		rate: prometheus.NewDesc("appview_backfill_progress_repos_per_second",
			"Latest backfill run: repositories finished per second, averaged over the run.", nil, nil),
		recordRate: prometheus.NewDesc("appview_backfill_progress_records_per_second",
			"Latest backfill run: records applied per second, averaged over the run.", nil, nil),
		eta: prometheus.NewDesc("appview_backfill_progress_eta_seconds",
			"Latest backfill run: estimated seconds left at the current rate (-1 unknown, 0 completed; a lower bound while listing).", nil, nil),
		active: prometheus.NewDesc("appview_backfill_progress_running",
			"1 while the latest backfill run is unfinished and an instance holds the backfill lease (or, run with leases disabled, while it is unfinished), else 0.", nil, nil),
		failing: prometheus.NewDesc("appview_backfill_progress_failing",
			"1 while the latest backfill run's latest attempt ended in an error and no attempt has begun since (it is retried later), else 0.", nil, nil),
	}
}

func (c *progressCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.repos, c.records, c.rate, c.recordRate, c.eta, c.active, c.failing} {
		ch <- d
	}
}

func (c *progressCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), progressTimeout)
	defer cancel()
	p, err := ReadProgress(ctx, c.db)
	if err != nil {
		return
	}
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	g(c.repos, float64(p.ReposDone), "done")
	g(c.repos, float64(p.ReposFailed), "failed")
	g(c.repos, float64(p.ReposKnown), "known")
	g(c.records, float64(p.Records))
	g(c.rate, p.ReposPerSecond)
	g(c.recordRate, p.RecordsPerSecond)
	g(c.eta, p.ETASeconds)
	running, failing := 0.0, 0.0
	switch p.State {
	case StateRunning, StateUnknown:
		running = 1
	case StateFailing:
		running, failing = 1, 1
	}
	g(c.active, running)
	g(c.failing, failing)
}

// ProgressHandler serves GET /debug/backfill: the latest run's Progress
// as JSON, or 503 with {"error": "..."} when the database cannot be read.
func ProgressHandler(db *database.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), progressTimeout)
		defer cancel()
		p, err := ReadProgress(ctx, db)
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			admin.JSON(w, map[string]string{"error": admin.OneLine(err.Error())})
			return
		}
		admin.JSON(w, p)
	})
}
