package processor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"

	"github.com/atcr-io/appview/internal/jetstream"
)

// applier applies the ops of one batch inside one transaction.
type applier struct {
	ctx   context.Context
	tx    *sql.Tx
	fence int64
	// handles are the handles PrepareBatch verified (nil without it), and
	// endpoints the PDS endpoints it read with them.
	handles   verifiedHandles
	endpoints endpoints
	// filled are the DIDs whose missing handle fillHandle has set.
	filled map[string]bool
	res    Result
	// pending collects the effects of the current event, published to res
	// only when its savepoint is released.
	pendingStats     []HoldStat
	pendingManifests []NewManifest
	// pendingTouched are the repositories whose stars or hold stats the
	// event changed: their aggregate is recomputed once per transaction
	// (TxSession.Finish).
	pendingTouched []repoKey
	// pendingRereads are the re-reads the current event asks for.
	pendingRereads []Reread
	// touched maps each repository whose stars or hold stats the batch
	// changed to the time (ms) of the latest event that changed them.
	touched map[repoKey]int64
	// users are the DIDs whose users row this transaction has ensured.
	users map[string]bool
	// tombstones are the newest delete (version) of the batch's records.
	tombstones map[recordKey]string
	// loaded are the records whose tombstone has been read from the
	// database in this transaction (so tombstones holds it, or it has none
	// but what the transaction's own deletes wrote).
	loaded map[recordKey]bool
	// pendingDIDs, when not nil, are the DIDs that may have pending_tags
	// rows, as a tag record's repo or as its manifest's (read once per
	// transaction by TxSession.Preload, added to when a tag is kept
	// pending): a DID outside it needs no pending_tags statement. nil:
	// unknown, every DID may. Not journaled: a DID left in it by a
	// rolled-back batch costs one statement that finds nothing.
	pendingDIDs map[string]bool
	// journal, when true, makes every change to the four maps above append
	// to undo how to take it back (TxSession.Apply's fast path: restoring
	// the maps after a failed batch costs what the batch changed, where a
	// copy taken before every batch cost the whole transaction's maps).
	journal bool
	undo    []undoEntry
	// wrote is whether the current event (applyOne) has changed a row: a
	// statement of it changed rows, or a statement that returns rows
	// returned one (counted as a write whatever it was). A failing event
	// that wrote nothing needs no rollback, so a bare run skips it
	// instead of asking for a redo.
	wrote bool
}

// savepointError means the transaction cannot isolate events any more.
type savepointError struct{ err error }

func (e *savepointError) Error() string { return "savepoint: " + e.err.Error() }
func (e *savepointError) Unwrap() error { return e.err }

// go-libsql statements are not prepared ahead: its Stmt re-prepares on
// every execution after parsing the SQL in Go (and rejects ?NNN), so the
// applier executes on the transaction directly.

func (a *applier) exec(query string, args ...any) (int64, error) {
	r, err := a.tx.ExecContext(a.ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := r.RowsAffected()
	if err != nil || n > 0 {
		a.wrote = true
	}
	return n, err
}

// exists reports whether the read query returns a row (it writes
// nothing, so it does not count as a write, unlike queryRow).
func (a *applier) exists(query string, args ...any) (bool, error) {
	var x any
	err := a.tx.QueryRowContext(a.ctx, query, args...).Scan(&x)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// read scans the first row of the read query into dest; found is false
// when there is none. It writes nothing, so it does not count as a write.
func (a *applier) read(query string, args []any, dest ...any) (found bool, err error) {
	err = a.tx.QueryRowContext(a.ctx, query, args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// queryRow scans the first row of query into dest; found is false when
// there is none.
func (a *applier) queryRow(query string, args []any, dest ...any) (found bool, err error) {
	err = a.tx.QueryRowContext(a.ctx, query, args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	a.wrote = true // an UPDATE or DELETE ... RETURNING that found its row
	return err == nil, err
}

// runMode is how applier.run isolates the events of a batch.
type runMode uint8

const (
	// runBare takes no savepoint. A failing event that changed nothing
	// before it failed is recorded in outs and skipped, as runPerEvent
	// would (a failed statement leaves nothing: SQLite undoes it); the
	// first failing event that had changed a row ends the run with its
	// error wrapped in ErrRedo, the transaction holding what it wrote, for
	// the caller to roll back whole. No savepoint means no statement
	// sub-journal: SQLite copies every page a savepoint's statements first
	// touch into it and walks it at the end of each statement that needs
	// one, which cost a quarter of the processor's time
	// (measured with appview-dev bench --only ingest).
	runBare runMode = iota
	// runBatch puts the batch under SAVEPOINT batch and stops at the first
	// failing event, returning its error with the savepoint still open,
	// for the caller to roll back to and run again with runPerEvent.
	runBatch
	// runPerEvent gives each event its own savepoint inside SAVEPOINT
	// batch: a failing event is rolled back alone and recorded in outs.
	runPerEvent
)

// run applies the decoded ops of a batch (nil where decoding skipped the
// event) on the applier's state (use), isolated as mode says. Only a fatal
// error is returned with runPerEvent. The aggregates of the repositories
// it touched are left to refreshTouched.
func (a *applier) run(ops []*op, outs []outcome, mode runMode) (Result, error) {
	a.res = Result{}
	if mode != runBare {
		if _, err := a.tx.ExecContext(a.ctx, "SAVEPOINT batch"); err != nil {
			return Result{}, &savepointError{err}
		}
	}
	if err := a.loadTombstones(ops); err != nil {
		return Result{}, err
	}
	for i, o := range ops {
		if o == nil {
			continue
		}
		if err := a.ctx.Err(); err != nil {
			return Result{}, err
		}
		var (
			changed bool
			err     error
		)
		if mode == runPerEvent {
			changed, err = a.applyInSavepoint(o)
		} else {
			changed, err = a.applyOne(o)
		}
		switch {
		case err == nil:
			outs[i] = outcome{changed: changed}
		case fatal(err):
			return Result{}, fmt.Errorf("apply event time_us=%d: %w", o.ev.TimeUS, err)
		case mode == runBare && a.wrote:
			return Result{}, &redoError{timeUS: o.ev.TimeUS, err: err}
		case mode == runBatch:
			return Result{}, err
		default:
			// runPerEvent, or a bare run's event that failed before it
			// changed anything (a tag whose manifest is not stored, a
			// first write the database refused): skipped where it stands.
			var ie *invalidError
			if errors.As(err, &ie) {
				outs[i] = outcome{reason: ie.reason, err: err}
			} else {
				outs[i] = outcome{reason: ReasonDatabase, err: err}
			}
		}
	}
	if mode != runBare {
		if _, err := a.tx.ExecContext(a.ctx, "RELEASE batch"); err != nil {
			return Result{}, &savepointError{err}
		}
	}
	return a.res, nil
}

// applyInSavepoint applies one op under SAVEPOINT ev; on error everything
// it wrote is rolled back and its effects are not reported.
func (a *applier) applyInSavepoint(o *op) (bool, error) {
	if _, err := a.tx.ExecContext(a.ctx, "SAVEPOINT ev"); err != nil {
		return false, &savepointError{err}
	}
	users := maps.Clone(a.users)
	tombs := maps.Clone(a.tombstones)
	changed, err := a.applyOne(o)
	if err != nil {
		a.users, a.tombstones = users, tombs
		if _, rerr := a.tx.ExecContext(a.ctx, "ROLLBACK TO ev"); rerr != nil {
			return false, &savepointError{rerr}
		}
		if _, rerr := a.tx.ExecContext(a.ctx, "RELEASE ev"); rerr != nil {
			return false, &savepointError{rerr}
		}
		return false, err
	}
	if _, err := a.tx.ExecContext(a.ctx, "RELEASE ev"); err != nil {
		return false, &savepointError{err}
	}
	return changed, nil
}

// applyOne applies one op and, when it succeeds, publishes its effects.
func (a *applier) applyOne(o *op) (bool, error) {
	a.wrote = false
	a.pendingStats, a.pendingManifests, a.pendingTouched = a.pendingStats[:0], a.pendingManifests[:0], a.pendingTouched[:0]
	a.pendingRereads = a.pendingRereads[:0]
	changed, err := a.apply(o)
	if err != nil {
		return false, err
	}
	a.res.HoldStats = append(a.res.HoldStats, a.pendingStats...)
	a.res.NewManifests = append(a.res.NewManifests, a.pendingManifests...)
	a.res.Rereads = append(a.res.Rereads, a.pendingRereads...)
	for _, k := range a.pendingTouched {
		a.touch(k, o.ev.TimeUS/1000)
	}
	return changed, nil
}

func (a *applier) apply(o *op) (bool, error) {
	switch {
	case o.identity != nil:
		return a.identity(o)
	case o.account != nil:
		return a.account(o)
	case o.delete:
		return a.deleteRecord(o)
	}
	// A create or update not newer than the record's last delete must not
	// bring it back (at an equal version the delete wins: see version.go).
	if deleted, ok := a.tombstones[recordKey{o.did, o.collection, o.rkey}]; ok && deleted >= o.version {
		return false, nil
	}
	if mayMove(o) {
		// A read (a backfill page, a re-read) older than a version of the
		// same record already applied under another name must not bring
		// the old name back: the upsert of that name would find no row
		// to lose to.
		if newer, err := a.newerVersion(o); err != nil || newer {
			return false, err
		}
	}
	var (
		changed bool
		err     error
	)
	switch o.collection {
	case CollectionManifest:
		changed, err = a.putManifest(o)
	case CollectionTag:
		changed, err = a.putTag(o)
	case CollectionStar:
		return a.putStar(o)
	case CollectionProfile:
		return a.putProfile(o)
	case CollectionRepoPage:
		changed, err = a.putRepoPage(o)
	case CollectionCaptain:
		return a.putCaptain(o)
	case CollectionCrew:
		return a.putCrew(o)
	case CollectionStats:
		changed, err = a.putStats(o)
	default:
		return false, fmt.Errorf("no handler for %s", o.collection)
	}
	if err != nil || !changed || !mayMove(o) {
		return changed, err
	}
	return true, a.dropMoved(o)
}

// mayMove reports whether a create or update may have changed what row
// its record writes: an update (its record may name another repository,
// digest or tag at the same rkey; a re-read of a repository applies its
// records as updates), or a backfill read (no rev: the record may have
// changed any way since an earlier read). A live create with a rev
// cannot: the rev screen drops a commit older than its repo's newest,
// a PDS creates a record only at a key that holds none, and the delete
// that emptied the key removed its row (a delete the stream missed is a
// gap, which a re-read of the repository repairs).
func mayMove(o *op) bool {
	c := o.ev.Commit
	return c != nil && (c.Operation == jetstream.OpUpdate || c.Rev == "")
}

// newerVersionSQL is the statement that finds a row (or a pending tag)
// written by a newer version of the record (did, rkey) than ?3, under any
// name; "" for collections whose rows are keyed by the record itself.
func newerVersionSQL(collection string) string {
	switch collection {
	case CollectionManifest:
		return newerManifestSQL
	case CollectionTag:
		return newerTagSQL
	case CollectionRepoPage:
		return newerRepoPageSQL
	case CollectionStats:
		return newerHoldStatsSQL
	}
	return ""
}

// newerVersion reports whether a newer version of o's record has been
// applied, under whatever name (newerVersionSQL); false for collections
// whose rows are keyed by the record itself.
func (a *applier) newerVersion(o *op) (bool, error) {
	q := newerVersionSQL(o.collection)
	if q == "" {
		return false, nil
	}
	newer, err := a.exists(q, o.did, o.rkey, o.version)
	if err != nil {
		return false, fmt.Errorf("read newer versions of %s/%s: %w", o.collection, o.rkey, err)
	}
	return newer, nil
}

// dropMoved removes the row an earlier version of o's record wrote under
// another key (manifests: repository and digest; tags: repository and
// tag; repo pages: repository; hold stats: owner and repository), which
// the upsert of the new version left behind: the record at an rkey is
// one row, the newest version's (docs/ordering.md). Only rows of an
// older version go: a row the same rkey wrote at a newer version cannot
// exist (o just won), and a row of another rkey is another record's.
func (a *applier) dropMoved(o *op) error {
	var err error
	switch o.collection {
	case CollectionManifest:
		err = a.dropMovedManifest(o)
	case CollectionTag:
		err = a.dropMovedTag(o)
	case CollectionRepoPage:
		err = a.dropMovedRepoPage(o)
	case CollectionStats:
		err = a.dropMovedHoldStats(o)
	}
	if err != nil {
		return fmt.Errorf("drop the %s row the record wrote before: %w", o.collection, err)
	}
	return nil
}

// deleteRecord records the tombstone and removes the row the record wrote,
// unless that row was written by a newer version (an equal version is
// removed: at one rev the delete wins, see version.go).
func (a *applier) deleteRecord(o *op) (bool, error) {
	t, v := o.ev.TimeUS, o.version
	tomb, err := a.exec(`INSERT INTO record_tombstones (did, collection, rkey, source_us, version) VALUES (?1, ?2, ?3, ?4, ?5)
ON CONFLICT (did, collection, rkey) DO UPDATE SET source_us = excluded.source_us, version = excluded.version
WHERE excluded.version > record_tombstones.version`, o.did, o.collection, o.rkey, t, v)
	if err != nil {
		return false, fmt.Errorf("record tombstone: %w", err)
	}
	if k := (recordKey{o.did, o.collection, o.rkey}); v > a.tombstones[k] {
		a.setTombstone(k, v)
	}
	var n int64
	switch o.collection {
	case CollectionManifest:
		n, err = a.deleteManifest(o)
	case CollectionTag:
		n, err = a.deleteTag(o)
	case CollectionStar:
		n, err = a.deleteStar(o)
	case CollectionProfile:
		n, err = a.deleteProfile(o)
	case CollectionRepoPage:
		n, err = a.deleteRepoPage(o)
	case CollectionCaptain:
		n, err = a.deleteCaptain(o)
	case CollectionCrew:
		n, err = a.deleteCrew(o)
	case CollectionStats:
		n, err = a.deleteHoldStats(o)
	}
	if err != nil {
		return false, fmt.Errorf("delete %s: %w", o.collection, err)
	}
	return tomb > 0 || n > 0, nil
}
