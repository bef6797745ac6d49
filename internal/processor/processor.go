package processor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
)

// Skip reasons: the "reason" label of appview_processor_skipped_total and
// the keys of Result.Skipped.
const (
	// ReasonNotATCR: a commit outside io.atcr.* (skipped silently).
	ReasonNotATCR = "not_atcr"
	// ReasonUnknownCollection: an io.atcr.* NSID this processor does not index.
	ReasonUnknownCollection = "unknown_collection"
	// ReasonMalformedEvent: the event itself is unusable (no commit body,
	// unknown kind or operation, no DID, rkey or time_us).
	ReasonMalformedEvent = "malformed_event"
	// ReasonMalformedRecord: the record is not JSON of the lexicon's shape.
	ReasonMalformedRecord = "malformed_record"
	// ReasonMissingField: a field the lexicon requires is absent or empty.
	ReasonMissingField = "missing_field"
	// ReasonTooLong: a string is over the lexicon's maxLength, or an array
	// or object has more than MaxContainerLen elements.
	ReasonTooLong = "too_long"
	// ReasonBadValue: a field has the wrong format (DID, datetime, at-uri,
	// record key), a count outside [0, MaxSafeInteger] or another integer
	// outside the AT Protocol data model's ±MaxSafeInteger, or a key field
	// (repository, digest, tag, DID, rkey) holding a NUL or invalid UTF-8.
	ReasonBadValue = "bad_value"
	// ReasonUnresolvedManifest: an io.atcr.tag without manifestDigest whose
	// manifest at-uri names a manifest record that was deleted (one not
	// stored yet is waited for: pending_tags).
	ReasonUnresolvedManifest = "unresolved_manifest"
	// ReasonDatabase: the database refused the event's writes (e.g. a
	// constraint); they were undone with it (its savepoint rolled back,
	// or, refused at its first write, the statement itself).
	ReasonDatabase = "db_error"
)

// Outcomes: the "outcome" label of appview_processor_events_total.
const (
	// OutcomeApplied: the event changed the database.
	OutcomeApplied = "applied"
	// OutcomeUnchanged: the database already reflected the event or
	// something newer (a replay, an older version of the record, a create
	// not newer than the record's delete).
	OutcomeUnchanged = "unchanged"
	// OutcomeSkipped: the event was not applied (see the skip reasons).
	OutcomeSkipped = "skipped"
)

// HoldStat is one hold's own absolute counts for one repository, from an
// io.atcr.hold.stats record in the hold's repo (docs/lexicons.md).
type HoldStat struct {
	// HoldDID is the hold that reports the counts (the event's DID).
	HoldDID string
	// OwnerDID and Repository name the repository counted.
	OwnerDID, Repository string
	// RKey is the record key in the hold's repo.
	RKey                 string
	PullCount, PushCount int64
	// LastPull and LastPush are Unix ms, nil when the record has none.
	LastPull, LastPush *int64
	// UpdatedAt is the record's updatedAt in Unix ms (data only: it does
	// not order updates, Version does).
	UpdatedAt int64
	// SourceUS is the Jetstream time_us of the event that carried it (data).
	SourceUS int64
	// Version is the version of the event that wrote the row: the hold
	// repo's rev, or NoRevVersion for an event without one. A newer version
	// from the same hold replaces the hold's numbers; an equal or older one
	// is ignored. Versions compare as strings.
	Version string
	// Deleted means the hold deleted the record: it no longer reports the
	// repository. The counts are those of the removed row.
	Deleted bool
}

// NewManifest is a manifest stored for the first time as (OwnerDID,
// Repository, Digest): a webhook "push" trigger.
type NewManifest struct {
	OwnerDID, Repository, Digest, MediaType string
	HoldDID, HoldEndpoint                   string
	// PushedAt is the record's createdAt, Unix ms.
	PushedAt int64
}

// EventKey is "push:<did>/<repository>@<digest>", stable across replays
// (the webhook_deliveries de-duplication key, docs/spec.md §9).
func (m NewManifest) EventKey() string {
	return "push:" + m.OwnerDID + "/" + m.Repository + "@" + m.Digest
}

// Result reports what one batch did.
type Result struct {
	// Events is the number of events in the batch.
	Events int
	// Applied counts events that changed the database.
	Applied int
	// Unchanged counts events the database already reflected.
	Unchanged int
	// Skipped counts events not applied, by skip reason (Reason*).
	Skipped map[string]int
	// HoldStats are the per-hold stats rows the batch changed, in event
	// order (for the StatsCache's warm view).
	HoldStats []HoldStat
	// NewManifests are the manifests the batch stored for the first time,
	// in event order (for webhook "push" deliveries).
	NewManifests []NewManifest
	// MaxTimeUS is the largest time_us in the batch (0 for an empty batch):
	// the cursor once the batch is committed.
	MaxTimeUS int64
	// Rereads are the repositories the batch's #account and #identity
	// events ask to be re-read from their PDS, in event order (users.go):
	// the consumer queues them in the same transaction.
	Rereads []Reread
}

// Reread asks for a re-read of one repository after a lifecycle event.
type Reread struct {
	DID string
	// Why is one of the Reread* reasons.
	Why string
}

// Why a lifecycle event asks for a re-read (Reread.Why; the consumer's
// repo_resyncs.reason).
const (
	// RereadAccount: an #account event made the account active where this
	// index may hold it incompletely (its row was inactive, or a backfill
	// or re-read could not read it: repo_incomplete).
	RereadAccount = "account"
	// RereadIdentity: an #identity event named another PDS than the row
	// had (the repository moved), or came for a repository this index may
	// hold incompletely.
	RereadIdentity = "identity"
	// RereadFirst: the first event of a DID with no users row (an
	// #identity event, or an #account event making it active): whatever
	// the account holds, this index has none of it.
	RereadFirst = "first-event"
)

// SkippedTotal is the number of skipped events over all reasons.
func (r Result) SkippedTotal() int {
	n := 0
	for _, v := range r.Skipped {
		n += v
	}
	return n
}

func (r *Result) skip(reason string) {
	if r.Skipped == nil {
		r.Skipped = map[string]int{}
	}
	r.Skipped[reason]++
}

// Options configures a Processor.
type Options struct {
	// Log receives invalid-record warnings (sampled) and database errors.
	Log zerolog.Logger
	// Metrics may be nil (no metrics).
	Metrics *Metrics
	// LogBurst is how many skipped-event lines of each skip reason are
	// logged per LogPeriod before the rest are held back (and counted in
	// a later line, see logval.Sampled); 0 means 10 per minute.
	LogBurst  uint32
	LogPeriod time.Duration
	// Handles verifies handles for PrepareBatch (the process's shared
	// *identity.Resolver); nil keeps the handle an #identity event carries.
	Handles HandleResolver
}

// Processor turns Jetstream events into registry rows. It holds no state
// between batches but a bounded set of DIDs known to have a users row
// (PrepareBatch's shortcut), so one Processor may serve the consumer and
// the backfill at once.
type Processor struct {
	log zerolog.Logger
	// burst and period limit the skip lines of each reason (and the
	// lookup failures), see skipLog.
	burst  uint32
	period time.Duration
	// skipLogs are the sampled loggers of skipped events, one per skip
	// reason (logval.Sampled): a flood of one reason must not hide the
	// others, and each says how many of its lines it held back.
	skipLogsMu sync.Mutex
	skipLogs   map[string]zerolog.Logger
	// lookups logs PrepareBatch's failed handle lookups, sampled apart
	// from the skipped events: a directory outage must not use up the
	// burst that reports invalid records.
	lookups zerolog.Logger
	metrics *Metrics
	handles HandleResolver

	knownMu sync.Mutex
	known   map[string]bool
	// refreshes are the DIDs whose handle PrepareBatch refreshed, with
	// when (bounded like known).
	refreshes map[string]refreshMark
}

// New returns a Processor.
func New(o Options) *Processor {
	burst, period := o.LogBurst, o.LogPeriod
	if burst == 0 {
		burst = 10
	}
	if period <= 0 {
		period = time.Minute
	}
	l := o.Log.With().Str("component", "processor").Logger()
	return &Processor{
		log:      l,
		burst:    burst,
		period:   period,
		skipLogs: map[string]zerolog.Logger{},
		lookups:  logval.Sampled(l, burst, period, "handle not verified, or users not read before resolving handles"),
		metrics:  o.Metrics,
		handles:  o.Handles,
	}
}

// skipLog returns the sampled logger of the skipped events of reason.
func (p *Processor) skipLog(reason string) *zerolog.Logger {
	p.skipLogsMu.Lock()
	defer p.skipLogsMu.Unlock()
	l, ok := p.skipLogs[reason]
	if !ok {
		l = logval.Sampled(p.log, p.burst, p.period, "event skipped ("+reason+")")
		p.skipLogs[reason] = l
	}
	return &l
}

// Apply is the one-shot form for callers that have nothing else to commit
// with the events (the backfill): it applies events in one transaction
// through fence.Fenced, so it commits only while c is the current custody.
// The transaction first runs without savepoints (BeginBareTx); if an event
// fails there, it is rolled back and run again isolating each event
// (BeginTx). Errors wrap fence.ErrSuperseded when custody was lost; see
// ApplyTx for the rest.
func (p *Processor) Apply(ctx context.Context, db *database.DB, c fence.Custody, events []jetstream.Event) (Result, error) {
	var (
		res Result
		s   *TxSession
	)
	err := Redo(func(bare bool) error {
		return fence.Fenced(ctx, db, c, func(tx *sql.Tx) error {
			s = p.begin(ctx, tx, c, bare)
			var err error
			if res, err = s.Apply(events); err != nil {
				return err
			}
			return s.Finish()
		})
	})
	if err != nil {
		return Result{}, err
	}
	s.Committed()
	return res, nil
}

// ErrRedo is wrapped by the error of a bare session's Apply (BeginBareTx)
// when one of the events failed after it had changed a row (a value the
// database refused in its second statement, say). The transaction then
// holds part of what that event wrote: the caller must
// roll it back whole and apply the same events again in a session begun
// with BeginTx, which rolls the failing event back alone (Redo does both).
var ErrRedo = errors.New("an event failed in a transaction without savepoints: roll it back and apply the events again with BeginTx")

// redoError is ErrRedo for the event at timeUS, failing with err.
type redoError struct {
	timeUS int64
	err    error
}

func (e *redoError) Error() string {
	return fmt.Sprintf("%v (event time_us=%d: %v)", ErrRedo, e.timeUS, e.err)
}

func (e *redoError) Is(target error) bool { return target == ErrRedo }

// Redo runs attempt(true) (a transaction whose sessions are begun with
// BeginBareTx) and, if it fails with ErrRedo, attempt(false) (the same
// transaction with BeginTx). Other errors are returned as they are.
func Redo(attempt func(bare bool) error) error {
	err := attempt(true)
	if errors.Is(err, ErrRedo) {
		err = attempt(false)
	}
	return err
}

// ApplyTx applies events, in order, inside tx: the caller's fence.Fenced
// transaction under c, so the caller can commit other effects (webhook
// deliveries, the cursor, a backfill checkpoint) atomically with the
// records. c.Fence is stamped on the repository_stats rows the batch
// writes. ApplyTx never commits or rolls back tx. It is BeginTx, one
// TxSession.Apply, TxSession.Finish and TxSession.Committed (so its
// outcomes are counted before the caller's commit); errors are theirs.
func (p *Processor) ApplyTx(ctx context.Context, tx *sql.Tx, c fence.Custody, events []jetstream.Event) (Result, error) {
	s := p.BeginTx(ctx, tx, c)
	res, err := s.Apply(events)
	if err != nil {
		return Result{}, err
	}
	if err := s.Finish(); err != nil {
		return Result{}, err
	}
	// The caller commits tx: its outcomes are counted now, so a caller
	// that rolls tx back and applies the events again counts them again.
	s.Committed()
	return res, nil
}

// outcome is what happened to one event of a batch.
type outcome struct {
	reason  string // skip reason; "" when applied or unchanged
	err     error  // why it was skipped
	changed bool
}

// count adds one event's outcome to res.
func count(o *outcome, res *Result) {
	switch {
	case o.reason == "" && o.changed:
		res.Applied++
	case o.reason == "":
		res.Unchanged++
	default:
		res.skip(o.reason)
	}
}

// emit meters and (sampled) logs one event's outcome.
func (p *Processor) emit(ev *jetstream.Event, o *outcome) {
	collection, operation := labelsOf(ev)
	switch {
	case o.reason == "" && o.changed:
		p.metrics.event(collection, operation, OutcomeApplied)
		return
	case o.reason == "":
		p.metrics.event(collection, operation, OutcomeUnchanged)
		return
	}
	p.metrics.event(collection, operation, OutcomeSkipped)
	p.metrics.skipped(o.reason)
	var l *zerolog.Event
	switch o.reason {
	case ReasonNotATCR, ReasonUnknownCollection:
		return
	case ReasonDatabase:
		l = p.skipLog(o.reason).Error()
	default:
		l = p.skipLog(o.reason).Warn()
	}
	l.Str("reason", o.reason).Str("collection", collection).Str("operation", operation).
		Str("did", logval.String(ev.DID)).Str("rkey", logval.String(rkeyOf(ev))).Int64("time_us", ev.TimeUS).
		Str("error", logval.Err(o.err)).Msg("event skipped")
}

// fatal reports whether err leaves the transaction unusable or is
// transient, so the batch must be retried rather than the event skipped.
func fatal(err error) bool {
	if err == context.Canceled || err == context.DeadlineExceeded {
		return true
	}
	return DatabaseFailure(err)
}

// DatabaseFailure reports whether err is a failure of the database itself
// rather than of the events being written: anything but the database
// refusing the values of a statement (database.Refused: a constraint, a
// datatype mismatch, a value too big). That covers no answer at all (a
// libSQL server unreachable, an HTTP 5xx, a Hrana stream or transaction
// timeout), locked or busy past busy_timeout, an I/O error, a read-only,
// full or out-of-memory database, a missing table, a savepoint that could
// not be taken, and any error of unknown shape. Retrying the same events
// later can succeed, so a caller must not skip them over such an error: it
// fails and retries from its checkpoint instead. Only a refusal, or an
// event the processor itself found invalid, is about the events, and
// isolating them one by one can get past it.
func DatabaseFailure(err error) bool {
	if err == nil {
		return false
	}
	var se *savepointError
	if errors.As(err, &se) {
		return true
	}
	var ie *invalidError
	if errors.As(err, &ie) {
		return false // the processor's own verdict on an event
	}
	return !database.Refused(err)
}

// ReportSkipped counts and logs an event its caller had to skip after the
// processor applied it, because the transaction around it could not
// commit (the consumer's and the backfill's event-by-event retry of a
// failed batch): under reason in appview_processor_skipped_total and as
// outcome skipped in appview_processor_events_total, and logged at the
// processor's sampled rate like every other skip.
func (p *Processor) ReportSkipped(ev *jetstream.Event, reason string, err error) {
	p.emit(ev, &outcome{reason: reason, err: err})
}

func rkeyOf(ev *jetstream.Event) string {
	if ev.Commit != nil {
		return ev.Commit.RKey
	}
	return ""
}

// labelsOf gives the metric labels of an event; collections outside
// io.atcr.* share the label "other" to bound the series count.
func labelsOf(ev *jetstream.Event) (collection, operation string) {
	switch ev.Kind {
	case jetstream.KindCommit:
		if ev.Commit == nil {
			return "", "unknown"
		}
		collection = ev.Commit.Collection
		if !strings.HasPrefix(collection, "io.atcr.") {
			collection = "other"
		} else if !knownCollection(collection) {
			collection = "io.atcr.other"
		}
		switch ev.Commit.Operation {
		case jetstream.OpCreate, jetstream.OpUpdate, jetstream.OpDelete:
			return collection, ev.Commit.Operation
		}
		return collection, "unknown"
	case jetstream.KindIdentity, jetstream.KindAccount:
		return "", ev.Kind
	}
	return "", "unknown"
}

func knownCollection(c string) bool {
	switch c {
	case CollectionManifest, CollectionTag, CollectionStar, CollectionProfile,
		CollectionRepoPage, CollectionCaptain, CollectionCrew, CollectionStats:
		return true
	}
	return false
}
