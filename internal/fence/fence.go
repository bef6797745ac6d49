// Package fence holds the fencing primitives every worker writes through:
// the custody a grant of a lease gives, the transaction that commits only
// under it, and the error that says it was superseded. The LeaseActor
// (actors/lease) grants custody; everything that writes checks it here;
// nothing here knows about actors.
//
// The guarantee: a transaction run by Fenced commits only while its
// custody is the current, unexpired grant of its lease on the database's
// clock (docs/lease.md). Lease rows are written by the LeaseActor's store
// (actors/lease, store.go); this package only reads them: inside the
// guard, and as rows for reports (rows.go).
package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

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
	Lease  string // the lease name (docs/spec.md §4)
	Holder string // this process's instance_id
	// Fence grows by one on every change of custody; 0 is unfenced
	// (leases disabled, or an unleased worker): writes run
	// unconditionally.
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
// current, unexpired custody of its lease on the database's clock: its
// first statement checks the fence and takes the write lock, so no
// takeover can interleave. A failed check runs nothing of fn and returns
// an error wrapping ErrSuperseded. An unfenced custody (Fence 0) takes the
// write lock and checks nothing. It rolls back and returns ctx.Err() when
// ctx ends before the commit (the begin and the check, which the driver
// cannot cancel, are left to finish in the background), and the
// database's error when its file was replaced (database.DB.CheckFile, just
// before the commit). The outcome goes into db's write health (Note).
func Fenced(ctx context.Context, db *database.DB, c Custody, fn func(tx *sql.Tx) error) error {
	err := fenced(ctx, db, c, fn)
	Note(db, WorkerWrites(c.Lease), c.Fence, err)
	return err
}

func fenced(ctx context.Context, db *database.DB, c Custody, fn func(tx *sql.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	type begun struct {
		tx  *sql.Tx
		err error
	}
	// A lease write of this process goes first (database.DB.Urgent).
	db.WaitUrgent(ctx)
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
	if err := db.CheckFile(); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("fenced write under %s: %w", c, err)
	}
	if err := tx.Commit(); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("fenced write under %s: commit: %w", c, err)
	}
	return nil
}

// beginFenced begins the transaction of Fenced and, for a fenced custody,
// runs the guard. On any error the transaction is already rolled back.
func beginFenced(ctx context.Context, db *database.DB, c Custody) (*sql.Tx, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("fenced write under %s: begin: %w", c, err)
	}
	if !c.Fenced() {
		// Take the write lock first all the same: a deferred transaction
		// that reads, then writes after another connection committed,
		// fails with SQLITE_BUSY at once, busy timeout or not
		// (https://sqlite.org/lang_transaction.html).
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

// WorkerWrites and LeaseWrites name, in the write health, the writes of
// lease's worker and of the lease itself (acquire, renewal, release).
func WorkerWrites(lease string) string { return lease + " worker" }

// LeaseWrites: see WorkerWrites.
func LeaseWrites(lease string) string { return lease + " lease" }

// Note records how a write of writer name under fence ended in db's write
// health (database.DB.NoteWrite); a supersession is an answer, not a
// failure.
func Note(db *database.DB, name string, fence int64, err error) {
	if errors.Is(err, ErrSuperseded) {
		err = nil
	}
	db.NoteWrite(name, fence, err)
}

// CustodyEnded forgets the write health of c's worker under c and
// earlier custodies, now and for writes that finish later: this process
// holds that grant no more, and a failure of its worker's last write must
// not keep /readyz failing after the lease moved on.
func CustodyEnded(db *database.DB, c Custody) { db.EndWrites(WorkerWrites(c.Lease), c.Fence) }
