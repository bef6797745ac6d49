package processor

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/atcr-io/appview/internal/jetstream"
)

// TxSession applies the events of one transaction in several calls (the
// consumer's commit-budget chunks) as ApplyTx would apply them in one:
// what it read and wrote (tombstones, users rows ensured, repositories
// touched) is kept from one Apply to the next, so each chunk does not read
// it again, and the aggregates are recomputed once, by Finish. A session
// is used by one goroutine, inside its transaction only.
type TxSession struct {
	p   *Processor
	ctx context.Context
	tx  *sql.Tx
	c   fence.Custody
	st  txState
	// bare: no savepoints (BeginBareTx).
	bare bool
	// reports are the outcomes Apply found, counted and logged by
	// Committed.
	reports []pendingReport
}

// pendingReport is one event's outcome, for Finish to report.
type pendingReport struct {
	ev *jetstream.Event
	o  outcome
}

// BeginTx starts a session in tx (see ApplyTx for ctx, tx and c) that
// isolates each event: a failing one is rolled back alone (SAVEPOINTs).
func (p *Processor) BeginTx(ctx context.Context, tx *sql.Tx, c fence.Custody) *TxSession {
	return p.begin(ctx, tx, c, false)
}

// BeginBareTx starts a session in tx that takes no savepoint, so SQLite
// keeps no statement sub-journal (about a third less work per event:
// measured with appview-dev bench --only ingest). An event that fails before it changed
// anything (an invalid record found while writing, a first write the
// database refuses) is skipped as under BeginTx. When an event fails after
// changing a row, Apply returns an error wrapping ErrRedo and the caller
// must roll tx back and apply the events again under BeginTx (Redo).
// Fatal errors are as for BeginTx.
func (p *Processor) BeginBareTx(ctx context.Context, tx *sql.Tx, c fence.Custody) *TxSession {
	return p.begin(ctx, tx, c, true)
}

func (p *Processor) begin(ctx context.Context, tx *sql.Tx, c fence.Custody, bare bool) *TxSession {
	return &TxSession{p: p, ctx: ctx, tx: tx, c: c, st: newTxState(), bare: bare}
}

// Preload reads what the session's Apply calls for events would read one
// chunk at a time, each in one query per database.Chunks of keys: the
// tombstones of every record events create or update, and which of their
// DIDs already have a users row (so no statement ensures those rows: an
// INSERT ... DO NOTHING of an existing row changes nothing), and which
// DIDs of its tags and manifests have pending tags (pending_tags: a
// session that did not preload looks for them on every tag and manifest
// it writes). Calling it is optional; errors are the database's.
func (s *TxSession) Preload(events []jetstream.Event) error {
	var keys []recordKey
	var dids, tagDIDs []string
	seen, tagSeen := map[string]bool{}, map[string]bool{}
	for i := range events {
		ev := &events[i]
		if ev.Kind == jetstream.KindCommit && ev.Commit != nil && !tagSeen[ev.DID] &&
			(ev.Commit.Collection == CollectionTag || ev.Commit.Collection == CollectionManifest) {
			tagSeen[ev.DID] = true
			tagDIDs = append(tagDIDs, ev.DID)
		}
		if ev.Kind != jetstream.KindCommit || ev.Commit == nil || !knownCollection(ev.Commit.Collection) ||
			(ev.Commit.Operation != jetstream.OpCreate && ev.Commit.Operation != jetstream.OpUpdate) {
			continue
		}
		keys = append(keys, recordKey{ev.DID, ev.Commit.Collection, ev.Commit.RKey})
		if !seen[ev.DID] && !s.st.users[ev.DID] {
			seen[ev.DID] = true
			dids = append(dids, ev.DID)
		}
	}
	a := &applier{ctx: s.ctx, tx: s.tx, fence: s.c.Fence}
	a.use(s.st)
	if err := a.readTombstones(keys); err != nil {
		return err
	}
	if err := a.readPendingDIDs(tagDIDs); err != nil {
		return err
	}
	s.st = a.state()
	return a.readUsers(dids)
}

// Apply applies events, in order, after those of the session's earlier
// calls.
//
// In a session begun with BeginTx, each event is isolated: an invalid
// event is skipped before it touches the database, and an event the
// database refuses is rolled back alone and counted under ReasonDatabase;
// the rest of the events still land. (The events first run under one
// savepoint; only if one fails are they rolled back and run again with a
// savepoint each.) In a bare session (BeginBareTx) an event that fails
// before it changed anything is skipped the same way, and the first event
// that fails after changing a row ends Apply with an error wrapping
// ErrRedo.
//
// Apply returns an error only when the transaction itself is no longer
// usable (a savepoint cannot be taken or rolled back, the database is
// locked or failing, ctx is done) or, in a bare session, ErrRedo; the
// caller must then roll back and apply the whole transaction again.
// Outcomes are counted in the Result at once, and in the metrics and the
// log by Committed.
func (s *TxSession) Apply(events []jetstream.Event) (Result, error) {
	start := time.Now()
	outs := make([]outcome, len(events))
	ops := make([]*op, len(events))
	var maxUS int64
	for i := range events {
		ev := &events[i]
		maxUS = max(maxUS, ev.TimeUS)
		var err error
		ops[i], outs[i].reason, err = decodeEvent(ev)
		outs[i].err = err
	}
	a := &applier{ctx: s.ctx, tx: s.tx, fence: s.c.Fence, handles: handlesFrom(s.ctx), endpoints: endpointsFrom(s.ctx)}
	a.use(s.st)
	var (
		res Result
		err error
	)
	if s.bare {
		res, err = a.run(ops, outs, runBare)
	} else {
		// All events under one savepoint, no savepoint per event. If any
		// event fails, roll them back to it, restore what the session knew
		// before them, and redo them with a savepoint per event, so only
		// the failing events are lost.
		a.journal = true
		res, err = a.run(ops, outs, runBatch)
		if err != nil && !fatal(err) {
			if _, rerr := s.tx.ExecContext(s.ctx, "ROLLBACK TO batch"); rerr != nil {
				return Result{}, fmt.Errorf("roll back batch: %w", rerr)
			}
			if _, rerr := s.tx.ExecContext(s.ctx, "RELEASE batch"); rerr != nil {
				return Result{}, fmt.Errorf("roll back batch: %w", rerr)
			}
			a.takeBack()
			a.journal = false
			res, err = a.run(ops, outs, runPerEvent)
		}
	}
	if err != nil {
		return Result{}, err
	}
	s.st = a.state()
	res.Events, res.MaxTimeUS = len(events), maxUS
	for i := range events {
		count(&outs[i], &res)
		s.reports = append(s.reports, pendingReport{ev: &events[i], o: outs[i]})
	}
	s.p.metrics.batch(time.Since(start))
	return res, nil
}

// Finish recomputes the aggregate (repository_stats) of every repository
// whose stars or hold stats the session's events changed, from the
// persisted per-hold and star rows. Once per repository per transaction:
// the aggregate depends only on the persisted rows, and updated_at is the
// latest event that changed them, so where the calls (or batches) fall
// does not change the stored row. Errors are the database's.
func (s *TxSession) Finish() error {
	a := &applier{ctx: s.ctx, tx: s.tx, fence: s.c.Fence}
	a.use(s.st)
	if err := a.refreshTouched(); err != nil {
		return err
	}
	clear(s.st.touched)
	return nil
}

// Committed counts and logs (metrics, sampled skip warnings) the outcome
// of every event the session applied since the last call: the caller
// calls it once the transaction has committed, so a transaction that is
// rolled back and applied again (ErrRedo, a lost fence at commit, a fatal
// error) counts its events once, in the attempt that committed.
func (s *TxSession) Committed() {
	if s == nil {
		return
	}
	for i := range s.reports {
		s.p.emit(s.reports[i].ev, &s.reports[i].o)
	}
	s.reports = s.reports[:0]
}
