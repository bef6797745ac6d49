package database

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// opensFile opens rawURL, writes to it and checks that the write created
// the file want.
func opensFile(t *testing.T, rawURL, want string) {
	t.Helper()
	db, err := Open(context.Background(), Options{URL: rawURL})
	if err != nil {
		t.Fatalf("Open(%q): %v", rawURL, err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE probe (x INTEGER)"); err != nil {
		t.Fatalf("Open(%q): write: %v", rawURL, err)
	}
	if st, err := os.Stat(want); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("Open(%q) did not create %s: %v", rawURL, want, err)
	}
	if db.Path == "" || db.Remote {
		t.Fatalf("Open(%q): Path %q Remote %v", rawURL, db.Path, db.Remote)
	}
}

func TestEveryFileURLFormOpensTheFileItNames(t *testing.T) {
	work := t.TempDir()
	t.Chdir(work)
	abs := t.TempDir()
	opensFile(t, "file:rel/a.db", filepath.Join(work, "rel", "a.db"))
	opensFile(t, "file:./b.db", filepath.Join(work, "b.db"))
	opensFile(t, "file:"+abs+"/c.db", filepath.Join(abs, "c.db"))
	opensFile(t, "file://"+abs+"/d.db", filepath.Join(abs, "d.db")) // file:///abs: empty authority
	opensFile(t, "file://localhost"+abs+"/e.db", filepath.Join(abs, "e.db"))
	if _, err := os.Stat(filepath.Join(work, "localhost")); !os.IsNotExist(err) {
		t.Fatalf("file://localhost/... created ./localhost (stat: %v): the host was read as a relative directory", err)
	}
}

func TestPercentEscapesInAFileURLAreDecodedOnce(t *testing.T) {
	abs := t.TempDir()
	u := (&url.URL{Scheme: "file", Path: abs + "/my data/100%/a#b?.db"}).String()
	if !strings.Contains(u, "%25") || !strings.Contains(u, "%23") {
		t.Fatalf("test URL %q is not escaped", u)
	}
	opensFile(t, u, filepath.Join(abs, "my data", "100%", "a#b?.db"))
}

func TestOpenRefusesURLsThatCannotHoldSharedLeases(t *testing.T) {
	t.Chdir(t.TempDir())
	for raw, reason := range map[string]string{
		":memory:":                  "in-memory database",
		"file::memory:":             "in-memory database",
		"file:x.db?mode=memory":     "in-memory database",
		"file://db.example/x.db":    `host "db.example"`,
		"file://data/appview.db":    `host "data"`,
		"file:x.db?cache=shared":    "query parameters are not supported",
		"postgres://db.example/app": "scheme must be one of file, http, https, libsql",
	} {
		db, err := Open(context.Background(), Options{URL: raw})
		if err == nil {
			db.Close()
			t.Errorf("Open(%q) succeeded, want a refusal", raw)
			continue
		}
		if !strings.Contains(err.Error(), reason) {
			t.Errorf("Open(%q) = %v, want a reason containing %q", raw, err, reason)
		}
	}
	if entries, _ := os.ReadDir("."); len(entries) != 0 {
		t.Errorf("refused URLs left files behind: %v", entries)
	}
}

func TestMustExistRefusesAMissingFileAndCreatesNothing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "typo", "appview.db")
	db, err := Open(context.Background(), Options{URL: "file:" + path, MustExist: true})
	if err == nil {
		db.Close()
		t.Fatal("Open with MustExist created a database")
	}
	if !errors.Is(err, ErrNoDatabase) || err.Error() != "no database at "+path {
		t.Fatalf("err = %v, want ErrNoDatabase: \"no database at %s\"", err, path)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("MustExist left %v behind", entries)
	}

	// An existing database opens as usual, with its rows.
	mk := openTemp(t, filepath.Join(dir, "there.db"))
	if _, err := mk.Exec("CREATE TABLE t (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	db, err = Open(context.Background(), Options{URL: "file:" + filepath.Join(dir, "there.db"), MustExist: true})
	if err != nil {
		t.Fatalf("MustExist on an existing database: %v", err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE name = 't'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("existing database read %d tables named t, err %v", n, err)
	}
}

// A read-only pool (the read-only commands) changes nothing in the file:
// not even its journal mode, a write that fails in a read-only directory
// (found from outside: `appview leases` refused a database in a directory
// it could read but not write). A write through it fails.
func TestAReadOnlyPoolLeavesTheJournalModeAndRefusesWrites(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "appview.db")
	w, err := Open(ctx, Options{URL: "file:" + path, BusyTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var mode string
	if err := w.QueryRowContext(ctx, `PRAGMA journal_mode = DELETE`).Scan(&mode); err != nil || mode != "delete" {
		t.Fatalf("journal_mode = DELETE: %q, %v", mode, err)
	}
	if _, err := w.ExecContext(ctx, `CREATE TABLE notes (body TEXT)`); err != nil {
		t.Fatal(err)
	}
	w.Close()

	r, err := Open(ctx, Options{URL: "file:" + path, BusyTimeout: time.Second, MustExist: true, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var n int
	if err := r.QueryRowContext(ctx, `SELECT count(*) FROM notes`).Scan(&n); err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := r.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "delete" {
		t.Fatalf("journal_mode after a read-only open = %q (%v), want delete", mode, err)
	}
	if _, err := r.ExecContext(ctx, `INSERT INTO notes (body) VALUES ('x')`); err == nil {
		t.Fatal("a write through a read-only pool landed")
	}
}

// Closing a database while a call the caller gave up on still runs in the
// driver (a stop signal during the start's database open cancelled it)
// waits for that call: libSQL panicked (unwrap on None in database.rs)
// when its database was closed under a running connection.
func TestCloseWaitsForACallItsCallerAbandoned(t *testing.T) {
	db, err := Open(context.Background(), Options{URL: "file:" + filepath.Join(t.TempDir(), "a.db"), BusyTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	abandoned := make(chan error, 1)
	go func() {
		abandoned <- Bounded(ctx, func() error {
			close(started)
			var n int
			// Long enough to be running when Close comes, microseconds
			// after the cancel; short enough to end within closeWait on
			// a loaded host: 2,000,000 rows took over 2 s there and Close
			// gave up on it (ErrCloseAbandoned), as it must.
			return db.QueryRow(`WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 500000) SELECT count(*) FROM c`).Scan(&n)
		})
	}()
	<-started
	cancel()
	if err := <-abandoned; !errors.Is(err, context.Canceled) {
		t.Fatalf("Bounded returned %v, want the cancellation (the query still running)", err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// database/sql's connection opener can still ask for a connection after
// DB.Close; the connector refuses it instead of asking libSQL, which
// panics when asked to connect to a closed database.
func TestAConnectionAskedForAfterCloseIsRefused(t *testing.T) {
	db, err := Open(context.Background(), Options{URL: "file:" + filepath.Join(t.TempDir(), "a.db"), BusyTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if c, err := db.connector.Connect(context.Background()); !errors.Is(err, errClosing) {
		t.Fatalf("Connect after Close = %v, %v; want errClosing", c, err)
	}
}

// A URL naming a directory is refused with that said, whether the
// command would create the database or read it.
func TestADirectoryIsRefusedAsADirectory(t *testing.T) {
	dir := t.TempDir()
	for _, mustExist := range []bool{false, true} {
		db, err := Open(context.Background(), Options{URL: "file:" + dir, BusyTimeout: time.Second, MustExist: mustExist})
		if err == nil {
			db.Close()
			t.Fatalf("MustExist %v: Open of the directory %s succeeded", mustExist, dir)
		}
		if !strings.Contains(err.Error(), dir+" is a directory") {
			t.Fatalf("MustExist %v: err = %v, want it to say %s is a directory", mustExist, err, dir)
		}
	}
}
