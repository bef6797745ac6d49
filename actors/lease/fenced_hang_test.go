package lease

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// TestFencedReturnsWhenItsContextEndsWhileTheDatabaseDoesNotAnswer stands
// in for a partition: another connection holds the write lock, so the
// fence check cannot finish before the busy timeout (5 s, 50 times the
// context). A worker told to stop must not wait for it.
func TestFencedReturnsWhenItsContextEndsWhileTheDatabaseDoesNotAnswer(t *testing.T) {
	ctx := context.Background()
	path := "file:" + filepath.Join(t.TempDir(), "lease.db")
	db, err := database.Open(ctx, database.Options{URL: path, BusyTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := NewStore(db, time.Minute).Acquire(ctx, "l", "a")
	if err != nil || !g.Granted {
		t.Fatalf("acquire: %+v, %v", g, err)
	}
	c := fence.Custody{Lease: "l", Holder: "a", Fence: g.Fence}

	blocker, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	stop, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	ran := false
	err = fence.Fenced(stop, db, c, func(*sql.Tx) error { ran = true; return nil })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fenced = %v; want the context's deadline, not a wait for the lock", err)
	}
	if _, err := blocker.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	blocker.Close()
	// The abandoned fence check finishes and is rolled back; fn never ran,
	// and the next fenced write goes through once it has.
	if err := fence.Fenced(ctx, db, c, func(*sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if ran {
		t.Fatal("fn ran for a Fenced call that had returned the context's error")
	}
}
