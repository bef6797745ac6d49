// Package fence holds the fencing primitives every worker writes through:
// the custody a worker is given with a grant of a lease, the transaction
// that commits only under that custody, and the error that says it was
// superseded. It is the ground floor of the lease design: the LeaseActor
// (actors/lease) grants custody, everything that writes (processor,
// webhooks, every worker) checks it here, and nothing here knows about
// actors.
//
// The guarantee: a transaction run by Fenced commits only while its
// custody is the current, unexpired grant of its lease on the database's
// clock (docs/leases.md). Lease rows themselves are written by the lease
// store (actors/lease); this package only reads them, inside the guard.
package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/database"
)

// ErrSuperseded means a renewal, release or fenced write matched no lease
// row: another instance has taken custody (or the grant expired on the
// database's clock). The caller must stop acting as the holder at once.
var ErrSuperseded = errors.New("lease superseded")

// Custody is one grant of a named lease: who holds it and under which fence
// token. Workers receive it when they are spawned and stamp their writes
// with it.
type Custody struct {
	// Lease is the lease name (docs/spec.md §4), e.g. "jetstream-consumer".
	Lease string
	// Holder is the instance_id of this process.
	Holder string
	// Fence is the fence token of this grant; it grows by one on every
	// change of custody. 0 means "not fenced": leases are disabled or the
	// worker is unleased, and fenced writes run unconditionally.
	Fence int64
}

// Fenced reports whether writes under this custody are conditional on the lease.
func (c Custody) Fenced() bool { return c.Fence > 0 }

// String renders "lease:fence" (the X-Appview-Fence header of docs/spec.md §9).
func (c Custody) String() string { return fmt.Sprintf("%s:%d", c.Lease, c.Fence) }

// guardSQL is the first statement of every fenced transaction: it both
// checks the custody and takes the write lock, so no change of custody
// can commit between the check and the transaction's commit.
const guardSQL = `UPDATE leases SET fence = fence
WHERE name = ?1 AND holder = ?2 AND fence = ?3 AND expires_at > ` + database.NowMS

// writeLockSQL writes nothing but, being a write, takes the database's
// write lock (waiting up to busy_timeout for it) before fn reads anything.
const writeLockSQL = `UPDATE leases SET fence = fence WHERE 0`

// Fenced runs fn inside a transaction that commits only while c is the
// current, unexpired custody of its lease on the database's clock. The
// first statement of the transaction checks the fence and takes the write
// lock, so a takeover cannot interleave before commit. When the check fails
// nothing of fn runs and the error wraps ErrSuperseded. An unfenced custody
// (Fence 0, leases disabled) runs fn in a transaction that takes the write
// lock first and checks nothing. If ctx is done before commit
// the transaction is rolled back and ctx.Err() returned: a stopping worker
// writes nothing more. When a file check is registered for db
// (SetFileCheck) and fails just before the commit, the transaction is
// rolled back and that error returned: a write into a database file that
// was deleted or replaced lands nowhere the other instances read, under a
// grant the new file may already give to one of them.
//
// The driver ignores contexts, and a call on a connection whose peer has
// vanished (a network partition) can hang for minutes. Fenced therefore
// stops waiting for the begin and the fence check when ctx ends, returns
// ctx.Err() and leaves them to finish in the background, where the
// transaction is rolled back and fn never runs; so a worker told to stop
// can stop. fn itself runs on the caller's goroutine as before.
func Fenced(ctx context.Context, db *sql.DB, c Custody, fn func(tx *sql.Tx) error) error {
	err := fenced(ctx, db, c, fn)
	healthOf(db).noteFenced(workerWrites(c.Lease), c.Fence, err)
	return err
}

func fenced(ctx context.Context, db *sql.DB, c Custody, fn func(tx *sql.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	type begun struct {
		tx  *sql.Tx
		err error
	}
	// A lease write of this process goes first (see yield).
	yield(ctx, db)
	ch := make(chan begun, 1)
	go func() {
		tx, err := beginFenced(ctx, db, c)
		ch <- begun{tx, err}
	}()
	var tx *sql.Tx
	select {
	case b := <-ch:
		if b.err != nil {
			return b.err
		}
		tx = b.tx
	case <-ctx.Done():
		go func() {
			if b := <-ch; b.tx != nil {
				_ = b.tx.Rollback()
			}
		}()
		return ctx.Err()
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := ctx.Err(); err != nil {
		_ = tx.Rollback()
		return err
	}
	if check, ok := fileChecks.Load(db); ok {
		if err := check.(func() error)(); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("fenced write under %s: %w", c, err)
		}
	}
	if err := tx.Commit(); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("fenced write under %s: commit: %w", c, err)
	}
	return nil
}

// beginFenced begins the transaction of Fenced and, for a fenced custody,
// runs the guard. On any error the transaction is already rolled back.
func beginFenced(ctx context.Context, db *sql.DB, c Custody) (*sql.Tx, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("fenced write under %s: begin: %w", c, err)
	}
	if !c.Fenced() {
		// Take the write lock first all the same. A deferred transaction
		// that reads and then writes, when another connection committed a
		// write in between, fails with SQLITE_BUSY at once: SQLite cannot
		// upgrade a stale read snapshot, so the busy timeout never applies
		// (https://sqlite.org/lang_transaction.html, "SQLITE_BUSY").
		if _, err := tx.ExecContext(ctx, writeLockSQL); err != nil {
			_ = tx.Rollback()
			return nil, fmt.Errorf("fenced write under %s: take the write lock: %w", c, err)
		}
		return tx, nil
	}
	res, err := tx.ExecContext(ctx, guardSQL, c.Lease, c.Holder, c.Fence)
	if err != nil {
		_ = tx.Rollback()
		return nil, fmt.Errorf("fenced write under %s: check fence: %w", c, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		_ = tx.Rollback()
		if err != nil {
			return nil, fmt.Errorf("fenced write under %s: check fence: %w", c, err)
		}
		return nil, fmt.Errorf("fenced write under %s: %w", c, ErrSuperseded)
	}
	return tx, nil
}

// writeHealth is, per lease name, the outcome of the latest
// lease-package write to one database.
type writeHealth struct {
	mu     sync.Mutex
	latest map[string]writeOutcome
	// ended holds, per worker (workerWrites), the latest custody this
	// process gave up (CustodyEnded): a write noted under it or an earlier
	// one, finishing late, is not counted.
	ended map[string]int64
}

type writeOutcome struct {
	at  time.Time
	err error // nil: the database took (or answered) the write
	// fence is the custody a worker's write was made under (Fenced); 0
	// for a lease write.
	fence int64
}

// workerWrites names the write health of lease's worker.
func workerWrites(lease string) string { return lease + " worker" }

// fileChecks holds, per *sql.DB, the check Fenced runs before each commit
// (SetFileCheck).
var fileChecks sync.Map

// SetFileCheck makes every Fenced write on db run check just before its
// commit and, when check returns an error, roll back and return it (the
// System registers database.DB.CheckFile, which wraps
// database.ErrFileReplaced: two stats, a few µs). A nil check removes it.
func SetFileCheck(db *sql.DB, check func() error) {
	if check == nil {
		fileChecks.Delete(db)
		return
	}
	fileChecks.Store(db, check)
}

// healths holds one writeHealth per *sql.DB (a process has one or two).
var healths sync.Map

func healthOf(db *sql.DB) *writeHealth {
	if h, ok := healths.Load(db); ok { // no allocation on every write
		return h.(*writeHealth)
	}
	h, _ := healths.LoadOrStore(db, &writeHealth{latest: map[string]writeOutcome{}, ended: map[string]int64{}})
	return h.(*writeHealth)
}

func (h *writeHealth) note(name string, err error) { h.noteFenced(name, 0, err) }

func (h *writeHealth) noteFenced(name string, fence int64, err error) {
	o := writeOutcome{at: time.Now(), fence: fence}
	switch {
	case err == nil, errors.Is(err, ErrSuperseded), database.Refused(err):
	case errors.Is(err, context.Canceled):
		return // the caller gave up; says nothing of the database
	case database.FromDriver(err), errors.Is(err, database.ErrFileReplaced):
		o.err = err
	default:
		return // not the database's error (a worker's own)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if fence > 0 && fence <= h.ended[name] {
		return // a late write of a custody this process has given up
	}
	h.latest[name] = o
}

func (h *writeHealth) err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var name string
	var worst writeOutcome
	for n, o := range h.latest {
		if o.err != nil && (worst.err == nil || o.at.After(worst.at)) {
			name, worst = n, o
		}
	}
	if worst.err == nil {
		return nil
	}
	return fmt.Errorf("database writes (%s) failing since %s: %w", name, worst.at.UTC().Format(time.RFC3339), worst.err)
}

// Note records how a write for name (e.g. "cleanup lease") to db ended in
// db's write health (see Health). Supersession, refusals of the values
// written and errors that are not the database's do not count.
func Note(db *sql.DB, name string, err error) { healthOf(db).note(name, err) }

// CustodyEnded forgets the write health of c's worker when its latest
// write was made under c or an earlier custody: this process holds that
// grant no more (released, or lost), so its worker writes nothing more
// under it, and a failure of its last write must not keep /readyz failing
// after the lease has moved on (or the database has recovered while the
// lease sits with another instance). A write under c (or earlier) that
// ends after this call is not counted either: a worker told to stop may
// still be finishing one. The database's state is still reported by this
// process's lease writes (its acquire attempts), which go on. A failure
// under a later custody is kept. An unfenced custody (Fence 0) changes
// nothing.
func CustodyEnded(db *sql.DB, c Custody) {
	if c.Fence <= 0 {
		return
	}
	h := healthOf(db)
	name := workerWrites(c.Lease)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended[name] = max(h.ended[name], c.Fence)
	if o, ok := h.latest[name]; ok && o.fence <= c.Fence {
		delete(h.latest, name)
	}
}

// Health returns nil unless, for some name, the latest write noted for db
// (by Fenced or Note) failed for a reason of the database. The error names
// the write, the failure and since when; /readyz reports it.
func Health(db *sql.DB) error { return healthOf(db).err() }
