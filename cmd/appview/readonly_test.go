package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

// assertFailure checks exit code 1 and exactly one stderr line containing
// each of wants.
func assertFailure(t *testing.T, r result, wants ...string) {
	t.Helper()
	if r.code != cli.ExitFailure {
		t.Errorf("exit code %d, want %d", r.code, cli.ExitFailure)
	}
	if lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n"); len(lines) != 1 {
		t.Fatalf("stderr has %d lines, want exactly one:\n%s", len(lines), r.stderr)
	}
	for _, want := range wants {
		if !strings.Contains(r.stderr, want) {
			t.Fatalf("stderr = %q, want it to contain %q", r.stderr, want)
		}
	}
}

// assertEmptyDir fails when dir holds anything.
func assertEmptyDir(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 0 {
		t.Fatalf("a read-only command left %v in %s", names, dir)
	}
}

// migratedWithLease creates a migrated database at path holding one
// granted lease, and returns it with the grant.
func migratedWithLease(t *testing.T, path string) (*database.DB, fence.Custody) {
	t.Helper()
	db := testsupport.OpenUnmigrated(t, path)
	ctx := context.Background()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return db, testsupport.Custody(t, db, "cleanup", "instance-x", time.Minute)
}

// holdWriteLock takes the database's write lock on one connection of db,
// as a busy instance (or a migration) does, until release is called or
// the test ends.
func holdWriteLock(t *testing.T, db *database.DB) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatalf("take the write lock: %v", err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
				t.Errorf("release the write lock: %v", err)
			}
			conn.Close()
		})
	}
	t.Cleanup(release)
	return release
}

func TestLeasesOnAMissingDatabaseSaysSoAndCreatesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		url  func(dir string) string // "" keeps the default
		want func(dir string) string
	}{
		{"default path", func(string) string { return "" },
			func(string) string { return "no database at ./data/appview.db" }},
		{"mistyped path", func(string) string { return "file:dta/appview.db" },
			func(string) string { return "no database at dta/appview.db" }},
		{"absolute path", func(dir string) string { return "file://localhost" + dir + "/dta/appview.db" },
			func(dir string) string { return "no database at " + dir + "/dta/appview.db" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args := []string{"leases"}
			if u := tc.url(dir); u != "" {
				args = append(args, "--set", "database.url="+u)
			}
			r := runAppview(t, dir, childEnv(), args...)
			assertRefusal(t, r, "database.url", tc.want(dir))
			if r.stdout != "" {
				t.Errorf("printed %q for a database that does not exist", r.stdout)
			}
			assertEmptyDir(t, dir)
		})
	}
}

// A database no appview has migrated is refused without being migrated:
// an empty one asks whether serve ran against it; one with another
// program's tables says it is not an appview database.
func TestLeasesOnADatabaseWithoutALeasesTableAsksWhetherServeRanAgainstIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	empty := testsupport.OpenUnmigrated(t, filepath.Join(dir, "empty.db"))
	for _, q := range []string{"CREATE TABLE t (x)", "DROP TABLE t"} { // a file, with no table
		if _, err := empty.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	r := runAppview(t, dir, childEnv("APPVIEW_DATABASE_URL=file:empty.db"), "leases")
	assertRefusal(t, r, "database.url", "no leases table in empty.db: has appview serve run against it?")
	db := testsupport.OpenUnmigrated(t, filepath.Join(dir, "other.db"))
	if _, err := db.Exec("CREATE TABLE notes (body TEXT)"); err != nil {
		t.Fatal(err)
	}
	r = runAppview(t, dir, childEnv("APPVIEW_DATABASE_URL=file:other.db"), "leases")
	assertRefusal(t, r, "database.url", "other.db is not an appview database: it has tables but no schema_migrations")
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE name = 'leases'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("leases migrated the database (%d leases tables, err %v)", n, err)
	}
}

func TestLeasesPrintsTheTableWhileAnotherProcessHoldsTheWriteLock(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, held := migratedWithLease(t, filepath.Join(dir, "appview.db"))
	holdWriteLock(t, db)
	// A short busy_timeout: a command that wanted the write lock would fail
	// fast instead of waiting for the test's lock.
	env := childEnv("APPVIEW_DATABASE_URL=file:appview.db", "APPVIEW_DATABASE_BUSY_TIMEOUT=200ms")

	r := runAppview(t, dir, env, "leases", "--json")
	if r.code != 0 {
		t.Fatalf("leases --json under a write lock: exit %d, stderr %q", r.code, r.stderr)
	}
	var rows []struct {
		Name   string `json:"name"`
		Holder string `json:"holder"`
		Fence  int64  `json:"fence"`
		State  string `json:"state"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("leases --json: %v\n%s", err, r.stdout)
	}
	if len(rows) != 1 || rows[0].Name != "cleanup" || rows[0].Holder != "instance-x" || rows[0].Fence != held.Fence || rows[0].State != fence.StateHeld {
		t.Fatalf("leases --json = %+v, want cleanup held by instance-x with fence %d", rows, held.Fence)
	}

	r = runAppview(t, dir, env, "leases")
	if r.code != 0 || !strings.Contains(r.stdout, "cleanup") || !strings.Contains(r.stdout, "instance-x") {
		t.Fatalf("leases under a write lock: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestWebhooksListOnlyReads(t *testing.T) {
	t.Parallel()
	t.Run("missing database", func(t *testing.T) {
		dir := t.TempDir()
		r := runAppview(t, dir, childEnv("APPVIEW_DATABASE_URL=file:hooks/appview.db"), "webhooks", "list")
		assertRefusal(t, r, "database.url", "no database at hooks/appview.db")
		assertEmptyDir(t, dir)
	})
	t.Run("another program's database", func(t *testing.T) {
		dir := t.TempDir()
		db := testsupport.OpenUnmigrated(t, filepath.Join(dir, "appview.db"))
		if _, err := db.Exec("CREATE TABLE notes (body TEXT)"); err != nil {
			t.Fatal(err)
		}
		r := runAppview(t, dir, childEnv("APPVIEW_DATABASE_URL=file:appview.db"), "webhooks", "list")
		assertRefusal(t, r, "database.url", "appview.db is not an appview database: it has tables but no schema_migrations")
	})
	t.Run("write lock held", func(t *testing.T) {
		dir := t.TempDir()
		db, _ := migratedWithLease(t, filepath.Join(dir, "appview.db"))
		if _, err := db.Exec(`INSERT INTO webhooks (did, url, created_at) VALUES ('did:plc:alice', 'https://hooks.example/a', 0)`); err != nil {
			t.Fatal(err)
		}
		holdWriteLock(t, db)
		env := childEnv("APPVIEW_DATABASE_URL=file:appview.db", "APPVIEW_DATABASE_BUSY_TIMEOUT=200ms")
		r := runAppview(t, dir, env, "webhooks", "list")
		if r.code != 0 || !strings.Contains(r.stdout, "https://hooks.example/a") {
			t.Fatalf("webhooks list under a write lock: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	})
}
