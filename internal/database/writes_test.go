package database

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// Two databases opened in one process share none of their write
// bookkeeping: a failing write recorded on one leaves the other healthy,
// and an urgent write pending on one holds back no transaction of the
// other (nor does its turn).
func TestTwoDatabasesInOneProcessShareNothing(t *testing.T) {
	a := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	b := openTemp(t, filepath.Join(t.TempDir(), "b.db"))
	full := errors.New("failed to execute query\nerror code = 13: database or disk is full")
	if !FromDriver(full) {
		t.Fatal("the test's error is not one of the driver's")
	}
	a.NoteWrite("cleanup lease", 0, full)
	if err := a.WriteHealth(); !errors.Is(err, full) {
		t.Fatalf("a's write health: %v, want the failure", err)
	}
	if err := b.WriteHealth(); err != nil {
		t.Fatalf("b's write health: %v, want nil (a's failure is a's)", err)
	}

	done := a.Urgent()
	defer done()
	release, err := a.UrgentTurn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	b.WaitUrgent(ctx) // nothing pending on b: returns at once
	turn, err := b.UrgentTurn(ctx)
	if err != nil {
		t.Fatalf("b's turn waited for a's: %v", err)
	}
	turn()
	if ctx.Err() != nil {
		t.Fatalf("b waited %s for a's urgent write", time.Since(start))
	}
}
