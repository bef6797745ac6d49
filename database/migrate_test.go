package database

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

func openTemp(t *testing.T, path string) *DB {
	t.Helper()
	db, err := Open(context.Background(), Options{URL: "file:" + path, BusyTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestMigrateTwiceAppliesEachMigrationOnce(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	ctx := context.Background()
	first, err := db.Migrate(ctx)
	if err != nil {
		t.Fatalf("first migrate: %v", err)
	}
	migs, _ := Migrations()
	if len(first) != len(migs) {
		t.Fatalf("first run applied %v, want all %d", first, len(migs))
	}
	second, err := db.Migrate(ctx)
	if err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	if len(second) != 0 {
		t.Fatalf("second run applied %v, want none", second)
	}
	if err := db.Ready(ctx); err != nil {
		t.Fatalf("ready after migrate: %v", err)
	}
}
