package backfill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
)

// LeaseName is the lease the backfill runs under (docs/spec.md §4).
const LeaseName = "backfill"

// Collections are the io.atcr.* NSIDs backfilled (docs/lexicons.md), in the
// order they are walked: manifests before the tags that point at them.
var Collections = []string{
	"io.atcr.manifest",
	"io.atcr.tag",
	"io.atcr.sailor.star",
	"io.atcr.sailor.profile",
	"io.atcr.repo.page",
	"io.atcr.hold.captain",
	"io.atcr.hold.crew",
	"io.atcr.hold.stats",
}

// Page sizes: listRecords allows at most 100; listReposByCollection is
// cheap for the relay, so ask for many.
const (
	recordPageSizeDefault = 100
	relayPageSizeDefault  = 1000
)

// Log sampling for per-repository failures and invalid records: a broken
// PDS hosting many repositories must not flood the log.
const (
	skipLogBurst  = 20
	skipLogPeriod = time.Minute
)

// Applier applies backfilled records, as synthetic Jetstream create
// events, inside the caller's transaction: the backfill commits a page of
// records together with its checkpoint, so a resumed run never applies a
// page twice nor skips one. The transaction is already fenced by c (see
// fence.Fenced); the applier must not commit or roll it back. Like the
// Jetstream processor it must be idempotent and must skip (not fail on) an
// invalid record. An error aborts the page: nothing of it commits.
type Applier interface {
	ApplyTx(ctx context.Context, tx *sql.Tx, c fence.Custody, events []jetstream.Event) (Applied, error)
}

// Preparer is an Applier that has work to do before a page's
// transaction opens (network lookups that must not hold the write lock):
// Prepare returns the context ApplyTx is then called with.
type Preparer interface {
	Prepare(ctx context.Context, events []jetstream.Event) context.Context
}

// Applied counts the outcome of one ApplyTx call.
type Applied struct {
	// Applied events changed or confirmed a row.
	Applied int
	// Skipped events were invalid or not for this registry.
	Skipped int
}

// ApplierFunc adapts a function to Applier.
type ApplierFunc func(ctx context.Context, tx *sql.Tx, c fence.Custody, events []jetstream.Event) (Applied, error)

// ApplyTx calls f.
func (f ApplierFunc) ApplyTx(ctx context.Context, tx *sql.Tx, c fence.Custody, events []jetstream.Event) (Applied, error) {
	return f(ctx, tx, c, events)
}

// Resolver finds the PDS hosting a DID's repository
// (*identity.Resolver satisfies it).
type Resolver interface {
	// PDSEndpoint returns the PDS base URL (no trailing slash).
	PDSEndpoint(ctx context.Context, did string) (string, error)
}

// Options configure a Backfiller. DB, Applier, Resolver and RelayEndpoints
// are required.
type Options struct {
	DB       *database.DB
	Log      zerolog.Logger
	Applier  Applier
	Resolver Resolver
	// HTTP makes the relay and PDS calls; nil means a client of its own
	// that refuses non-public addresses except for RelayEndpoints' hosts
	// (netguard): PDS endpoints come from DID documents.
	// Each attempt is bounded by Retry.RequestTimeout.
	HTTP *http.Client
	// RelayEndpoints serve listReposByCollection, tried in order.
	RelayEndpoints []string
	// Collections to backfill; nil means Collections.
	Collections []string
	// Concurrency bounds how many repositories are fetched at once; 0 means 4.
	Concurrency int
	// RerunAfter: a run is skipped when one completed less than this ago.
	// Worker sets it from backfill.rerun_after when backfill.interval is 0,
	// and leaves it 0 (never skip) for periodic runs.
	RerunAfter time.Duration
	// RelayPageSize is the listReposByCollection limit; 0 means 1000.
	RelayPageSize int
	// RecordPageSize is the listRecords limit (at most 100); 0 means 100.
	RecordPageSize int
	// Retry bounds the retries of each XRPC request.
	Retry RetryPolicy
	// Metrics are shared across grants of custody; nil builds unregistered ones.
	Metrics *Metrics
	// AfterWrite, when set, runs after every committed database write with
	// what was written (claim, page, record (one record of a page retried
	// record by record), repo_failed, relay_cursor, collection_done,
	// complete): a hook for tests and instrumentation.
	AfterWrite func(what string)
	// Now is the clock stamped on synthetic events (TimeUS); nil means time.Now.
	Now func() time.Time
	// OnceRetryMin and OnceRetryMax bound the delay before Once resumes an
	// unfinished run; 0 means 1 min and 30 min.
	OnceRetryMin, OnceRetryMax time.Duration
}

// Backfiller walks every io.atcr.* record on the network into the database.
// Run is its job function; it is safe to call Run again after it returned.
type Backfiller struct {
	o       Options
	xrpc    *xrpcClient
	log     zerolog.Logger
	skipLog zerolog.Logger
	// rateWaitNS and deferrals add up, over the Backfiller's life, the time
	// requests waited for peers' rate-limit windows and the 429s deferred;
	// a run logs how much of each was its own.
	rateWaitNS, deferrals atomic.Int64
	// failing: this process logged that the latest run fails (failing.go).
	failing atomic.Bool
}

// New checks o and builds a Backfiller.
func New(o Options) (*Backfiller, error) {
	switch {
	case o.DB == nil:
		return nil, errors.New("backfill: no database")
	case o.Applier == nil:
		return nil, errors.New("backfill: no applier")
	case o.Resolver == nil:
		return nil, errors.New("backfill: no DID resolver")
	case len(o.RelayEndpoints) == 0:
		return nil, errors.New("backfill: no relay endpoints")
	case o.RecordPageSize > 100:
		return nil, fmt.Errorf("backfill: record page size %d exceeds listRecords' limit of 100", o.RecordPageSize)
	}
	if o.Collections == nil {
		o.Collections = Collections
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
	if o.RelayPageSize <= 0 {
		o.RelayPageSize = relayPageSizeDefault
	}
	if o.RecordPageSize <= 0 {
		o.RecordPageSize = recordPageSizeDefault
	}
	if o.Metrics == nil {
		o.Metrics, _ = NewMetrics(nil) // unregistered: cannot fail
	}
	if o.HTTP == nil {
		o.HTTP = outbound.Guard{Purpose: "backfill"}.TrustURLs(o.RelayEndpoints...).Client(0)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.OnceRetryMin <= 0 {
		o.OnceRetryMin = onceRetryMinDefault
	}
	if o.OnceRetryMax < o.OnceRetryMin {
		o.OnceRetryMax = max(onceRetryMaxDefault, o.OnceRetryMin)
	}
	o.Retry = o.Retry.withDefaults()
	b := &Backfiller{o: o, log: o.Log.With().Str("worker", LeaseName).Logger()}
	b.skipLog = logval.Sampled(b.log, skipLogBurst, skipLogPeriod, "backfill request retried or deferred")
	limits := newRateLimits(o.Retry.PerHostConcurrency, time.Now)
	limits.maxHold = o.Retry.MaxRetryAfter
	limits.onHold = func(host string, asked, held time.Duration) {
		b.log.Info().Str("host", logval.String(host)).Int64("asked_ms", asked.Milliseconds()).Int64("held_ms", held.Milliseconds()).
			Msg("backfill holds requests to a host: its rate limit is spent until the reset (at most the longest wait honoured)")
	}
	b.xrpc = &xrpcClient{http: o.HTTP, policy: o.Retry, limits: limits,
		onRetry: func(err error, wait time.Duration) {
			o.Metrics.Errors.WithLabelValues(errorClass(err)).Inc()
			b.skipLog.Debug().Err(logval.Error(err)).Int64("retry_in_ms", wait.Milliseconds()).Msg("backfill request retried")
		},
		onDefer: func(host string, wait time.Duration) {
			b.deferrals.Add(1)
			o.Metrics.Errors.WithLabelValues(classRateLimited).Inc()
			o.Metrics.Deferred.WithLabelValues(host).Inc()
			b.skipLog.Info().Str("host", logval.String(host)).Int64("wait_ms", wait.Milliseconds()).Msg("backfill request deferred: the peer's rate limit is spent until its reset")
		},
		onWait: func(host string, waited time.Duration) {
			b.rateWaitNS.Add(int64(waited))
			o.Metrics.RateLimitWait.WithLabelValues(host).Add(waited.Seconds())
		},
		onAnswer: func(host string, status int) {
			code := "error"
			if status > 0 {
				code = strconv.Itoa(status)
			}
			o.Metrics.Requests.WithLabelValues(host, code).Inc()
		}}
	return b, nil
}

// errAllRelaysFailed marks a collection that no relay could list; the run
// goes on with the other collections and stays unfinished.
var errAllRelaysFailed = errors.New("every relay failed")

// Run is the backfill job for one grant of custody c. It resumes the
// latest unfinished run, or skips when a run completed less than
// RerunAfter ago, or starts a new run; then walks each collection (relay
// pages, then each listed DID's records on its PDS) and marks the run
// completed. Every write is fenced by c and every request carries ctx:
// when ctx ends, requests in flight are cancelled and Run returns only
// after every goroutine it started has returned, so nothing is written
// after it returns.
//
// Errors: ctx's error when custody ended; one wrapping
// fence.ErrSuperseded when custody was taken over; one wrapping
// errAllRelaysFailed when a collection could not be listed (the run stays
// unfinished for the next call to resume); a database error.
// An unresolvable DID or a broken PDS is not an error: it is recorded in
// the checkpoint, logged, counted and skipped.
func (b *Backfiller) Run(ctx context.Context, c fence.Custody) (err error) {
	started := time.Now()
	waitedBefore, deferralsBefore := b.rateWaitNS.Load(), b.deferrals.Load()
	outcome := runFailed
	defer func() {
		b.o.Metrics.Runs.WithLabelValues(outcome).Inc()
		b.o.Metrics.RunDuration.WithLabelValues(outcome).Observe(time.Since(started).Seconds())
	}()
	log := b.log.With().Str("lease", c.Lease).Int64("fence", c.Fence).Logger()

	var cl claim
	err = b.write(ctx, c, "claim", func(tx *sql.Tx) error {
		var err error
		cl, err = claimRun(ctx, tx, c.Fence, c.Holder, b.o.RerunAfter)
		return err
	})
	if err != nil {
		if outcome = interruption(ctx, err, outcome); outcome != runInterrupted {
			b.failed(ctx, c, 0, err, log)
		}
		return fmt.Errorf("backfill: %w", err)
	}
	if cl.skip {
		b.recovered()
		outcome = runSkipped
		log.Info().Int64("completed_ago_ms", cl.lastCompletedAgo.Milliseconds()).Int64("rerun_after_ms", b.o.RerunAfter.Milliseconds()).
			Msg("backfill skipped: a run completed recently")
		return nil
	}
	r := &run{b: b, custody: c, id: cl.runID, log: log.With().Int64("run", cl.runID).Logger(),
		brokenPDS: map[string]error{}, fallback: map[string]bool{}, collections: map[string][]string{}, noted: map[string]bool{}}
	r.log.Info().Bool("resumed", cl.resumed).Strs("collections", b.o.Collections).Msg("backfill run started")

	var incomplete []error
	for _, col := range b.o.Collections {
		if err := r.collection(ctx, col); err != nil {
			if !errors.Is(err, errAllRelaysFailed) {
				err = fmt.Errorf("backfill run %d: %w", r.id, err)
				if outcome = interruption(ctx, err, outcome); outcome == runInterrupted {
					level := zerolog.WarnLevel // custody lost
					if errors.Is(context.Cause(ctx), workers.ErrDrain) {
						level = zerolog.InfoLevel // this instance stopping gracefully
					}
					r.log.WithLevel(level).Err(logval.Error(err)).Str("collection", col).Msg("backfill run stopped; the next holder resumes it")
				} else {
					b.failed(ctx, c, r.id, err, r.log.With().Str("collection", col).Logger())
				}
				return err
			}
			// Said once for the whole attempt, by failed below.
			r.log.Debug().Err(logval.Error(err)).Str("collection", col).Msg("backfill could not list a collection")
			incomplete = append(incomplete, err)
		}
	}
	if len(incomplete) > 0 {
		outcome = runIncomplete
		// The first collection's error stands for the others: with no
		// relay answering, they differ only in the collection's name.
		err := fmt.Errorf("backfill run %d left unfinished: %d of %d collections could not be listed, the first: %w",
			r.id, len(incomplete), len(b.o.Collections), incomplete[0])
		b.failed(ctx, c, r.id, err, r.log)
		return err
	}
	err = b.write(ctx, c, "complete", func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, completeRunSQL, r.id, c.Fence)
		return err
	})
	if err != nil {
		err = fmt.Errorf("complete backfill run %d: %w", r.id, err)
		if outcome = interruption(ctx, err, outcome); outcome != runInterrupted {
			b.failed(ctx, c, r.id, err, r.log)
		}
		return err
	}
	outcome = runCompleted
	b.recovered()
	var done, failed, records, attempts int64
	if err := b.o.DB.QueryRowContext(ctx, runTotalsSQL, r.id).Scan(&done, &failed, &records, &attempts); err != nil {
		r.log.Warn().Err(logval.Error(err)).Msg("read backfill run totals")
	}
	r.log.Info().Int64("repos_done", done).Int64("repos_failed", failed).Int64("records", records).Int64("failed_attempts", attempts).
		Dur("took", time.Since(started)).
		Int64("rate_limit_wait_ms", time.Duration(b.rateWaitNS.Load()-waitedBefore).Milliseconds()).
		Int64("rate_limit_deferrals", b.deferrals.Load()-deferralsBefore).
		Msg("backfill run completed")
	return nil
}

// interruption classifies a run-ending error for the metrics.
func interruption(ctx context.Context, err error, otherwise string) string {
	if ctx.Err() != nil || errors.Is(err, fence.ErrSuperseded) || errors.Is(err, context.Canceled) {
		return runInterrupted
	}
	return otherwise
}

// fatal reports whether err must end the run (rather than skip a repo or a
// relay): custody ended or was lost, or the database failed.
func fatal(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, fence.ErrSuperseded) || errors.Is(err, context.Canceled)
}

// write runs fn in a transaction fenced by c and reports it to AfterWrite.
func (b *Backfiller) write(ctx context.Context, c fence.Custody, what string, fn func(tx *sql.Tx) error) error {
	if err := fence.Fenced(ctx, b.o.DB, c, fn); err != nil {
		return err
	}
	if b.o.AfterWrite != nil {
		b.o.AfterWrite(what)
	}
	return nil
}
