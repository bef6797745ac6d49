package database_test

import (
	"context"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/testsupport"
)

func TestRemotePoolHealsAfterTheServerRestarts(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	db := database.OpenRemote(t, srv.URL)
	const conns = 4
	if errs := database.OnConns(t, db, conns); len(errs) > 0 {
		t.Fatalf("before the restart: %v", errs)
	}

	srv.Restart()
	// Every pooled connection now holds a stream the new server does not
	// know. Each may fail once; then the pool must be whole again.
	first := database.OnConns(t, db, conns)
	t.Logf("first round after the restart: %d of %d failed", len(first), conns)
	for round := 2; round <= 3; round++ {
		if errs := database.OnConns(t, db, conns); len(errs) > 0 {
			t.Fatalf("round %d after the restart: %d of %d connections failed: %v", round, len(errs), conns, errs[0])
		}
	}
}

func TestRemoteConnectionIdleLongerThanTheServersStreamExpiryStillWorks(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	db := database.OpenRemote(t, srv.URL)
	if errs := database.OnConns(t, db, 2); len(errs) > 0 {
		t.Fatal(errs)
	}
	// The idleness itself is under test, so this waits out a duration
	// rather than a condition.
	<-time.After(database.SqldStreamExpiry + 2*time.Second)
	if errs := database.OnConns(t, db, 2); len(errs) > 0 {
		t.Fatalf("after %s idle: %d connections failed: %v", database.SqldStreamExpiry+2*time.Second, len(errs), errs[0])
	}
}

func TestRemoteMigrateAndReadyWorkOverSqld(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	db := database.OpenRemote(t, srv.URL)
	ctx := context.Background()
	applied, err := db.Migrate(ctx)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	migs, _ := database.Migrations()
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
	srv := testsupport.StartSQLD(t)
	migs, _ := database.Migrations()
	const handles = 4
	dbs := make([]*database.DB, handles)
	for i := range dbs {
		dbs[i] = database.OpenRemote(t, srv.URL)
	}
	database.MigrateAtOnce(t, dbs, len(migs))
}
func TestTextWithANULIsRefusedNotCutOverSqld(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	database.AssertNULRefused(t, database.OpenRemote(t, srv.URL))
}
func TestTextReadsEveryDateLikeValueBackUnchangedOverSqld(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	database.AssertTextRoundTrips(t, database.OpenRemote(t, srv.URL))
}

// A write with arguments goes to sqld with them written as literals (one
// request, not a describe first): each value comes back with the type
// and bytes a bound argument stores.
func TestAWriteWithArgumentsStoresTheirTypesOverSqld(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	db := database.OpenRemote(t, srv.URL)
	if _, err := db.Exec(`CREATE TABLE t (k INTEGER PRIMARY KEY, a, b, c, d, e, f)`); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 6, 1, 2, 3, 4, time.UTC)
	if _, err := db.Exec(`INSERT INTO t VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)`,
		1, "O'Brien -- not a comment ?2", -42, []byte{0, 1, 0xff}, nil, true, at); err != nil {
		t.Fatal(err)
	}
	var types, a, f string
	var b int64
	var c []byte
	if err := db.QueryRow(`SELECT typeof(a)||typeof(b)||typeof(c)||typeof(d)||typeof(e)||typeof(f), `+
		database.Text("a")+`, b, c, `+database.Text("f")+` FROM t WHERE k = 1 AND e = 1`).Scan(&types, &a, &b, &c, &f); err != nil {
		t.Fatal(err)
	}
	if types != "textintegerblobnullintegertext" || a != "O'Brien -- not a comment ?2" || b != -42 ||
		string(c) != "\x00\x01\xff" || f != at.Format(time.RFC3339Nano) {
		t.Fatalf("stored %s: %q %d %x %q", types, a, b, c, f)
	}
}

func TestARefusalIsRefusedInEveryStatementShapeOverSqld(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	database.AssertRefusalsRefused(t, database.OpenRemote(t, srv.URL))
}
