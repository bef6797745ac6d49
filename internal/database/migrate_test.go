package database

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
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
	assertRecordedOnce(t, db.DB)
}

// assertRecordedOnce checks that schema_migrations holds every embedded
// migration exactly once, under its name, with a Unix ms timestamp.
func assertRecordedOnce(t *testing.T, db *sql.DB) {
	t.Helper()
	migs, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query("SELECT version, name, applied_at, typeof(applied_at) FROM schema_migrations ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []Migration
	for rows.Next() {
		var m Migration
		var at int64
		var typ string
		if err := rows.Scan(&m.Version, &m.Name, &at, &typ); err != nil {
			t.Fatal(err)
		}
		if typ != "integer" || at < time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli() {
			t.Errorf("version %d applied_at = %d (%s), want an integer Unix ms timestamp", m.Version, at, typ)
		}
		got = append(got, Migration{Version: m.Version, Name: m.Name})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var want []Migration
	for _, m := range migs {
		want = append(want, Migration{Version: m.Version, Name: m.Name})
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("schema_migrations = %+v, want each of %+v once", got, want)
	}
}

// schema returns the database's schema (sqlite_master without SQLite's
// own objects), for comparing two databases.
func schema(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT type, name, COALESCE(sql, '') FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var typ, name, def string
		if err := rows.Scan(&typ, &name, &def); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("type=%q name=%q sql=%q", typ, name, def))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func TestMigrationsAreNumberedFromOneWithoutGaps(t *testing.T) {
	migs, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range migs {
		if m.Version != i+1 || m.Name == "" || len(m.Statements) == 0 {
			t.Errorf("migration %d: version %d name %q, %d statements; want version %d, a name and statements",
				i, m.Version, m.Name, len(m.Statements), i+1)
		}
	}
}

func TestLeasesTableHasTheExactShapeOfTheSpec(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	if _, err := db.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query("SELECT name, type, \"notnull\", pk FROM pragma_table_info('leases') ORDER BY cid")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var name, typ string
		var notNull, pk int
		if err := rows.Scan(&name, &typ, &notNull, &pk); err != nil {
			t.Fatal(err)
		}
		col := name + " " + typ
		if pk == 1 {
			col += " PRIMARY KEY"
		} else if notNull == 1 {
			col += " NOT NULL"
		}
		got = append(got, col)
	}
	want := []string{"name TEXT PRIMARY KEY", "holder TEXT NOT NULL", "fence INTEGER NOT NULL",
		"acquired_at INTEGER NOT NULL", "renewed_at INTEGER NOT NULL", "expires_at INTEGER NOT NULL"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("leases columns = %q, want docs/spec.md §4 %q", got, want)
	}
}

func TestConcurrentMigrateFromSeparateHandlesAppliesEachMigrationOnce(t *testing.T) {
	ref := openTemp(t, filepath.Join(t.TempDir(), "ref.db"))
	if _, err := ref.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := schema(t, ref.DB)
	migs, _ := Migrations()

	for round := 0; round < 5; round++ {
		path := filepath.Join(t.TempDir(), "shared.db")
		// Separate Open calls are separate native database handles, as
		// two processes would have.
		const handles = 4
		dbs := make([]*DB, handles)
		for i := range dbs {
			dbs[i] = openTemp(t, path)
		}
		migrateAtOnce(t, dbs, len(migs))
		if got := schema(t, dbs[0].DB); !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: schema after concurrent migrations differs from a single migration:\n%s\nwant\n%s",
				round, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}

// migrateAtOnce runs Migrate on every handle at the same instant and
// checks that, between them, they applied each of n migrations once and
// recorded each once.
func migrateAtOnce(t *testing.T, dbs []*DB, n int) {
	t.Helper()
	applied := make([][]int, len(dbs))
	errs := make([]error, len(dbs))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, db := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			applied[i], errs[i] = db.Migrate(context.Background())
		}()
	}
	close(start)
	wg.Wait()
	total := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("handle %d: %v", i, err)
		}
		total += len(applied[i])
	}
	if total != n {
		t.Fatalf("applied %v in total, want each of %d migrations once", applied, n)
	}
	assertRecordedOnce(t, dbs[0].DB)
}

func TestAFailingMigrationLeavesNothingBehind(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	ctx := context.Background()
	migs := []Migration{
		{Version: 1, Name: "good", Statements: []string{"CREATE TABLE first (id INTEGER PRIMARY KEY)"}},
		{Version: 2, Name: "bad", Statements: []string{
			"CREATE TABLE second (id INTEGER PRIMARY KEY)",
			"INSERT INTO no_such_table VALUES (1)",
		}},
	}
	if _, err := db.apply(ctx, migs); err == nil || !strings.Contains(err.Error(), "migration 0002_bad statement 2") {
		t.Fatalf("apply = %v, want an error naming migration 0002_bad statement 2", err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE name IN ('first', 'second', 'schema_migrations')").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d of first, second, schema_migrations exist after a failed run, want none (one transaction)", n)
	}
	// Fixed, the same run applies from the start.
	migs[1].Statements = migs[1].Statements[:1]
	if applied, err := db.apply(ctx, migs); err != nil || !reflect.DeepEqual(applied, []int{1, 2}) {
		t.Fatalf("apply after the fix = %v, %v; want [1 2]", applied, err)
	}
}

func TestReadyReportsPendingMigrations(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	ctx := context.Background()
	if err := db.Ready(ctx); err == nil {
		t.Fatal("Ready on a database never migrated returned nil")
	}
	migs, _ := Migrations()
	if _, err := db.apply(ctx, migs[:len(migs)-1]); err != nil {
		t.Fatal(err)
	}
	if err := db.Ready(ctx); err == nil || !strings.Contains(err.Error(), "migrations pending") {
		t.Fatalf("Ready with the last migration missing = %v, want migrations pending", err)
	}
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.Ready(ctx); err != nil {
		t.Fatalf("Ready after migrating: %v", err)
	}
}

func TestMigrateReportsWhatItAppliedAndMigrationsItDoesNotKnow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	db := openTemp(t, path)
	migs, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := db.AppliedMigrations(); len(got) != len(migs) || db.NewerMigrations() != nil {
		t.Fatalf("a new database: applied %v, newer %v; want all %d, none", got, db.NewerMigrations(), len(migs))
	}
	// A newer appview recorded a migration this one does not have.
	newer := migs[len(migs)-1].Version + 1
	if _, err := db.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, 'from_a_newer_version', 0)`, newer); err != nil {
		t.Fatal(err)
	}
	again := openTemp(t, path)
	if _, err := again.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := again.AppliedMigrations(); got != nil {
		t.Fatalf("applied %v on an up-to-date database", got)
	}
	if got := again.NewerMigrations(); len(got) != 1 || got[0] != newer {
		t.Fatalf("newer migrations %v, want [%d]", got, newer)
	}
}

// A database this process migrated whose tables are gone (a libSQL
// server restarted on an empty data directory, a file replaced by an
// empty one) is reported as that, not as a database not answering: it
// answers, and only a restart (which migrates) recovers. One never
// migrated is not.
func TestReadyReportsASchemaLostUnderTheProcess(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	ctx := context.Background()
	if err := db.Ready(ctx); err == nil || errors.Is(err, ErrSchemaLost) {
		t.Fatalf("Ready before any migration = %v, want an error that is not ErrSchemaLost", err)
	}
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `DROP TABLE schema_migrations`); err != nil {
		t.Fatal(err)
	}
	err := db.Ready(ctx)
	if !errors.Is(err, ErrSchemaLost) || !SchemaLost(err) {
		t.Fatalf("Ready after the schema went = %v, want ErrSchemaLost", err)
	}
	_, err = db.ExecContext(ctx, `UPDATE no_such_thing SET x = 1`)
	if !SchemaLost(err) {
		t.Errorf("SchemaLost(%v) = false, want true", err)
	}
}

// A database.url pointing at another program's database is refused, and
// nothing is written into it: appview migrates only an empty database or
// its own (found by a new-user pass: a file with its own leases table
// failed half-way with "table leases already exists").
func TestMigrateRefusesAnotherProgramsDatabaseAndWritesNothing(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "other.db"))
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE leases (id INTEGER PRIMARY KEY, tenant TEXT)`); err != nil {
		t.Fatal(err)
	}
	_, err := db.Migrate(ctx)
	if !errors.Is(err, ErrForeignDatabase) || !strings.Contains(err.Error(), "it has tables (leases) but no schema_migrations") {
		t.Fatalf("Migrate on another program's database: %v, want ErrForeignDatabase naming its tables", err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d tables after the refused migration, want the program's own 1", n)
	}
	// An empty database is migrated, and then again (its own).
	own := openTemp(t, filepath.Join(t.TempDir(), "own.db"))
	for range 2 {
		if _, err := own.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
