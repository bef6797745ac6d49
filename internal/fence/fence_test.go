package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

// An unfenced worker (leases.enabled=false) reads, then writes. Had its
// transaction only read when another connection committed a write, SQLite
// could not upgrade the stale snapshot and would answer SQLITE_BUSY at
// once, whatever busy_timeout says (found from outside: the consumer in
// single-instance mode failed "database is locked" beside any other
// writer). So the unfenced transaction takes the write lock before fn
// runs, like the fence guard: another writer that cannot wait is refused
// while fn runs, and writes once it has committed.
func TestAnUnfencedTransactionHoldsTheWriteLockBeforeItsWorkRuns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	worker := testsupport.OpenDBAt(t, path)
	ctx := context.Background()
	other, err := database.Open(ctx, database.Options{URL: "file:" + path, BusyTimeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := worker.ExecContext(ctx, `CREATE TABLE side (n INTEGER)`); err != nil {
		t.Fatal(err)
	}
	insert := `INSERT INTO side (n) VALUES (1)`
	err = fence.Fenced(ctx, worker, fence.Custody{Lease: "jetstream-consumer"}, func(tx *sql.Tx) error {
		if _, err := other.ExecContext(ctx, insert); err == nil || !database.FromDriver(err) {
			t.Errorf("another writer wrote while the unfenced transaction ran (err %v); want a busy refusal", err)
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM side`).Scan(&n); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, insert)
		return err
	})
	if err != nil {
		t.Fatalf("unfenced write: %v", err)
	}
	if _, err := other.ExecContext(ctx, insert); err != nil {
		t.Fatalf("another writer after the commit: %v", err)
	}
}

// A worker's fenced write into a database file deleted or replaced under
// the process lands where no other instance reads, under a grant the new
// file may already give to another instance: the registered file check
// refuses it at the commit, and nothing of it is kept.
func TestAFailingFileCheckRollsTheFencedWriteBack(t *testing.T) {
	db := testsupport.OpenDB(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE side (n INTEGER)`); err != nil {
		t.Fatal(err)
	}
	// The file moved away under the process: its open handle writes into a
	// file nobody else reads.
	if err := os.Rename(db.Path, db.Path+".moved"); err != nil {
		t.Fatal(err)
	}
	err := fence.Fenced(ctx, db, fence.Custody{Lease: "jetstream-consumer"}, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO side (n) VALUES (1)`)
		return err
	})
	if !errors.Is(err, database.ErrFileReplaced) {
		t.Fatalf("Fenced = %v, want an error wrapping ErrFileReplaced", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM side`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows written = %d (%v), want 0", n, err)
	}
	if db.WriteHealth() == nil {
		t.Error("the refused write is not reported by the write health")
	}
	if err := os.Rename(db.Path+".moved", db.Path); err != nil {
		t.Fatal(err)
	}
	if err := fence.Fenced(ctx, db, fence.Custody{Lease: "jetstream-consumer"}, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO side (n) VALUES (1)`)
		return err
	}); err != nil {
		t.Fatalf("with the check removed: %v", err)
	}
}
