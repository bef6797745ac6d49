package consumer

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/processor"
)

// Re-read limits.
const (
	// resyncTimeout bounds one repository's re-read (every request).
	resyncTimeout = 2 * time.Minute
	// resyncPageLimit is listRecords' page size (its maximum).
	resyncPageLimit = 100
	// resyncMaxPages bounds the pages read per collection, so a hostile
	// PDS cannot page forever (10,000 records of one collection).
	resyncMaxPages = 100
	// resyncMaxAttempts: a repository that failed this many re-reads is
	// dropped from the queue (logged, counted as dropped).
	resyncMaxAttempts = 8
	// resyncRetryMin and resyncRetryMax bound the delay before a failed
	// re-read is tried again (doubling per attempt).
	resyncRetryMin = 30 * time.Second
	resyncRetryMax = time.Hour
	// maxResponseBytes bounds one XRPC response body.
	maxResponseBytes = 16 << 20
)

// Re-read outcomes: the outcome label of appview_consumer_resyncs_total.
const (
	resyncOK       = "ok"
	resyncFailed   = "failed"   // retried later
	resyncDropped  = "dropped"  // gave up after resyncMaxAttempts
	resyncInactive = "inactive" // the PDS serves no records of the account: nothing to re-read
)

// errRepoInactive marks a PDS refusing a repository because its account
// is deactivated, taken down, suspended or gone: RepoDeactivated,
// RepoTakendown, RepoSuspended or RepoNotFound (com.atproto.sync), or the
// reference PDS's 400 InvalidRequest "Could not find repo" from
// listRecords. Retrying would get the same answer; the rows held for the
// account stay as they are (its #account events decide what readers see).
var errRepoInactive = errors.New("the account's repository is not served (inactive or gone)")

// resyncCollections are the collections a re-read lists: every one the
// processor indexes (LEXICONS.md), with the query that lists the rkeys the
// database holds for a repository, so a record that vanished upstream is
// removed.
var resyncCollections = []struct {
	nsid  string
	rkeys string
}{
	{processor.CollectionManifest, `SELECT ` + database.Text("rkey") + ` FROM manifests WHERE did = ?1`},
	{processor.CollectionTag, `SELECT ` + database.Text("rkey") + ` FROM tags WHERE did = ?1
UNION SELECT ` + database.Text("rkey") + ` FROM pending_tags WHERE did = ?1`},
	{processor.CollectionStar, `SELECT ` + database.Text("rkey") + ` FROM stars WHERE did = ?1`},
	{processor.CollectionRepoPage, `SELECT ` + database.Text("rkey") + ` FROM repo_pages WHERE did = ?1`},
	{processor.CollectionCaptain, `SELECT 'self' FROM hold_captains WHERE hold_did = ?1`},
	{processor.CollectionCrew, `SELECT ` + database.Text("rkey") + ` FROM hold_crew WHERE hold_did = ?1`},
	{processor.CollectionStats, `SELECT ` + database.Text("rkey") + ` FROM repository_hold_stats WHERE hold_did = ?1`},
	// A profile is a single "self" record in users; a vanished one is
	// left as it is (the account's row is not the record's to remove).
	{processor.CollectionProfile, ``},
}

// PDSResolver finds a DID's PDS (identity.Resolver).
type PDSResolver interface {
	PDSEndpoint(ctx context.Context, did string) (string, error)
}

// Resyncer drains repo_resyncs: for each queued repository, at most one
// per interval, it resolves the DID to its PDS, reads the repository's
// latest rev (com.atproto.sync.getLatestCommit) and every io.atcr.* record
// (com.atproto.repo.listRecords), and in ONE fenced transaction applies
// them as creates, deletes the records the database holds that the PDS no
// longer lists, records the rev, and removes the queue row. A failure is
// retried later with backoff. Build one per process; it runs while the
// consumer holds custody.
type Resyncer struct {
	DB        *database.DB
	Resolver  PDSResolver
	Processor *processor.Processor
	HTTP      *http.Client
	Interval  time.Duration
	Log       zerolog.Logger
	Metrics   *ResyncMetrics

	kick chan struct{}
}

// NewResyncer builds a Resyncer; interval spaces re-reads.
func NewResyncer(db *database.DB, r PDSResolver, p *processor.Processor, interval time.Duration, log zerolog.Logger, m *ResyncMetrics) *Resyncer {
	return &Resyncer{DB: db, Resolver: r, Processor: p, HTTP: &http.Client{Timeout: resyncTimeout}, Interval: interval,
		Log: log.With().Str("component", "resync").Logger(), Metrics: m, kick: make(chan struct{}, 1)}
}

// Kick wakes the loop (a #sync was just queued).
func (r *Resyncer) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run re-reads queued repositories under custody c until stop closes,
// one per Interval at most.
func (r *Resyncer) Run(stop <-chan struct{}, c fence.Custody) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	idle := max(r.Interval, 5*time.Second)
	for {
		did, found, err := r.next(ctx)
		wait := r.Interval
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.Log.Warn().Err(err).Msg("re-read queue not readable")
			wait = idle
		case !found:
			wait = idle
		default:
			if err := r.one(ctx, c, did); errors.Is(err, fence.ErrSuperseded) {
				return
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-r.kick:
			t.Stop()
			if wait != idle {
				// Keep the pace: a kick only ends an idle wait.
				t = time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
		case <-t.C:
		}
	}
}

// next is the queued repository due first, if any is due: a #sync and a
// lifecycle event of a known account first, then the first events of
// accounts new to this index, then the mass re-read after a Jetstream gap
// (resyncRank), so a #sync is not held behind every repository held here.
func (r *Resyncer) next(ctx context.Context) (string, bool, error) {
	var did string
	var queued int64
	err := r.DB.QueryRowContext(ctx, `SELECT `+database.Text("did")+`, (SELECT COUNT(*) FROM repo_resyncs) FROM repo_resyncs
WHERE next_at <= `+database.NowMS+` ORDER BY `+resyncRank("reason")+`, next_at LIMIT 1`).Scan(&did, &queued)
	if errors.Is(err, sql.ErrNoRows) {
		r.Metrics.queued(0)
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read re-read queue: %w", err)
	}
	r.Metrics.queued(queued)
	return did, true, nil
}

// one re-reads did and records the outcome.
func (r *Resyncer) one(ctx context.Context, c fence.Custody, did string) error {
	ctx, cancel := context.WithTimeout(ctx, resyncTimeout)
	defer cancel()
	// What the queue row and the users row say before the PDS is asked: a
	// request or an #account event that comes in meanwhile is newer than
	// this read, and wins.
	var requested int64
	if err := r.DB.QueryRowContext(ctx, `SELECT requested_at FROM repo_resyncs WHERE did = ?1`, did).Scan(&requested); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("read re-read request: %w", err)
	}
	before, err := r.readUser(ctx, did)
	if err != nil {
		return err
	}
	applied, removed, err := r.reread(ctx, c, did, requested)
	if err == nil {
		var lag time.Duration
		if requested > 0 {
			lag = time.Since(time.UnixMilli(requested))
		}
		r.Metrics.done(resyncOK, lag)
		r.Log.Info().Str("did", did).Int("records", applied).Int("removed", removed).Msg("repository re-read")
		return nil
	}
	if errors.Is(err, fence.ErrSuperseded) || ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return err
	}
	if errors.Is(err, errRepoInactive) {
		return r.inactive(c, did, requested, before, err)
	}
	// Bounded, cut at whole characters, and a peer's NUL kept readable.
	msg := database.Diagnostic(logval.String(err.Error()))
	var attempts int64
	ferr := r.write(context.Background(), c, func(tx *sql.Tx) error {
		err := tx.QueryRow(`SELECT attempts + 1 FROM repo_resyncs WHERE did = ?1 AND requested_at = ?2`, did, requested).Scan(&attempts)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return nil // asked for again meanwhile: due now, as asked
		case err != nil:
			return err
		case attempts >= resyncMaxAttempts:
			_, err := tx.Exec(`DELETE FROM repo_resyncs WHERE did = ?1`, did)
			return err
		}
		delay := min(resyncRetryMax, resyncRetryMin<<(attempts-1))
		_, err = tx.Exec(`UPDATE repo_resyncs SET attempts = ?2, last_error = ?3, next_at = `+database.NowMS+` + ?4 WHERE did = ?1`,
			did, attempts, msg, delay.Milliseconds())
		return err
	})
	if ferr != nil {
		r.Log.Warn().Err(ferr).Str("did", did).Msg("re-read failure not recorded")
		return ferr
	}
	outcome := resyncFailed
	if attempts >= resyncMaxAttempts {
		outcome = resyncDropped
	}
	r.Metrics.done(outcome, 0)
	r.Log.Warn().Str("did", did).Int64("attempt", attempts).Str("outcome", outcome).Str("error", msg).Msg("repository re-read failed")
	return nil
}

// inactive settles a re-read the PDS refused as inactive (err): in one
// fenced transaction the users row takes the status the refusal names
// (statusEvents), the repository is noted as one this index may hold
// incompletely (repo_incomplete: the #account event that makes it active
// again re-reads it), and the request leaves the queue. The rows held for
// the account stay as they are.
func (r *Resyncer) inactive(c fence.Custody, did string, requested int64, before userState, cause error) error {
	ctx := context.Background()
	status := statusEvents(did, before, refusedStatus(cause))
	err := r.write(ctx, c, func(tx *sql.Tx) error {
		if len(status) > 0 {
			if _, err := r.Processor.ApplyTx(ctx, tx, c, status); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(noteIncompleteSQL, did, incompleteResync); err != nil {
			return fmt.Errorf("note %s incomplete: %w", did, err)
		}
		_, err := tx.Exec(`DELETE FROM repo_resyncs WHERE did = ?1 AND requested_at = ?2`, did, requested)
		return err
	})
	if err != nil {
		r.Log.Warn().Err(err).Str("did", did).Msg("re-read of an inactive repository not dequeued")
		return err
	}
	r.Metrics.done(resyncInactive, 0)
	r.Log.Info().Str("did", did).Str("error", bounded(cause.Error())).Msg("repository not re-read: its PDS does not serve it (inactive or gone)")
	return nil
}

// reread fetches did's records and applies them, and dequeues the request
// made at requested; it returns the records applied and removed.
func (r *Resyncer) reread(ctx context.Context, c fence.Custody, did string, requested int64) (applied, removed int, err error) {
	pds, err := r.Resolver.PDSEndpoint(ctx, did)
	if err != nil {
		return 0, 0, err // the log line names the DID; Resolve says it too
	}
	var latest struct {
		Rev string `json:"rev"`
	}
	if err := r.get(ctx, pds, "com.atproto.sync.getLatestCommit", url.Values{"did": {did}}, &latest); err != nil {
		return 0, 0, err
	}
	rev, err := syntax.ParseTID(latest.Rev)
	if err != nil {
		return 0, 0, fmt.Errorf("getLatestCommit of %s: rev %q is not a TID", did, bounded(latest.Rev))
	}
	now := time.Now().UnixMicro()
	if futureRev(rev, now) {
		// Recorded (and carried by the records as their rev), it would
		// make the repository's later commits stale until that time.
		return 0, 0, fmt.Errorf("getLatestCommit of %s: rev %q lies more than %s in the future", did, latest.Rev, futureRevTolerance)
	}
	has, err := r.describeCollections(ctx, pds, did)
	if err != nil {
		return 0, 0, err
	}
	var held map[string]bool
	if has != nil {
		if held, err = r.heldCollections(ctx, did); err != nil {
			return 0, 0, err
		}
	}
	listed := map[string]map[string]bool{}
	var events []jetstream.Event
	for _, col := range resyncCollections {
		listed[col.nsid] = map[string]bool{}
		if has != nil && !has[col.nsid] && !held[col.nsid] {
			continue // none on the PDS, none here
		}
		cursor := ""
		for page := 0; ; page++ {
			if page == resyncMaxPages {
				return 0, 0, fmt.Errorf("listRecords %s %s: more than %d pages", did, col.nsid, resyncMaxPages)
			}
			var out struct {
				Cursor  string `json:"cursor"`
				Records []struct {
					URI   string          `json:"uri"`
					CID   string          `json:"cid"`
					Value json.RawMessage `json:"value"`
				} `json:"records"`
			}
			q := url.Values{"repo": {did}, "collection": {col.nsid}, "limit": {fmt.Sprint(resyncPageLimit)}}
			if cursor != "" {
				q.Set("cursor", cursor)
			}
			if err := r.get(ctx, pds, "com.atproto.repo.listRecords", q, &out); err != nil {
				return 0, 0, err
			}
			for _, rec := range out.Records {
				prefix := "at://" + did + "/" + col.nsid + "/"
				rkey, ok := strings.CutPrefix(rec.URI, prefix)
				if !ok || rkey == "" || strings.Contains(rkey, "/") {
					continue // not a record of this repository and collection
				}
				listed[col.nsid][rkey] = true
				events = append(events, jetstream.Event{DID: did, TimeUS: now, Kind: jetstream.KindCommit,
					// An update: the record may have changed in any way since
					// the version the index holds (processor: mayMove).
					Commit: &jetstream.Commit{Rev: latest.Rev, Operation: jetstream.OpUpdate, Collection: col.nsid, RKey: rkey, CID: rec.CID, Record: rec.Value}})
			}
			if out.Cursor == "" || len(out.Records) == 0 || out.Cursor == cursor {
				break
			}
			cursor = out.Cursor
		}
	}
	// The handle (and PDS) of a users row the records create, verified
	// before the write lock is taken, as for the live stream.
	pctx := r.Processor.PrepareBatch(ctx, r.DB, events)
	err = r.write(ctx, c, func(tx *sql.Tx) error {
		applied, removed = 0, 0
		var deletes []jetstream.Event
		for _, col := range resyncCollections {
			if col.rkeys == "" {
				continue
			}
			have, err := database.Column(ctx, tx, col.rkeys, did)
			if err != nil {
				return fmt.Errorf("list stored %s of %s: %w", col.nsid, did, err)
			}
			for _, rkey := range have {
				if !listed[col.nsid][rkey] {
					deletes = append(deletes, jetstream.Event{DID: did, TimeUS: now, Kind: jetstream.KindCommit,
						Commit: &jetstream.Commit{Rev: latest.Rev, Operation: jetstream.OpDelete, Collection: col.nsid, RKey: rkey}})
				}
			}
		}
		all := append(events, deletes...)
		if _, err := r.Processor.ApplyTx(pctx, tx, c, all); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, recordRevsSQL, did, latest.Rev); err != nil {
			return fmt.Errorf("record rev of %s: %w", did, err)
		}
		// Read in full from the PDS its DID document names now.
		if _, err := tx.ExecContext(ctx, `DELETE FROM repo_incomplete WHERE did = ?1`, did); err != nil {
			return fmt.Errorf("note %s complete: %w", did, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE users SET pds = ?2 WHERE did = ?1 AND pds <> ?2`, did, pds); err != nil {
			return fmt.Errorf("record the PDS of %s: %w", did, err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM repo_resyncs WHERE did = ?1 AND requested_at = ?2`, did, requested); err != nil {
			return fmt.Errorf("dequeue re-read of %s: %w", did, err)
		}
		applied, removed = len(events), len(deletes)
		return nil
	})
	return applied, removed, err
}

// write runs fn in a transaction that commits only under custody c: the
// re-reader's one call of fence.Fenced.
func (r *Resyncer) write(ctx context.Context, c fence.Custody, fn func(tx *sql.Tx) error) error {
	return fence.Fenced(ctx, r.DB, c, fn)
}

// get calls an XRPC query on base and decodes its JSON answer into out.
func (r *Resyncer) get(ctx context.Context, base, method string, q url.Values, out any) error {
	target := strings.TrimRight(base, "/") + "/xrpc/" + method + "?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	resp, err := r.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("%s: HTTP %d: %s", method, resp.StatusCode, bounded(string(body)))
		if resp.StatusCode == http.StatusBadRequest {
			if ref := inactiveAnswer(body); ref != nil {
				err = fmt.Errorf("%w: %w: %w", errRepoInactive, ref, err)
			}
		}
		return err
	}
	if len(body) > maxResponseBytes {
		return fmt.Errorf("%s: answer larger than %d bytes", method, maxResponseBytes)
	}
	if err := atproto.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	return nil
}

// inactiveAnswer is the refusal of an XRPC error body that says the
// repository is not served because of its account's state (see
// errRepoInactive), nil for any other.
func inactiveAnswer(body []byte) *refusal {
	var xe struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &xe) != nil || !atproto.RepoInactive(xe.Error, xe.Message) {
		return nil
	}
	return &refusal{code: xe.Error, message: bounded(xe.Message)}
}

// bounded bounds a value a peer chose (a rev, an HTTP body) before it is
// quoted in an error: logval.String, so it keeps both ends and never
// splits a UTF-8 character.
func bounded(s string) string { return logval.String(s) }

// ResyncMetrics are the re-read collectors.
type ResyncMetrics struct {
	outcomes *prometheus.CounterVec
	lag      prometheus.Histogram
	queue    prometheus.Gauge
}

// NewResyncMetrics registers appview_consumer_resyncs_total{outcome}
// (ok, failed, dropped, inactive), appview_consumer_resync_lag_seconds (request to
// completion of a successful re-read) and appview_consumer_resync_queue
// (repositories queued).
func NewResyncMetrics(reg prometheus.Registerer) (*ResyncMetrics, error) {
	m := &ResyncMetrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_consumer_resyncs_total", Help: "Repository re-reads from their PDS (after #sync or a Jetstream gap), by outcome (ok, failed, dropped, inactive).",
		}, []string{"outcome"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "appview_consumer_resync_lag_seconds", Help: "Time from a re-read's request to its completion, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 16),
		}),
		queue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "appview_consumer_resync_queue", Help: "Repositories queued for a re-read.",
		}),
	}
	for _, o := range []string{resyncOK, resyncFailed, resyncDropped, resyncInactive} {
		m.outcomes.WithLabelValues(o)
	}
	for _, col := range []prometheus.Collector{m.outcomes, m.lag, m.queue} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("register resync metrics: %w", err)
		}
	}
	return m, nil
}

func (m *ResyncMetrics) done(outcome string, lag time.Duration) {
	if m == nil {
		return
	}
	m.outcomes.WithLabelValues(outcome).Inc()
	if outcome == resyncOK {
		m.lag.Observe(lag.Seconds())
	}
}

func (m *ResyncMetrics) queued(n int64) {
	if m != nil {
		m.queue.Set(float64(n))
	}
}
