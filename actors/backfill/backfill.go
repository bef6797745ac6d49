package backfill

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
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
	DB       *sql.DB
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
		outcome = interruption(ctx, err, outcome)
		return fmt.Errorf("backfill: %w", err)
	}
	if cl.skip {
		outcome = runSkipped
		log.Info().Int64("completed_ago_ms", cl.lastCompletedAgo.Milliseconds()).Int64("rerun_after_ms", b.o.RerunAfter.Milliseconds()).
			Msg("backfill skipped: a run completed recently")
		return nil
	}
	r := &run{b: b, custody: c, id: cl.runID, log: log.With().Int64("run", cl.runID).Logger(),
		brokenPDS: map[string]error{}, fallback: map[string]bool{}, collections: map[string][]string{}}
	r.log.Info().Bool("resumed", cl.resumed).Strs("collections", b.o.Collections).Msg("backfill run started")

	var incomplete []error
	for _, col := range b.o.Collections {
		if err := r.collection(ctx, col); err != nil {
			if !errors.Is(err, errAllRelaysFailed) {
				outcome = interruption(ctx, err, outcome)
				r.log.Warn().Err(logval.Error(err)).Str("collection", col).Msg("backfill run stopped; the next holder resumes it")
				return fmt.Errorf("backfill run %d: %w", r.id, err)
			}
			r.log.Error().Err(logval.Error(err)).Str("collection", col).Msg("backfill could not list a collection")
			incomplete = append(incomplete, err)
		}
	}
	if len(incomplete) > 0 {
		outcome = runIncomplete
		return fmt.Errorf("backfill run %d left unfinished: %w", r.id, errors.Join(incomplete...))
	}
	err = b.write(ctx, c, "complete", func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, completeRunSQL, r.id, c.Fence)
		return err
	})
	if err != nil {
		outcome = interruption(ctx, err, outcome)
		return fmt.Errorf("complete backfill run %d: %w", r.id, err)
	}
	outcome = runCompleted
	var done, failed, records int64
	if err := b.o.DB.QueryRowContext(ctx, runTotalsSQL, r.id).Scan(&done, &failed, &records); err != nil {
		r.log.Warn().Err(logval.Error(err)).Msg("read backfill run totals")
	}
	r.log.Info().Int64("repos_done", done).Int64("repos_failed", failed).Int64("records", records).
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

// run is one backfill run in progress under one custody.
type run struct {
	b       *Backfiller
	custody fence.Custody
	id      int64
	log     zerolog.Logger

	mu sync.Mutex
	// brokenPDS remembers PDSes that failed without an answer or with 5xx
	// or 429 after retries, so their other repositories fail fast in this
	// run instead of each waiting out the retries.
	brokenPDS map[string]error
	// fallback marks relays found without listReposByCollection in this
	// run: they are walked with listRepos (walkAllRepos).
	fallback map[string]bool
	// collections caches describeRepo answers for this run (DID → its
	// collections), so the fallback asks each repository once, not once per
	// collection; bounded by describeCacheMax.
	collections map[string][]string
}

// describeCacheMax bounds the describeRepo cache of one run; past it the
// cache is emptied and repositories are asked again.
const describeCacheMax = 100_000

// listReposCursorPrefix marks a collection checkpoint whose relay cursor
// is a listRepos cursor (the fallback), so a resumed run goes on with the
// same method.
const listReposCursorPrefix = "listRepos:"

func (r *run) write(ctx context.Context, what string, fn func(tx *sql.Tx) error) error {
	return r.b.write(ctx, r.custody, what, fn)
}

// collection backfills one collection: the stored relay first (from its
// stored cursor), then the other relays in order, each from the start.
func (r *run) collection(ctx context.Context, col string) error {
	var st collectionState
	var done int
	err := r.b.o.DB.QueryRowContext(ctx, collectionSQL, r.id, col).Scan(&st.relay, &st.cursor, &done)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("read checkpoint of %s: %w", col, err)
	}
	if done != 0 {
		return nil
	}
	repos, err := r.repoStates(ctx, col)
	if err != nil {
		return err
	}
	relays := make([]string, 0, len(r.b.o.RelayEndpoints))
	for _, rel := range r.b.o.RelayEndpoints {
		if rel == st.relay {
			relays = append([]string{rel}, relays...)
		} else {
			relays = append(relays, rel)
		}
	}
	var errs []error
	for _, relay := range relays {
		cursor := ""
		if relay == st.relay {
			cursor = st.cursor
		} else if err := r.saveCollection(ctx, col, relay, "", false); err != nil {
			return err
		}
		err := r.walk(ctx, col, relay, cursor, repos)
		if err == nil {
			return r.saveCollection(ctx, col, relay, "", true)
		}
		var xe *xrpcError
		if fatal(ctx, err) || !errors.As(err, &xe) {
			return err
		}
		r.b.o.Metrics.Errors.WithLabelValues(classRelay).Inc()
		r.log.Warn().Err(logval.Error(err)).Str("collection", col).Str("relay", relay).Msg("relay failed; trying the next")
		errs = append(errs, err)
	}
	return fmt.Errorf("list %s: %w: %w", col, errAllRelaysFailed, errors.Join(errs...))
}

func (r *run) saveCollection(ctx context.Context, col, relay, cursor string, done bool) error {
	what := "relay_cursor"
	if done {
		what = "collection_done"
	}
	return r.write(ctx, what, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, saveCollectionSQL, r.id, col, relay, cursor, done)
		return err
	})
}

// repoSet is the checkpoint of every DID of one collection, kept current
// as DIDs finish.
type repoSet struct {
	mu     sync.Mutex
	states map[string]repoState
}

func (s *repoSet) get(did string) repoState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.states[did]
}

func (s *repoSet) set(did, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.states[did] = repoState{state: state}
}

func (r *run) repoStates(ctx context.Context, col string) (*repoSet, error) {
	rows, err := r.b.o.DB.QueryContext(ctx, repoStatesSQL, r.id, col)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint of %s repositories: %w", col, err)
	}
	defer rows.Close()
	set := &repoSet{states: map[string]repoState{}}
	for rows.Next() {
		var did string
		var st repoState
		if err := rows.Scan(&did, &st.state, &st.cursor); err != nil {
			return nil, fmt.Errorf("read checkpoint of %s repositories: %w", col, err)
		}
		set.states[did] = st
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read checkpoint of %s repositories: %w", col, err)
	}
	return set, nil
}

// walk pages through one relay's listing of col from cursor, backfilling
// each page's DIDs before checkpointing the next page's cursor.
//
// A relay without listReposByCollection (it answers 404, as Bluesky's relay
// does) is walked with listRepos instead (walkAllRepos).
func (r *run) walk(ctx context.Context, col, relay, cursor string, repos *repoSet) error {
	if rest, ok := strings.CutPrefix(cursor, listReposCursorPrefix); ok || r.usesFallback(relay) {
		return r.walkAllRepos(ctx, col, relay, rest, repos)
	}
	first := true
	trail := newCursorTrail(cursor)
	for {
		params := url.Values{"collection": {col}, "limit": {strconv.Itoa(r.b.o.RelayPageSize)}}
		if cursor != "" {
			params.Set("cursor", cursor)
		}
		var page reposPage
		if err := r.b.xrpc.get(ctx, relay, methodListRepos, params, &page); err != nil {
			if first && !fatal(ctx, err) && methodMissing(err) {
				r.setFallback(relay, err)
				return r.walkAllRepos(ctx, col, relay, "", repos)
			}
			if !fatal(ctx, err) {
				r.b.o.Metrics.Errors.WithLabelValues(errorClass(err)).Inc()
			}
			return err
		}
		if err := r.repos(ctx, col, page.Repos, repos); err != nil {
			return err
		}
		if page.Cursor == "" || len(page.Repos) == 0 {
			return nil
		}
		if !trail.add(page.Cursor) {
			return &xrpcError{method: methodListRepos, host: relay, class: classProtocol,
				message: cycleMessage("relay", page.Cursor)}
		}
		cursor, first = page.Cursor, false
		if err := r.saveCollection(ctx, col, relay, cursor, false); err != nil {
			return err
		}
	}
}

func (r *run) usesFallback(relay string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fallback[relay]
}

func (r *run) setFallback(relay string, why error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.fallback[relay] {
		r.fallback[relay] = true
		r.log.Info().Str("relay", relay).Str("why", why.Error()).
			Msg("relay has no listReposByCollection; listing every repository with listRepos and asking each PDS (describeRepo) which collections it has")
	}
}

// walkAllRepos is the fallback for a relay without listReposByCollection:
// it pages through com.atproto.sync.listRepos (which every relay and PDS
// serves) and backfills col for each listed repository that is active and
// whose PDS says (describeRepo) it has records in col. Repositories listed
// inactive (deactivated, taken down, suspended, deleted) are skipped: their
// PDS refuses to list their records (docs/interop.md, "Deactivated and
// taken-down accounts"). Its cursor is checkpointed with
// listReposCursorPrefix.
func (r *run) walkAllRepos(ctx context.Context, col, relay, cursor string, repos *repoSet) error {
	trail := newCursorTrail(cursor)
	for {
		params := url.Values{"limit": {strconv.Itoa(r.b.o.RelayPageSize)}}
		if cursor != "" {
			params.Set("cursor", cursor)
		}
		var page allReposPage
		if err := r.b.xrpc.get(ctx, relay, methodListAllRepos, params, &page); err != nil {
			if !fatal(ctx, err) {
				r.b.o.Metrics.Errors.WithLabelValues(errorClass(err)).Inc()
			}
			return err
		}
		refs := make([]repoRef, 0, len(page.Repos))
		for _, rp := range page.Repos {
			if rp.Active != nil && !*rp.Active {
				status := ""
				if rp.Status != nil {
					status = *rp.Status
				}
				r.b.skipLog.Debug().Str("did", rp.DID).Str("status", status).Msg("backfill skips an inactive repository")
				continue
			}
			refs = append(refs, repoRef{DID: rp.DID})
		}
		if err := r.reposFiltered(ctx, col, refs, repos, true); err != nil {
			return err
		}
		if page.Cursor == "" || len(page.Repos) == 0 {
			return nil
		}
		if !trail.add(page.Cursor) {
			return &xrpcError{method: methodListAllRepos, host: relay, class: classProtocol,
				message: cycleMessage("relay", page.Cursor)}
		}
		cursor = page.Cursor
		if err := r.saveCollection(ctx, col, relay, listReposCursorPrefix+cursor, false); err != nil {
			return err
		}
	}
}

// hasCollection asks did's PDS (describeRepo, cached for the run) whether
// the repository has records in col. A describeRepo the PDS cannot answer
// for a reason other than the repository itself (the reference PDS
// resolves the DID and handle to answer, and refuses with 400
// InvalidRequest "Could not resolve DID" when it cannot) is no reason to
// skip the repository: every collection is then listed, which costs one
// listRecords each.
func (r *run) hasCollection(ctx context.Context, pds, did, col string) (bool, error) {
	r.mu.Lock()
	cols, ok := r.collections[did]
	r.mu.Unlock()
	if !ok {
		var d describedRepo
		err := r.b.xrpc.get(ctx, pds, methodDescribeRepo, url.Values{"repo": {did}}, &d)
		switch {
		case err == nil:
			cols = d.Collections
		case !fatal(ctx, err) && describeUnanswered(err):
			r.b.skipLog.Debug().Err(logval.Error(err)).Str("did", logval.String(did)).Msg("describeRepo unanswered; listing every collection")
			cols = []string{allCollections}
		default:
			return false, err
		}
		r.mu.Lock()
		if len(r.collections) >= describeCacheMax {
			clear(r.collections)
		}
		r.collections[did] = cols
		r.mu.Unlock()
	}
	for _, c := range cols {
		if c == col || c == allCollections {
			return true, nil
		}
	}
	return false, nil
}

// inactiveRepo reports whether err is a PDS refusing a repository because
// its account is not active (deactivated, taken down, suspended) or is
// gone (atproto.Inactive). A RepoNotFound stays a failure here: the
// backfill found the repository listed by a relay.
func inactiveRepo(err error) bool {
	var xe *xrpcError
	if !errors.As(err, &xe) || xe.class != classClient || xe.code == "RepoNotFound" {
		return false
	}
	return atproto.RepoInactive(xe.code, xe.message)
}

// skipInactive checkpoints an inactive repository as done with no
// records, so neither this run nor a resumed one asks for it again, and
// counts it under appview_backfill_repos_total{outcome="inactive"}.
func (r *run) skipInactive(ctx context.Context, col, did string, repos *repoSet) error {
	err := r.write(ctx, "page", func(tx *sql.Tx) error {
		return r.checkpoint(ctx, tx, pageCheckpoint{col: col, did: did, state: repoDone, doneRepos: 1})
	})
	if err != nil {
		return err
	}
	repos.set(did, repoDone)
	r.b.o.Metrics.Repos.WithLabelValues(col, repoInactive).Inc()
	return nil
}

// allCollections marks a repository whose collections are unknown.
const allCollections = "*"

// describeUnanswered reports whether a describeRepo failure says nothing
// about the repository: a client error other than the repository being
// missing or not served.
func describeUnanswered(err error) bool {
	var xe *xrpcError
	if !errors.As(err, &xe) || xe.class != classClient {
		return false
	}
	switch xe.code {
	case "RepoNotFound", "RepoDeactivated", "RepoTakendown", "RepoSuspended":
		return false
	}
	return true
}

func (r *run) repos(ctx context.Context, col string, refs []repoRef, repos *repoSet) error {
	return r.reposFiltered(ctx, col, refs, repos, false)
}

// reposFiltered is repos; with describe, each DID's PDS is first asked
// whether the repository has records in col (the listRepos fallback).
func (r *run) reposFiltered(ctx context.Context, col string, refs []repoRef, repos *repoSet, describe bool) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan string)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for i := 0; i < r.b.o.Concurrency && i < len(refs); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for did := range work {
				if err := r.repo(wctx, col, did, repos, describe); err != nil {
					once.Do(func() { first = err; cancel() })
				}
			}
		}()
	}
	seen := make(map[string]bool, len(refs))
feed:
	for _, ref := range refs {
		if ref.DID == "" || seen[ref.DID] {
			continue
		}
		seen[ref.DID] = true
		if st := repos.get(ref.DID).state; st == repoDone || st == repoFailed {
			continue
		}
		select {
		case work <- ref.DID:
		case <-wctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// repo backfills one DID's records of col, page by page from its
// checkpointed cursor. A DID that does not resolve or whose PDS fails is
// recorded as failed and skipped (nil error).
//
// With describe, a repository whose PDS says it has no records in col is
// left alone: nothing is fetched or written for it.
func (r *run) repo(ctx context.Context, col, did string, repos *repoSet, describe bool) error {
	pds, err := r.b.o.Resolver.PDSEndpoint(ctx, did)
	if err != nil {
		if fatal(ctx, err) {
			return err
		}
		return r.failRepo(ctx, col, did, classResolve, err, repos)
	}
	if err := r.broken(pds); err != nil {
		return r.failRepo(ctx, col, did, "", fmt.Errorf("PDS %s failed earlier in this run: %w", pds, err), repos)
	}
	if describe {
		has, err := r.hasCollection(ctx, pds, did, col)
		if err != nil {
			return r.pdsFailed(ctx, pds, col, did, err, repos)
		}
		if !has {
			return nil
		}
	}
	cursor := repos.get(did).cursor
	trail := newCursorTrail(cursor)
	for {
		params := url.Values{"repo": {did}, "collection": {col}, "limit": {strconv.Itoa(r.b.o.RecordPageSize)}}
		if cursor != "" {
			params.Set("cursor", cursor)
		}
		var page recordsPage
		if err := r.b.xrpc.get(ctx, pds, methodListRecords, params, &page); err != nil {
			return r.pdsFailed(ctx, pds, col, did, err, repos)
		}
		if page.Cursor != "" && !trail.add(page.Cursor) {
			return r.failRepo(ctx, col, did, classProtocol,
				fmt.Errorf("%s on %s: %s", methodListRecords, pds, cycleMessage("PDS", page.Cursor)), repos)
		}
		last := page.Cursor == "" || len(page.Records) == 0
		if err := r.savePage(ctx, col, did, page, last); err != nil {
			return err
		}
		if last {
			repos.set(did, repoDone)
			r.b.o.Metrics.Repos.WithLabelValues(col, repoDone).Inc()
			return nil
		}
		cursor = page.Cursor
	}
}

// savePage applies one page of records and checkpoints the DID's cursor
// (and, on its last page, marks it done) in one fenced transaction.
//
// A page whose transaction fails for a reason of its records (isolable)
// would fail every resumed run at the same page, so it is applied again
// record by record (savePageByRecord) rather than stalling the backfill.
func (r *run) savePage(ctx context.Context, col, did string, page recordsPage, last bool) error {
	events, invalid := r.events(col, did, page.Records)
	cp := pageCheckpoint{col: col, did: did, state: repoRunning, cursor: page.Cursor, records: len(events)}
	if last {
		cp.state, cp.doneRepos = repoDone, 1
	}
	var applied Applied
	if pr, ok := r.b.o.Applier.(Preparer); ok && len(events) > 0 {
		ctx = pr.Prepare(ctx, events)
	}
	err := r.write(ctx, "page", func(tx *sql.Tx) error {
		var err error
		if len(events) > 0 {
			if applied, err = r.b.o.Applier.ApplyTx(ctx, tx, r.custody, events); err != nil {
				return fmt.Errorf("apply %d %s records of %s: %w", len(events), col, did, err)
			}
		}
		return r.checkpoint(ctx, tx, cp)
	})
	if err != nil && len(events) > 0 && isolable(ctx, err) {
		r.b.skipLog.Warn().Err(logval.Error(err)).Str("did", logval.String(did)).Str("collection", col).Int("records", len(events)).
			Msg("backfill page did not commit; applying its records one by one")
		applied, err = r.savePageByRecord(ctx, cp, events)
	}
	if err != nil {
		return err
	}
	m := r.b.o.Metrics
	m.Records.WithLabelValues(col, "applied").Add(float64(applied.Applied))
	m.Records.WithLabelValues(col, "skipped").Add(float64(applied.Skipped))
	if invalid > 0 {
		m.Records.WithLabelValues(col, "invalid").Add(float64(invalid))
		m.Errors.WithLabelValues(classInvalid).Add(float64(invalid))
	}
	return nil
}

// pageCheckpoint is what a committed page records for its DID and run.
type pageCheckpoint struct {
	col, did, state, cursor string
	// records is how many records of the page were handed to the applier;
	// doneRepos is 1 on the DID's last page.
	records, doneRepos int
}

func (r *run) checkpoint(ctx context.Context, tx *sql.Tx, cp pageCheckpoint) error {
	if _, err := tx.ExecContext(ctx, saveRepoPageSQL, r.id, cp.col, cp.did, cp.state, cp.cursor, cp.records); err != nil {
		return fmt.Errorf("checkpoint %s of %s: %w", cp.col, cp.did, err)
	}
	if _, err := tx.ExecContext(ctx, countRunSQL, r.id, cp.records, cp.doneRepos, 0); err != nil {
		return fmt.Errorf("count backfill run %d: %w", r.id, err)
	}
	return nil
}

// isolable reports whether a failed page is about its records, so applying
// them one by one can get past it: not the end of custody or ctx, not a
// failure of the database itself (processor.DatabaseFailure), which would
// fail every record too and must not cost us records.
func isolable(ctx context.Context, err error) bool {
	return !fatal(ctx, err) && !processor.DatabaseFailure(err)
}

// savePageByRecord applies a page whose single transaction failed one
// record at a time, each in its own fenced transaction. A record whose own
// transaction still fails is skipped: logged (sampled) and counted as a
// skipped record and a db_error. The checkpoint then commits alone, so the
// run moves past the page. It returns an error when custody or ctx ends,
// the database itself fails, or the checkpoint cannot be written.
func (r *run) savePageByRecord(ctx context.Context, cp pageCheckpoint, events []jetstream.Event) (Applied, error) {
	var total Applied
	for i := range events {
		var one Applied
		err := r.write(ctx, "record", func(tx *sql.Tx) error {
			var err error
			one, err = r.b.o.Applier.ApplyTx(ctx, tx, r.custody, events[i:i+1])
			return err
		})
		if err == nil {
			total.Applied += one.Applied
			total.Skipped += one.Skipped
			continue
		}
		if !isolable(ctx, err) {
			return total, fmt.Errorf("apply %s record %s of %s: %w", cp.col, events[i].Commit.RKey, cp.did, err)
		}
		total.Skipped++
		r.b.o.Metrics.Errors.WithLabelValues(classDatabase).Inc()
		r.b.skipLog.Error().Err(logval.Error(err)).Str("did", logval.String(cp.did)).Str("collection", cp.col).Str("rkey", logval.String(events[i].Commit.RKey)).
			Msg("backfill record skipped: the database refused it")
	}
	err := r.write(ctx, "page", func(tx *sql.Tx) error { return r.checkpoint(ctx, tx, cp) })
	return total, err
}

// events turns listRecords entries into synthetic Jetstream create events.
// TimeUS is the time the page was fetched. listRecords gives no rev, so
// the events carry none: the processor versions them by that time, below
// every rev (docs/ordering.md). A later read replaces an earlier one, and
// any live event, which carries its commit's rev, replaces both; a read
// never replaces or resurrects what a live event with a rev wrote or
// deleted.
// Entries whose uri is not at://DID/COL/RKEY of this repository and
// collection, or whose value is not a JSON object, are skipped and counted.
func (r *run) events(col, did string, records []recordRef) ([]jetstream.Event, int) {
	now := r.b.o.Now().UnixMicro()
	events := make([]jetstream.Event, 0, len(records))
	invalid := 0
	for _, rec := range records {
		rkey, err := rkeyOf(rec.URI, did, col)
		if err == nil && !isObject(rec.Value) {
			err = errors.New("value is not a JSON object")
		}
		if err != nil {
			invalid++
			r.b.skipLog.Warn().Err(logval.Error(err)).Str("did", logval.String(did)).Str("collection", col).Str("uri", logval.String(rec.URI)).
				Msg("backfill record skipped")
			continue
		}
		events = append(events, jetstream.Event{
			DID:    did,
			TimeUS: now,
			Kind:   jetstream.KindCommit,
			Commit: &jetstream.Commit{
				Operation:  jetstream.OpCreate,
				Collection: col,
				RKey:       rkey,
				Record:     rec.Value,
				CID:        rec.CID,
			},
		})
	}
	return events, invalid
}

// rkeyOf returns the record key of at://DID/COLLECTION/RKEY (AT-URI
// syntax as syntax.ParseATURI checks it), checking that the URI names
// this repository and collection.
func rkeyOf(uri, did, col string) (string, error) {
	u, err := syntax.ParseATURI(uri)
	switch {
	case err != nil || u.RecordKey() == "":
		return "", fmt.Errorf("record uri %q is not at://DID/COLLECTION/RKEY", uri)
	case u.Authority().String() != did:
		return "", fmt.Errorf("record uri %q is not in repository %s", uri, did)
	case u.Collection().String() != col:
		return "", fmt.Errorf("record uri %q is not in collection %s", uri, col)
	}
	return u.RecordKey().String(), nil
}

func isObject(v []byte) bool {
	v = bytes.TrimSpace(v)
	return len(v) > 0 && v[0] == '{'
}

// failRepo records a DID as failed (skipped) for col in this run, logs and
// counts it. Only a failed write is returned.
func (r *run) failRepo(ctx context.Context, col, did, class string, cause error, repos *repoSet) error {
	err := r.write(ctx, "repo_failed", func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, failRepoSQL, r.id, col, did, cause.Error()); err != nil {
			return fmt.Errorf("checkpoint failed %s of %s: %w", col, did, err)
		}
		if _, err := tx.ExecContext(ctx, countRunSQL, r.id, 0, 0, 1); err != nil {
			return fmt.Errorf("count backfill run %d: %w", r.id, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	repos.set(did, repoFailed)
	r.b.o.Metrics.Repos.WithLabelValues(col, repoFailed).Inc()
	if class != "" {
		r.b.o.Metrics.Errors.WithLabelValues(class).Inc()
	}
	r.b.skipLog.Warn().Err(logval.Error(cause)).Str("did", logval.String(did)).Str("collection", col).Str("class", class).
		Msg("backfill skipped a repository")
	return nil
}

func (r *run) broken(pds string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.brokenPDS[pds]
}

func (r *run) markBroken(pds string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.brokenPDS[pds]; !ok {
		r.brokenPDS[pds] = err
		r.log.Warn().Err(logval.Error(err)).Str("pds", logval.String(pds)).Msg("PDS failed; skipping its other repositories in this run")
	}
}

// pdsFailed settles a PDS request for did's col that failed with err: a
// stop or database failure is returned as is; a repository the PDS refuses
// as inactive is skipped, not failed (docs/interop.md, "Deactivated and
// taken-down accounts"); anything else fails the repository with its
// class, and a network, server or rate-limit failure marks the PDS broken
// for the rest of the run.
func (r *run) pdsFailed(ctx context.Context, pds, col, did string, err error, repos *repoSet) error {
	if fatal(ctx, err) {
		return err
	}
	if inactiveRepo(err) {
		return r.skipInactive(ctx, col, did, repos)
	}
	class := errorClass(err)
	if class == classNetwork || class == classServer || class == classRateLimited {
		r.markBroken(pds, err)
	}
	return r.failRepo(ctx, col, did, class, err, repos)
}
