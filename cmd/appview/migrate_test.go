package main

import (
	"context"
	"database/sql"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/testsupport"
)

// concurrentStarts is how many processes start at once on one new database.
const concurrentStarts = 3

// startAtOnce runs `appview webhooks add` in concurrentStarts processes
// at once with the given environment, and fails unless every one exits 0
// printing the new webhook's id. The command opens and migrates the
// database exactly as serve does (cli.OpenDatabase) and then writes, without
// the cost of starting workers; `leases` would not do, it only reads.
func startAtOnce(t *testing.T, dir string, env []string) {
	t.Helper()
	results := make([]result, concurrentStarts)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runAppview(t, dir, env, "webhooks", "add", "--did", "did:plc:alice",
				"--url", "http://127.0.0.1:9/hook-"+strconv.Itoa(i), "--allow-private")
		}()
	}
	wg.Wait()
	for i, r := range results {
		if id, err := strconv.Atoi(strings.TrimSpace(r.stdout)); r.code != 0 || err != nil || id <= 0 {
			t.Fatalf("process %d: exit %d, stdout %q, stderr:\n%s", i, r.code, r.stdout, r.stderr)
		}
	}
}

func TestProcessesStartingAtOnceOnANewFileMigrateItExactlyOnce(t *testing.T) {
	t.Parallel()
	want := referenceSchema(t)
	for round := 0; round < 5; round++ {
		dir := t.TempDir()
		path := filepath.Join(dir, "shared", "appview.db")
		startAtOnce(t, dir, childEnv("APPVIEW_DATABASE_URL=file:"+path))
		db := testsupport.OpenUnmigrated(t, path)
		assertMigratedOnce(t, db.DB, want)
	}
}

func TestProcessesStartingAtOnceOnANewSqldMigrateItExactlyOnce(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	startAtOnce(t, t.TempDir(), childEnv("APPVIEW_DATABASE_URL="+srv.URL))
	db, err := database.Open(context.Background(), database.Options{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	assertMigratedOnce(t, db.DB, referenceSchema(t))
}

// referenceSchema is the schema one process alone creates.
func referenceSchema(t *testing.T) []string {
	t.Helper()
	db := testsupport.OpenUnmigrated(t, filepath.Join(t.TempDir(), "ref.db"))
	if _, err := db.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return schemaOf(t, db.DB)
}

func schemaOf(t *testing.T, db *sql.DB) []string {
	t.Helper()
	out, err := testsupport.DumpRows(context.Background(), db, `SELECT type, name, COALESCE(sql, '') AS sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'`)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// assertMigratedOnce checks every embedded migration is recorded exactly
// once and the schema is the one a single process creates.
func assertMigratedOnce(t *testing.T, db *sql.DB, want []string) {
	t.Helper()
	migs, err := database.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query("SELECT version, count(*) FROM schema_migrations GROUP BY version ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	var versions []int
	for rows.Next() {
		var v, n int
		if err := rows.Scan(&v, &n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("version %d recorded %d times", v, n)
		}
		versions = append(versions, v)
	}
	rows.Close()
	var wantVersions []int
	for _, m := range migs {
		wantVersions = append(wantVersions, m.Version)
	}
	if !reflect.DeepEqual(versions, wantVersions) {
		t.Errorf("recorded versions %v, want %v", versions, wantVersions)
	}
	if got := schemaOf(t, db); !reflect.DeepEqual(got, want) {
		t.Errorf("schema differs from one process's migration:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
