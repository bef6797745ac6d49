package database

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/sqldtest"
)

// sqldStreamExpiry is how long sqld keeps an idle Hrana stream (measured
// against sqld 0.24: alive after 5 s idle, STREAM_EXPIRED after 12 s).
const sqldStreamExpiry = 10 * time.Second

func openRemote(t *testing.T, url string) *DB {
	t.Helper()
	db, err := Open(context.Background(), Options{URL: url})
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// onConns runs SELECT 1 on n distinct pooled connections at once and
// returns the errors.
func onConns(t *testing.T, db *DB, n int) []error {
	t.Helper()
	ctx := context.Background()
	conns := make([]*sql.Conn, n)
	for i := range conns {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatalf("take connection %d: %v", i, err)
		}
		conns[i] = c
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var one int
			errs[i] = c.QueryRowContext(ctx, "SELECT 1").Scan(&one)
		}()
	}
	wg.Wait()
	for _, c := range conns {
		c.Close()
	}
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	return failed
}

func TestRemotePoolHealsAfterTheServerRestarts(t *testing.T) {
	t.Parallel()
	srv := sqldtest.Start(t)
	db := openRemote(t, srv.URL)
	const conns = 4
	if errs := onConns(t, db, conns); len(errs) > 0 {
		t.Fatalf("before the restart: %v", errs)
	}

	srv.Restart()
	// Every pooled connection now holds a stream the new server does not
	// know. Each may fail once; then the pool must be whole again.
	first := onConns(t, db, conns)
	t.Logf("first round after the restart: %d of %d failed", len(first), conns)
	for round := 2; round <= 3; round++ {
		if errs := onConns(t, db, conns); len(errs) > 0 {
			t.Fatalf("round %d after the restart: %d of %d connections failed: %v", round, len(errs), conns, errs[0])
		}
	}
}

func TestRemoteConnectionIdleLongerThanTheServersStreamExpiryStillWorks(t *testing.T) {
	t.Parallel()
	srv := sqldtest.Start(t)
	db := openRemote(t, srv.URL)
	if errs := onConns(t, db, 2); len(errs) > 0 {
		t.Fatal(errs)
	}
	// The idleness itself is under test, so this waits out a duration
	// rather than a condition.
	<-time.After(sqldStreamExpiry + 2*time.Second)
	if errs := onConns(t, db, 2); len(errs) > 0 {
		t.Fatalf("after %s idle: %d connections failed: %v", sqldStreamExpiry+2*time.Second, len(errs), errs[0])
	}
}

func TestRemoteMigrateAndReadyWorkOverSqld(t *testing.T) {
	t.Parallel()
	srv := sqldtest.Start(t)
	db := openRemote(t, srv.URL)
	ctx := context.Background()
	applied, err := db.Migrate(ctx)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	migs, _ := Migrations()
	if len(applied) != len(migs) {
		t.Fatalf("applied %v, want all %d", applied, len(migs))
	}
	if again, err := db.Migrate(ctx); err != nil || len(again) != 0 {
		t.Fatalf("second migrate: %v, %v; want nothing applied", again, err)
	}
	if err := db.Ready(ctx); err != nil {
		t.Fatalf("ready: %v", err)
	}
}

func TestConcurrentMigrateOverSqldAppliesEachMigrationOnce(t *testing.T) {
	t.Parallel()
	srv := sqldtest.Start(t)
	migs, _ := Migrations()
	const handles = 4
	dbs := make([]*DB, handles)
	for i := range dbs {
		dbs[i] = openRemote(t, srv.URL)
	}
	migrateAtOnce(t, dbs, len(migs))
}
