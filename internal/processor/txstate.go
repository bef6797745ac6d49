package processor

import (
	"encoding/json"
	"fmt"
	"maps"

	"github.com/atcr-io/appview/internal/database"
)

// recordKey names a record: the repo it lives in, its collection and rkey.
type recordKey struct{ did, collection, rkey string }

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
