package processor

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
)

// applier applies the ops of one batch inside one transaction.
type applier struct {
	ctx   context.Context
	tx    *sql.Tx
	fence int64
	// handles are the handles PrepareBatch verified (nil without it).
	handles verifiedHandles
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

// undoEntry takes back one change to a state map: the key's previous
// value, or its absence (had false).
type undoEntry struct {
	m    stateMap
	rec  recordKey
	repo repoKey
	did  string
	had  bool
	at   int64  // touched's previous value
	ver  string // tombstones' previous value
}

// stateMap names one of the applier's state maps.
type stateMap uint8

const (
	mapTouched stateMap = iota
	mapUsers
	mapTombstones
	mapLoaded
)

// touch records that k changed at at (ms), keeping the latest.
func (a *applier) touch(k repoKey, at int64) {
	old, had := a.touched[k]
	if had && old >= at {
		return
	}
	if a.journal {
		a.undo = append(a.undo, undoEntry{m: mapTouched, repo: k, had: had, at: old})
	}
	a.touched[k] = at
}

// setUser records that did's users row exists.
func (a *applier) setUser(did string) {
	if a.users[did] {
		return
	}
	if a.journal {
		a.undo = append(a.undo, undoEntry{m: mapUsers, did: did})
	}
	a.users[did] = true
}

// setTombstone records v as the version of k's latest delete.
func (a *applier) setTombstone(k recordKey, v string) {
	old, had := a.tombstones[k]
	if a.journal {
		a.undo = append(a.undo, undoEntry{m: mapTombstones, rec: k, had: had, ver: old})
	}
	a.tombstones[k] = v
}

// setLoaded records that k's tombstone has been read.
func (a *applier) setLoaded(k recordKey) {
	if a.journal {
		a.undo = append(a.undo, undoEntry{m: mapLoaded, rec: k})
	}
	a.loaded[k] = true
}

// restore puts old back under k in m, or deletes k when it was absent.
func restore[K comparable, V any](m map[K]V, k K, old V, had bool) {
	if had {
		m[k] = old
	} else {
		delete(m, k)
	}
}

// takeBack undoes, latest first, every change journaled since undo was
// last emptied, and empties it.
func (a *applier) takeBack() {
	for i := len(a.undo) - 1; i >= 0; i-- {
		u := &a.undo[i]
		switch u.m {
		case mapTouched:
			restore(a.touched, u.repo, u.at, u.had)
		case mapUsers:
			delete(a.users, u.did)
		case mapTombstones:
			restore(a.tombstones, u.rec, u.ver, u.had)
		case mapLoaded:
			delete(a.loaded, u.rec)
		}
	}
	a.undo = a.undo[:0]
}

// txState is what an applier knows of its transaction, carried from one
// TxSession.Apply to the next.
type txState struct {
	touched     map[repoKey]int64
	users       map[string]bool
	tombstones  map[recordKey]string
	loaded      map[recordKey]bool
	pendingDIDs map[string]bool
}

func newTxState() txState {
	return txState{touched: map[repoKey]int64{}, users: map[string]bool{}, tombstones: map[recordKey]string{}, loaded: map[recordKey]bool{}}
}

// use makes s the applier's state.
func (a *applier) use(s txState) {
	a.touched, a.users, a.tombstones, a.loaded = s.touched, s.users, s.tombstones, s.loaded
	a.pendingDIDs = s.pendingDIDs
}

// state is the applier's state (applyInSavepoint may have replaced maps).
func (a *applier) state() txState {
	return txState{touched: a.touched, users: a.users, tombstones: a.tombstones, loaded: a.loaded, pendingDIDs: a.pendingDIDs}
}

// mayPend reports whether did may have pending_tags rows (pendingDIDs).
func (a *applier) mayPend(did string) bool {
	return a.pendingDIDs == nil || a.pendingDIDs[did]
}

// pend marks dids as having pending_tags rows.
func (a *applier) pend(dids ...string) {
	if a.pendingDIDs != nil {
		for _, d := range dids {
			a.pendingDIDs[d] = true
		}
	}
}

// readPendingDIDsSQL returns which of the DIDs in ?1 (a JSON array) have
// pending_tags rows, as a tag's repo or as its manifest's.
var readPendingDIDsSQL = `SELECT ` + database.Text("j.value") + ` FROM json_each(?1) AS j
WHERE EXISTS (SELECT 1 FROM pending_tags p WHERE p.did = j.value)
   OR EXISTS (SELECT 1 FROM pending_tags p WHERE p.manifest_did = j.value)`

// readPendingDIDs sets pendingDIDs to those of dids with pending_tags
// rows: one statement for the batch, so a batch of DIDs without any (the
// rule) costs no pending_tags statement per event.
func (a *applier) readPendingDIDs(dids []string) error {
	list, err := json.Marshal(dids)
	if err != nil {
		return err
	}
	rows, err := a.tx.QueryContext(a.ctx, readPendingDIDsSQL, string(list))
	if err != nil {
		return fmt.Errorf("read pending tags: %w", err)
	}
	defer rows.Close()
	found := map[string]bool{}
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			return fmt.Errorf("read pending tags: %w", err)
		}
		found[d] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read pending tags: %w", err)
	}
	if a.pendingDIDs == nil {
		a.pendingDIDs = found
	} else {
		maps.Copy(a.pendingDIDs, found)
	}
	return nil
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
	// (docs/performance.md, sixth pass).
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
	changed, err := a.apply(o)
	if err != nil {
		return false, err
	}
	a.res.HoldStats = append(a.res.HoldStats, a.pendingStats...)
	a.res.NewManifests = append(a.res.NewManifests, a.pendingManifests...)
	for _, k := range a.pendingTouched {
		a.touch(k, o.ev.TimeUS/1000)
	}
	return changed, nil
}

// recordKey names a record: the repo it lives in, its collection and rkey.
type recordKey struct{ did, collection, rkey string }

// tombstoneColumns are what loadTombstones reads: a record key and the
// version of its delete.
var tombstoneColumns = database.Text("t.did") + ", " + database.Text("t.collection") + ", " +
	database.Text("t.rkey") + ", " + database.Text("t.version")

// loadTombstones reads the tombstones of every record the batch creates
// or updates that the transaction has not read yet, in a few queries
// instead of one per event; deletes in the transaction then keep the map
// current.
func (a *applier) loadTombstones(ops []*op) error {
	var keys []recordKey
	for _, o := range ops {
		if o == nil || o.collection == "" || o.delete {
			continue
		}
		keys = append(keys, recordKey{o.did, o.collection, o.rkey})
	}
	return a.readTombstones(keys)
}

// readTombstones reads the tombstones of keys not read yet. A record read
// after one of the transaction's deletes wrote its tombstone gets the
// stored version, which includes that delete's.
func (a *applier) readTombstones(all []recordKey) error {
	var keys []recordKey
	for _, k := range all {
		if !a.loaded[k] {
			a.setLoaded(k)
			keys = append(keys, k)
		}
	}
	return database.Chunks(len(keys), 3, 0, func(lo, hi int) error {
		tuples := make([][3]string, hi-lo)
		for i, k := range keys[lo:hi] {
			tuples[i] = [3]string{k.did, k.collection, k.rkey}
		}
		list, err := json.Marshal(tuples)
		if err != nil {
			return fmt.Errorf("read tombstones: %w", err)
		}
		rows, err := a.tx.QueryContext(a.ctx, readTombstonesSQL, string(list))
		if err != nil {
			return fmt.Errorf("read tombstones: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var (
				k       recordKey
				version string
			)
			if err := rows.Scan(&k.did, &k.collection, &k.rkey, &version); err != nil {
				return fmt.Errorf("read tombstones: %w", err)
			}
			a.setTombstone(k, version)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read tombstones: %w", err)
		}
		return nil
	})
}

// readTombstonesSQL reads the tombstones of a JSON array of [did,
// collection, rkey] keys (a repeated key reads the same row into the map).
// One parameter whatever the number of keys, so every connection keeps it
// compiled (a VALUES list of a thousand keys took longer to compile than
// to run); each key is a primary-key lookup (EXPLAIN QUERY PLAN: SCAN j,
// SEARCH t USING INDEX sqlite_autoindex_record_tombstones_1).
var readTombstonesSQL = `SELECT ` + tombstoneColumns + ` FROM json_each(?) AS j
JOIN record_tombstones AS t ON t.did = j.value ->> 0 AND t.collection = j.value ->> 1 AND t.rkey = j.value ->> 2`

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

// newerVersionSQL finds a row (or a pending tag) written by a newer
// version of the record (did, rkey) than ?3, under any name.
var newerVersionSQL = map[string]string{
	CollectionManifest: `SELECT 1 FROM manifests WHERE did = ?1 AND rkey = ?2 AND version > ?3 LIMIT 1`,
	CollectionTag: `SELECT 1 FROM tags WHERE did = ?1 AND rkey = ?2 AND version > ?3
UNION ALL SELECT 1 FROM pending_tags WHERE did = ?1 AND rkey = ?2 AND version > ?3 LIMIT 1`,
	CollectionRepoPage: `SELECT 1 FROM repo_pages WHERE did = ?1 AND rkey = ?2 AND version > ?3 LIMIT 1`,
	CollectionStats:    `SELECT 1 FROM repository_hold_stats WHERE hold_did = ?1 AND rkey = ?2 AND version > ?3 LIMIT 1`,
}

// newerVersion reports whether a newer version of o's record has been
// applied, under whatever name (newerVersionSQL); false for collections
// whose rows are keyed by the record itself.
func (a *applier) newerVersion(o *op) (bool, error) {
	q, ok := newerVersionSQL[o.collection]
	if !ok {
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
		// Layers, references and annotations go with it (ON DELETE CASCADE).
		_, err = a.exec(`DELETE FROM manifests WHERE did = ?1 AND rkey = ?2 AND version < ?3
  AND NOT (repository = ?4 AND digest = ?5)`, o.did, o.rkey, o.version, o.manifest.Repository, o.manifest.Digest)
	case CollectionTag:
		_, err = a.exec(`DELETE FROM tags WHERE did = ?1 AND rkey = ?2 AND version < ?3
  AND NOT (repository = ?4 AND tag = ?5)`, o.did, o.rkey, o.version, o.tag.Repository, o.tag.Tag)
	case CollectionRepoPage:
		_, err = a.exec(`DELETE FROM repo_pages WHERE did = ?1 AND rkey = ?2 AND version < ?3 AND repository <> ?4`,
			o.did, o.rkey, o.version, o.page.Repository)
	case CollectionStats:
		s := o.stats
		var old HoldStat
		found, qerr := a.queryRow(`DELETE FROM repository_hold_stats WHERE hold_did = ?1 AND rkey = ?2 AND version < ?3
  AND NOT (did = ?4 AND repository = ?5)
RETURNING `+database.Text("did")+`, `+database.Text("repository")+`, pull_count, push_count, last_pull, last_push, updated_at`,
			[]any{o.did, o.rkey, o.version, s.OwnerDID, s.Repository},
			&old.OwnerDID, &old.Repository, &old.PullCount, &old.PushCount, &old.LastPull, &old.LastPush, &old.UpdatedAt)
		if qerr != nil || !found {
			err = qerr
			break
		}
		// The StatsCache and the old repository's aggregate lose this
		// hold's numbers, as on a delete of the record.
		old.HoldDID, old.RKey, old.SourceUS, old.Version, old.Deleted = o.did, o.rkey, o.ev.TimeUS, o.version, true
		a.pendingStats = append(a.pendingStats, old)
		a.pendingTouched = append(a.pendingTouched, repoKey{old.OwnerDID, old.Repository})
	}
	if err != nil {
		return fmt.Errorf("drop the %s row the record wrote before: %w", o.collection, err)
	}
	return nil
}

// readUsers marks, among dids, those whose users row exists, so
// ensureUser writes nothing for them (the processor never deletes a users
// row, and the transaction holds the write lock).
func (a *applier) readUsers(dids []string) error {
	return database.Chunks(len(dids), 1, 0, func(lo, hi int) error {
		args := make([]any, hi-lo, database.Bucket(hi-lo))
		for i, d := range dids[lo:hi] {
			args[i] = d
		}
		args = database.Pad(args, 1)
		rows, err := a.tx.QueryContext(a.ctx, `SELECT `+database.Text("did")+` FROM users WHERE did IN (`+
			database.InList(len(args))+`)`, args...)
		if err != nil {
			return fmt.Errorf("read users: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var did string
			if err := rows.Scan(&did); err != nil {
				return fmt.Errorf("read users: %w", err)
			}
			a.setUser(did)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read users: %w", err)
		}
		return nil
	})
}

// ensureUser creates the users row of a DID that has a user-repo record.
// identity_us and account_us start at this event's time: an older identity
// or account event, replayed later, must not change the row when the first
// pass (which had no row to update) left it alone.
func (a *applier) ensureUser(o *op) error {
	if a.users[o.did] {
		return a.fillHandle(o.did)
	}
	// The handle PrepareBatch verified for a new user, if any.
	_, err := a.exec(`INSERT INTO users (did, handle, identity_us, account_us, updated_at) VALUES (?1, ?4, ?2, ?2, ?3)
ON CONFLICT (did) DO NOTHING`, o.did, o.ev.TimeUS, o.ev.TimeUS/1000, a.handles[o.did])
	if err != nil {
		return fmt.Errorf("ensure user: %w", err)
	}
	a.setUser(o.did)
	return a.fillHandle(o.did)
}

// fillHandle sets the handle PrepareBatch verified for did on a users row
// that has none (its first lookup failed), once per batch. A row with a
// handle is left to #identity events, which alone change a set handle.
func (a *applier) fillHandle(did string) error {
	h := a.handles[did]
	if h == "" || a.filled[did] {
		return nil
	}
	if _, err := a.exec(`UPDATE users SET handle = ?1 WHERE did = ?2 AND (handle IS NULL OR handle = '')`, h, did); err != nil {
		return fmt.Errorf("fill user handle: %w", err)
	}
	if a.filled == nil {
		a.filled = map[string]bool{}
	}
	a.filled[did] = true
	return nil
}

// identity applies an #identity event. The handle is the one PrepareBatch
// verified from the DID document ("" clears a handle that no longer
// verifies); without one (no resolver, or the lookup failed) the row
// keeps the handle it has. The event's own handle is never stored: the
// firehose says it "might have been validated or passed-through from an
// upstream source" (com.atproto.sync.subscribeRepos#identity), and the
// owner of a did:web whose document cannot be fetched could otherwise
// name itself with anyone's handle.
func (a *applier) identity(o *op) (bool, error) {
	var handle any
	if h, ok := a.handles[o.did]; ok {
		handle = h
	}
	n, err := a.exec(`UPDATE users SET handle = COALESCE(?1, handle), identity_us = ?2, updated_at = ?3
WHERE did = ?4 AND identity_us < ?2`, handle, o.ev.TimeUS, o.ev.TimeUS/1000, o.did)
	if err != nil {
		return false, fmt.Errorf("identity: %w", err)
	}
	return n > 0, nil
}

// account applies an #account event. When it changes whether the
// account is active, the repositories it starred are touched: their
// star_count counts only active accounts' stars (StarCountSQL).
func (a *applier) account(o *op) (bool, error) {
	active := *o.account.Active // decode refused an event without it
	status := o.account.Status
	if active {
		status = ""
	}
	var was bool
	err := a.tx.QueryRowContext(a.ctx, `SELECT active FROM users WHERE did = ?1 AND account_us < ?2`, o.did, o.ev.TimeUS).Scan(&was)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil // no row, or a newer account event applied
	case err != nil:
		return false, fmt.Errorf("account: %w", err)
	}
	n, err := a.exec(`UPDATE users SET active = ?1, status = ?2, account_us = ?3, updated_at = ?4
WHERE did = ?5 AND account_us < ?3`, active, status, o.ev.TimeUS, o.ev.TimeUS/1000, o.did)
	if err != nil {
		return false, fmt.Errorf("account: %w", err)
	}
	if n > 0 && was != active {
		rows, err := a.tx.QueryContext(a.ctx, `SELECT DISTINCT `+database.Text("owner_did")+`, `+database.Text("repository")+`
FROM stars WHERE did = ?1`, o.did)
		if err != nil {
			return false, fmt.Errorf("account: stars of %s: %w", o.did, err)
		}
		defer rows.Close()
		for rows.Next() {
			var k repoKey
			if err := rows.Scan(&k.did, &k.repository); err != nil {
				return false, fmt.Errorf("account: stars of %s: %w", o.did, err)
			}
			a.pendingTouched = append(a.pendingTouched, k)
		}
		if err := rows.Err(); err != nil {
			return false, fmt.Errorf("account: stars of %s: %w", o.did, err)
		}
	}
	return n > 0, nil
}

func (a *applier) putManifest(o *op) (bool, error) {
	m := o.manifest
	if err := a.ensureUser(o); err != nil {
		return false, err
	}
	// Exec, not INSERT ... RETURNING: go-libsql's query path costs about
	// three times its exec path, and the new row's id is LastInsertId.
	r, err := a.tx.ExecContext(a.ctx, `INSERT INTO manifests (did, repository, digest, rkey, cid, hold_did, hold_endpoint, media_type,
  schema_version, config_digest, config_size, subject_digest, created_at, indexed_at, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
ON CONFLICT (did, repository, digest) DO NOTHING`,
		o.did, m.Repository, m.Digest, o.rkey, o.cid, m.HoldDID, m.HoldEndpoint, m.MediaType,
		m.SchemaVersion, m.ConfigDigest, m.ConfigSize, m.SubjectDigest, m.CreatedAt, o.ev.TimeUS/1000, o.ev.TimeUS, o.version)
	var inserted int64
	if err == nil {
		inserted, err = r.RowsAffected()
		a.wrote = a.wrote || inserted > 0 || err != nil
	}
	var id int64
	if err == nil && inserted > 0 {
		id, err = r.LastInsertId()
	}
	if err != nil {
		return false, fmt.Errorf("insert manifest: %w", err)
	}
	if inserted > 0 {
		a.pendingManifests = append(a.pendingManifests, NewManifest{
			OwnerDID: o.did, Repository: m.Repository, Digest: m.Digest, MediaType: m.MediaType,
			HoldDID: m.HoldDID, HoldEndpoint: m.HoldEndpoint, PushedAt: m.CreatedAt,
		})
	} else {
		// indexed_at keeps the time the row was first stored.
		updated, err := a.queryRow(`UPDATE manifests SET rkey = ?4, cid = ?5, hold_did = ?6, hold_endpoint = ?7, media_type = ?8,
  schema_version = ?9, config_digest = ?10, config_size = ?11, subject_digest = ?12, created_at = ?13, source_us = ?14,
  version = ?15
WHERE did = ?1 AND repository = ?2 AND digest = ?3 AND version < ?15 RETURNING id`,
			[]any{o.did, m.Repository, m.Digest, o.rkey, o.cid, m.HoldDID, m.HoldEndpoint, m.MediaType,
				m.SchemaVersion, m.ConfigDigest, m.ConfigSize, m.SubjectDigest, m.CreatedAt, o.ev.TimeUS, o.version}, &id)
		if err != nil {
			return false, fmt.Errorf("update manifest: %w", err)
		}
		if !updated {
			return false, nil
		}
		for _, q := range []string{
			`DELETE FROM manifest_layers WHERE manifest_id = ?1`,
			`DELETE FROM manifest_references WHERE manifest_id = ?1`,
			`DELETE FROM manifest_annotations WHERE manifest_id = ?1`,
		} {
			if _, err := a.exec(q, id); err != nil {
				return false, fmt.Errorf("replace manifest children: %w", err)
			}
		}
	}
	if err := a.putManifestChildren(id, m); err != nil {
		return false, err
	}
	return true, a.resolvePending(o.did, o.rkey, m.Digest)
}

// putManifestChildren inserts layers, references and annotations: a
// multi-row INSERT per kind, split by database.Chunks, so a record with any
// number of them fits the database's parameter limit.
func (a *applier) putManifestChildren(id int64, m *manifest) error {
	err := database.Chunks(len(m.Layers), 5, 0, func(lo, hi int) error {
		args := make([]any, 0, 5*(hi-lo))
		for i := lo; i < hi; i++ {
			l := &m.Layers[i]
			args = append(args, id, i, l.Digest, l.Size, l.MediaType)
		}
		if _, err := a.exec(`INSERT INTO manifest_layers (manifest_id, position, digest, size, media_type) VALUES `+
			database.Values(hi-lo, 5), args...); err != nil {
			return fmt.Errorf("insert layers %d-%d of %d: %w", lo, hi-1, len(m.Layers), err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	err = database.Chunks(len(m.Manifests), 8, 0, func(lo, hi int) error {
		args := make([]any, 0, 8*(hi-lo))
		for i := lo; i < hi; i++ {
			r := &m.Manifests[i]
			var p platform
			if r.Platform != nil {
				p = *r.Platform
			}
			args = append(args, id, i, r.Digest, r.Size, r.MediaType, p.OS, p.Architecture, p.Variant)
		}
		if _, err := a.exec(`INSERT INTO manifest_references (manifest_id, position, digest, size, media_type,
  platform_os, platform_arch, platform_variant) VALUES `+database.Values(hi-lo, 8), args...); err != nil {
			return fmt.Errorf("insert manifest references %d-%d of %d: %w", lo, hi-1, len(m.Manifests), err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(m.Annotations))
	for k := range m.Annotations {
		keys = append(keys, k)
	}
	sort.Strings(keys) // a stable insert order keeps two databases fed the same events identical
	return database.Chunks(len(keys), 3, 0, func(lo, hi int) error {
		args := make([]any, 0, 3*(hi-lo))
		for _, k := range keys[lo:hi] {
			args = append(args, id, k, m.Annotations[k])
		}
		if _, err := a.exec(`INSERT INTO manifest_annotations (manifest_id, key, value) VALUES `+
			database.Values(hi-lo, 3), args...); err != nil {
			return fmt.Errorf("insert annotations %d-%d of %d: %w", lo, hi-1, len(keys), err)
		}
		return nil
	})
}

// tagConflict is the newer-wins update of a tag row, shared by every
// tag upsert (putTag, resolvePending).
const tagConflict = `ON CONFLICT (did, repository, tag) DO UPDATE SET digest = excluded.digest, rkey = excluded.rkey,
  created_at = excluded.created_at, updated_at = excluded.updated_at, source_us = excluded.source_us,
  version = excluded.version
WHERE excluded.version > tags.version`

func (a *applier) putTag(o *op) (bool, error) {
	t := o.tag
	at := o.ev.TimeUS / 1000
	createdAt, updatedAt := t.CreatedAt, t.UpdatedAt
	if createdAt == 0 {
		createdAt = at
	}
	if updatedAt == 0 {
		updatedAt = createdAt
	}
	// The digest comes from the manifest record the at-uri names, else
	// from manifestDigest; resolving inside the upsert saves a query. With
	// neither, the digest is NULL and OR IGNORE drops the row (digest is
	// NOT NULL). A one-row VALUES, not INSERT ... SELECT: SQLite opens a
	// statement sub-journal for a statement that may write several rows,
	// which doubled the cost of this one.
	n, err := a.exec(`INSERT OR IGNORE INTO tags (did, repository, tag, digest, rkey, created_at, updated_at, source_us, version)
VALUES (?1, ?2, ?3, NULLIF(COALESCE(
    (SELECT digest FROM manifests WHERE did = ?9 AND rkey = ?10 ORDER BY version DESC LIMIT 1), ?4), ''), ?5, ?6, ?7, ?8, ?11)
`+tagConflict,
		o.did, t.Repository, t.Tag, t.ManifestDigest, o.rkey, createdAt, updatedAt, o.ev.TimeUS, t.ManifestDID, t.ManifestRKey, o.version)
	if err != nil {
		return false, fmt.Errorf("upsert tag: %w", err)
	}
	if n > 0 {
		if err := a.dropPending(o); err != nil {
			return false, err
		}
		return true, a.ensureUser(o)
	}
	if t.ManifestDigest != "" {
		return false, nil // older than the stored tag
	}
	var digest string
	found, err := a.queryRow(`SELECT `+database.Text("digest")+`
FROM manifests WHERE did = ?1 AND rkey = ?2`, []any{t.ManifestDID, t.ManifestRKey}, &digest)
	if err != nil {
		return false, fmt.Errorf("resolve tag manifest: %w", err)
	}
	if !found {
		// A replay of a stored tag (its manifest since deleted) changes
		// nothing; a tag naming a deleted manifest is dangling.
		if replay, err := a.exists(`SELECT 1 FROM tags WHERE did = ?1 AND rkey = ?2 AND version >= ?3`,
			o.did, o.rkey, o.version); err != nil || replay {
			return false, err
		}
		if gone, err := a.exists(`SELECT 1 FROM record_tombstones WHERE did = ?1 AND collection = ?2 AND rkey = ?3`,
			t.ManifestDID, CollectionManifest, t.ManifestRKey); err != nil {
			return false, err
		} else if gone {
			// The record's older pending version is replaced by this
			// one, which names nothing: it must not be resolved later.
			if err := a.dropPending(o); err != nil {
				return false, err
			}
			return false, invalid(ReasonUnresolvedManifest, "manifest at://%s/%s/%s was deleted and the tag has no manifestDigest",
				t.ManifestDID, CollectionManifest, t.ManifestRKey)
		}
		// Not stored yet: any event may arrive late. The tag is kept
		// until its manifest arrives (putManifest resolves it).
		n, err := a.exec(`INSERT INTO pending_tags (did, rkey, repository, tag, manifest_did, manifest_rkey, created_at, updated_at,
  source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
ON CONFLICT (did, rkey) DO UPDATE SET repository = excluded.repository, tag = excluded.tag,
  manifest_did = excluded.manifest_did, manifest_rkey = excluded.manifest_rkey, created_at = excluded.created_at,
  updated_at = excluded.updated_at, source_us = excluded.source_us, version = excluded.version
WHERE excluded.version > pending_tags.version`,
			o.did, o.rkey, t.Repository, t.Tag, t.ManifestDID, t.ManifestRKey, createdAt, updatedAt, o.ev.TimeUS, o.version)
		if err != nil {
			return false, fmt.Errorf("keep tag pending: %w", err)
		}
		a.pend(o.did, t.ManifestDID)
		if n > 0 {
			return true, a.ensureUser(o)
		}
		return false, nil
	}
	return false, nil // older than the stored tag
}

// dropPending removes the pending_tags row of o's tag record, if one is
// older than o: the record is now stored, replaced or deleted.
func (a *applier) dropPending(o *op) error {
	if !a.mayPend(o.did) {
		return nil
	}
	if _, err := a.exec(`DELETE FROM pending_tags WHERE did = ?1 AND rkey = ?2 AND version <= ?3`, o.did, o.rkey, o.version); err != nil {
		return fmt.Errorf("drop pending tag: %w", err)
	}
	return nil
}

// resolvePending writes the tags kept pending for the manifest record
// (did, rkey), now stored with digest, and removes them from
// pending_tags.
func (a *applier) resolvePending(did, rkey, digest string) error {
	if !a.mayPend(did) {
		return nil
	}
	type pendingTag struct {
		did, rkey, repository, tag, version string
		createdAt, updatedAt, sourceUS      int64
	}
	rows, err := a.tx.QueryContext(a.ctx, `SELECT `+database.Text("did")+`, `+database.Text("rkey")+`, `+
		database.Text("repository")+`, `+database.Text("tag")+`, `+database.Text("version")+`, created_at, updated_at, source_us
FROM pending_tags WHERE manifest_did = ?1 AND manifest_rkey = ?2`, did, rkey)
	if err != nil {
		return fmt.Errorf("read pending tags: %w", err)
	}
	var found []pendingTag
	for rows.Next() {
		var p pendingTag
		if err := rows.Scan(&p.did, &p.rkey, &p.repository, &p.tag, &p.version, &p.createdAt, &p.updatedAt, &p.sourceUS); err != nil {
			rows.Close()
			return fmt.Errorf("read pending tags: %w", err)
		}
		found = append(found, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read pending tags: %w", err)
	}
	for _, p := range found {
		if _, err := a.exec(`INSERT INTO tags (did, repository, tag, digest, rkey, created_at, updated_at, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
`+tagConflict,
			p.did, p.repository, p.tag, digest, p.rkey, p.createdAt, p.updatedAt, p.sourceUS, p.version); err != nil {
			return fmt.Errorf("write pending tag: %w", err)
		}
		if _, err := a.exec(`DELETE FROM pending_tags WHERE did = ?1 AND rkey = ?2`, p.did, p.rkey); err != nil {
			return fmt.Errorf("drop pending tag: %w", err)
		}
	}
	return nil
}

func (a *applier) putStar(o *op) (bool, error) {
	s := o.star
	n, err := a.exec(`INSERT INTO stars (did, rkey, owner_did, repository, created_at, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
ON CONFLICT (did, rkey) DO NOTHING`, o.did, o.rkey, s.OwnerDID, s.Repository, s.CreatedAt, o.ev.TimeUS, o.version)
	if err != nil {
		return false, fmt.Errorf("insert star: %w", err)
	}
	if n == 0 {
		// An update of a stored star, or a replay: it may move the star to
		// another repository, whose count changes too.
		var oldOwner, oldRepo, version string
		if _, err := a.queryRow(`SELECT `+database.Text("owner_did")+`, `+database.Text("repository")+`, `+database.Text("version")+`
FROM stars WHERE did = ?1 AND rkey = ?2`,
			[]any{o.did, o.rkey}, &oldOwner, &oldRepo, &version); err != nil {
			return false, fmt.Errorf("read star: %w", err)
		}
		if version >= o.version {
			return false, nil
		}
		if _, err := a.exec(`UPDATE stars SET owner_did = ?3, repository = ?4, created_at = ?5, source_us = ?6, version = ?7
WHERE did = ?1 AND rkey = ?2`, o.did, o.rkey, s.OwnerDID, s.Repository, s.CreatedAt, o.ev.TimeUS, o.version); err != nil {
			return false, fmt.Errorf("update star: %w", err)
		}
		if oldOwner != s.OwnerDID || oldRepo != s.Repository {
			a.pendingTouched = append(a.pendingTouched, repoKey{oldOwner, oldRepo})
		}
	}
	if err := a.ensureUser(o); err != nil {
		return false, err
	}
	a.pendingTouched = append(a.pendingTouched, repoKey{s.OwnerDID, s.Repository})
	return true, nil
}

func (a *applier) putProfile(o *op) (bool, error) {
	p := o.profile
	if err := a.ensureUser(o); err != nil {
		return false, err
	}
	var updatedAt any
	if p.UpdatedAt != 0 {
		updatedAt = p.UpdatedAt
	}
	n, err := a.exec(`UPDATE users SET default_hold = ?1, auto_remove_untagged = ?2, profile_created_at = ?3,
  profile_updated_at = ?4, profile_us = ?5, updated_at = ?6, profile_version = ?8
WHERE did = ?7 AND profile_version < ?8`, p.DefaultHold, p.AutoRemoveUntagged, p.CreatedAt, updatedAt,
		o.ev.TimeUS, o.ev.TimeUS/1000, o.did, o.version)
	if err != nil {
		return false, fmt.Errorf("update profile: %w", err)
	}
	return n > 0, nil
}

func (a *applier) putRepoPage(o *op) (bool, error) {
	p := o.page
	if err := a.ensureUser(o); err != nil {
		return false, err
	}
	n, err := a.exec(`INSERT INTO repo_pages (did, repository, rkey, description, avatar_cid, created_at, updated_at, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (did, repository) DO UPDATE SET rkey = excluded.rkey, description = excluded.description,
  avatar_cid = excluded.avatar_cid, created_at = excluded.created_at, updated_at = excluded.updated_at,
  source_us = excluded.source_us, version = excluded.version
WHERE excluded.version > repo_pages.version`,
		o.did, p.Repository, o.rkey, p.Description, p.AvatarCID, p.CreatedAt, p.UpdatedAt, o.ev.TimeUS, o.version)
	if err != nil {
		return false, fmt.Errorf("upsert repo page: %w", err)
	}
	return n > 0, nil
}

func (a *applier) putCaptain(o *op) (bool, error) {
	c := o.captain
	n, err := a.exec(`INSERT INTO hold_captains (hold_did, owner_did, public, allow_all_crew, enable_bluesky_posts,
  deployed_at, region, provider, successor, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
ON CONFLICT (hold_did) DO UPDATE SET owner_did = excluded.owner_did, public = excluded.public,
  allow_all_crew = excluded.allow_all_crew, enable_bluesky_posts = excluded.enable_bluesky_posts,
  deployed_at = excluded.deployed_at, region = excluded.region, provider = excluded.provider,
  successor = excluded.successor, source_us = excluded.source_us, version = excluded.version
WHERE excluded.version > hold_captains.version`,
		o.did, c.Owner, c.Public, c.AllowAllCrew, c.EnableBlueskyPosts, c.DeployedAt, c.Region, c.Provider, c.Successor, o.ev.TimeUS, o.version)
	if err != nil {
		return false, fmt.Errorf("upsert captain: %w", err)
	}
	return n > 0, nil
}

func (a *applier) putCrew(o *op) (bool, error) {
	c := o.crew
	n, err := a.exec(`INSERT INTO hold_crew (hold_did, rkey, member_did, role, permissions, tier, added_at, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (hold_did, rkey) DO UPDATE SET member_did = excluded.member_did, role = excluded.role,
  permissions = excluded.permissions, tier = excluded.tier, added_at = excluded.added_at, source_us = excluded.source_us,
  version = excluded.version
WHERE excluded.version > hold_crew.version`,
		o.did, o.rkey, c.Member, c.Role, c.Permissions, c.Tier, c.AddedAt, o.ev.TimeUS, o.version)
	if err != nil {
		return false, fmt.Errorf("upsert crew: %w", err)
	}
	return n > 0, nil
}

// putStats writes one hold's absolute counts. Newer-wins is decided by the
// record's version (the hold repo's rev) in SQL, so no cache (warm or cold)
// can regress a row; the record's updatedAt is data only (two updates in
// one millisecond are still ordered).
func (a *applier) putStats(o *op) (bool, error) {
	s := o.stats
	n, err := a.exec(`INSERT INTO repository_hold_stats (did, repository, hold_did, rkey, pull_count, push_count,
  last_pull, last_push, updated_at, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
ON CONFLICT (did, repository, hold_did) DO UPDATE SET rkey = excluded.rkey, pull_count = excluded.pull_count,
  push_count = excluded.push_count, last_pull = excluded.last_pull, last_push = excluded.last_push,
  updated_at = excluded.updated_at, source_us = excluded.source_us, version = excluded.version
WHERE excluded.version > repository_hold_stats.version`,
		s.OwnerDID, s.Repository, s.HoldDID, s.RKey, s.PullCount, s.PushCount, s.LastPull, s.LastPush, s.UpdatedAt, s.SourceUS, s.Version)
	if err != nil {
		return false, fmt.Errorf("upsert hold stats: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	a.pendingStats = append(a.pendingStats, *s)
	a.pendingTouched = append(a.pendingTouched, repoKey{s.OwnerDID, s.Repository})
	return true, nil
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
		// Layers, references and annotations go with it (ON DELETE CASCADE).
		n, err = a.exec(`DELETE FROM manifests WHERE did = ?1 AND rkey = ?2 AND version <= ?3`, o.did, o.rkey, v)
		if err == nil && a.mayPend(o.did) {
			// Tags waiting for this manifest wait for nothing now.
			_, err = a.exec(`DELETE FROM pending_tags WHERE manifest_did = ?1 AND manifest_rkey = ?2`, o.did, o.rkey)
		}
	case CollectionTag:
		n, err = a.exec(`DELETE FROM tags WHERE did = ?1 AND rkey = ?2 AND version <= ?3`, o.did, o.rkey, v)
		if err == nil {
			err = a.dropPending(o)
		}
	case CollectionStar:
		// One statement: the row is deleted and its subject read back
		// (stars is keyed by (did, rkey), so at most one row).
		var owner, repo string
		found, qerr := a.queryRow(`DELETE FROM stars WHERE did = ?1 AND rkey = ?2 AND version <= ?3
RETURNING `+database.Text("owner_did")+`, `+database.Text("repository"),
			[]any{o.did, o.rkey, v}, &owner, &repo)
		if qerr != nil || !found {
			err = qerr
			break
		}
		n = 1
		a.pendingTouched = append(a.pendingTouched, repoKey{owner, repo})
	case CollectionProfile:
		n, err = a.exec(`UPDATE users SET default_hold = '', auto_remove_untagged = 0, profile_created_at = NULL,
  profile_updated_at = NULL, profile_us = ?2, updated_at = ?3, profile_version = ?4
WHERE did = ?1 AND (profile_version < ?4 OR (profile_version = ?4 AND profile_created_at IS NOT NULL))`, o.did, t, t/1000, v)
	case CollectionRepoPage:
		n, err = a.exec(`DELETE FROM repo_pages WHERE did = ?1 AND rkey = ?2 AND version <= ?3`, o.did, o.rkey, v)
	case CollectionCaptain:
		n, err = a.exec(`DELETE FROM hold_captains WHERE hold_did = ?1 AND version <= ?2`, o.did, v)
	case CollectionCrew:
		n, err = a.exec(`DELETE FROM hold_crew WHERE hold_did = ?1 AND rkey = ?2 AND version <= ?3`, o.did, o.rkey, v)
	case CollectionStats:
		var s HoldStat
		found, qerr := a.queryRow(`SELECT `+database.Text("did")+`, `+database.Text("repository")+`, pull_count, push_count, last_pull, last_push, updated_at
FROM repository_hold_stats WHERE hold_did = ?1 AND rkey = ?2 AND version <= ?3`,
			[]any{o.did, o.rkey, v}, &s.OwnerDID, &s.Repository, &s.PullCount, &s.PushCount, &s.LastPull, &s.LastPush, &s.UpdatedAt)
		if qerr != nil || !found {
			err = qerr
			break
		}
		n, err = a.exec(`DELETE FROM repository_hold_stats WHERE did = ?1 AND repository = ?2 AND hold_did = ?3`,
			s.OwnerDID, s.Repository, o.did)
		s.HoldDID, s.RKey, s.SourceUS, s.Version, s.Deleted = o.did, o.rkey, t, v, true
		a.pendingStats = append(a.pendingStats, s)
		a.pendingTouched = append(a.pendingTouched, repoKey{s.OwnerDID, s.Repository})
	}
	if err != nil {
		return false, fmt.Errorf("delete %s: %w", o.collection, err)
	}
	return tomb > 0 || n > 0, nil
}

// refreshTouched recomputes the aggregate of every touched repository, a
// chunk of repositories per statement (database.Chunks).
func (a *applier) refreshTouched() error {
	keys := sortedKeys(a.touched)
	return database.Chunks(len(keys), 3, 1, func(lo, hi int) error {
		tuples := make([][3]any, hi-lo)
		for i, k := range keys[lo:hi] {
			tuples[i] = [3]any{k.did, k.repository, a.touched[k]}
		}
		list, err := json.Marshal(tuples)
		if err == nil {
			_, err = a.tx.ExecContext(a.ctx, refreshManySQL, string(list), a.fence)
		}
		if err != nil {
			return fmt.Errorf("refresh repository_stats: %w", err)
		}
		return nil
	})
}

// refreshManySQL recomputes the aggregate (docs/spec.md §8
// repository_stats: sums over holds, saturating with SaturatingSumSQL;
// the latest last_pull and last_push; the star count) of the repositories
// in ?1, a JSON array of [did, repository, updated_at (ms)] tuples, with
// ?2 the fence. One parameter for any number of repositories, so the
// statement stays compiled (see readTombstonesSQL).
var refreshManySQL = `WITH k AS (SELECT j.value ->> 0 AS did, j.value ->> 1 AS repository, j.value ->> 2 AS at
  FROM json_each(?1) AS j)
INSERT INTO repository_stats (did, repository, pull_count, push_count, last_pull, last_push, star_count, fence, updated_at)
SELECT k.did, k.repository, ` + SaturatingSumSQL("h.pull_count") + `, ` + SaturatingSumSQL("h.push_count") + `,
  MAX(h.last_pull), MAX(h.last_push),
  ` + StarCountSQL("k") + `, ?2, k.at
FROM k LEFT JOIN repository_hold_stats AS h ON h.did = k.did AND h.repository = k.repository
WHERE true
GROUP BY k.did, k.repository
` + refreshConflict

// refreshConflict writes a recomputed row when its values changed or its
// updated_at is newer.
const refreshConflict = `ON CONFLICT (did, repository) DO UPDATE SET pull_count = excluded.pull_count, push_count = excluded.push_count,
  last_pull = excluded.last_pull, last_push = excluded.last_push, star_count = excluded.star_count,
  fence = excluded.fence, updated_at = excluded.updated_at
WHERE excluded.updated_at > repository_stats.updated_at
   OR (repository_stats.pull_count, repository_stats.push_count, repository_stats.last_pull, repository_stats.last_push,
       repository_stats.star_count)
   IS NOT (excluded.pull_count, excluded.push_count, excluded.last_pull, excluded.last_push, excluded.star_count)`

// StarCountSQL is the SQL expression counting the stars of the
// repository (did, repository) of the row alias k: stars of inactive
// accounts (users.active 0: deactivated, taken down, deleted) do not
// count. Nothing of an inactive account is visible (docs/interop.md), and
// the backfill, which skips inactive repos, never stores their stars: the
// live and the backfilled index agree. An account that becomes active
// again counts again (account touches what it starred).
func StarCountSQL(k string) string {
	return `(SELECT COUNT(*) FROM stars s WHERE s.owner_did = ` + k + `.did AND s.repository = ` + k + `.repository
    AND NOT EXISTS (SELECT 1 FROM users u WHERE u.did = s.did AND u.active = 0))`
}

// SaturatingSumSQL is the SQL aggregate summing an INTEGER count column
// over a group, capped at MaxSafeInteger, 0 for no rows. SQLite's SUM
// fails the whole statement with "integer overflow" past int64, which
// would make one repository's aggregate (and so every batch touching it)
// fail forever; TOTAL sums in float64 and never fails. For non-negative
// counts every partial sum below 2^53 is exact in float64, and once a sum
// reaches 2^53 it stays there or above, so the capped result is exactly
// min(sum, MaxSafeInteger).
func SaturatingSumSQL(column string) string {
	return fmt.Sprintf("CAST(MIN(TOTAL(%s), %d) AS INTEGER)", column, int64(MaxSafeInteger))
}
