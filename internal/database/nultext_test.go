package database

import (
	"errors"
	"path/filepath"
	"testing"
)

// TestTextWithANULIsRefusedNotCut: SQLite's C API ends text at a NUL, so
// "v\x00tail" was stored as "v" without a word. Every statement shape
// (plain, in a transaction, prepared, a query's lookup) refuses it, and
// the refusal is an input error (Refused), not a database failure.
func TestTextWithANULIsRefusedNotCut(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	assertNULRefused(t, db)
}

func assertNULRefused(t *testing.T, db *DB) {
	t.Helper()
	if _, err := db.Exec("CREATE TABLE t (k TEXT PRIMARY KEY, v BLOB)"); err != nil {
		t.Fatal(err)
	}
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrTextNUL) || !Refused(err) || Unavailable(err) {
			t.Errorf("%s: err = %v, want ErrTextNUL, refused, not unavailable", what, err)
		}
	}
	_, err := db.Exec("INSERT INTO t (k) VALUES (?)", "v\x00tail")
	refused("exec", err)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec("INSERT INTO t (k) VALUES (?)", "a\x00b")
	refused("exec in a transaction", err)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	st, err := db.Prepare("INSERT INTO t (k) VALUES (?)")
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Exec("x\x00")
	refused("prepared exec", err)
	st.Close()
	// A lookup with the cut key would find the wrong row.
	if _, err := db.Exec("INSERT INTO t (k) VALUES (?)", "v"); err != nil {
		t.Fatal(err)
	}
	var n int
	err = db.QueryRow("SELECT count(*) FROM t WHERE k = ?", "v\x00tail").Scan(&n)
	refused("query", err)
	// A blob may hold any byte; text without a NUL is untouched.
	if _, err := db.Exec("INSERT INTO t (k, v) VALUES (?, ?)", "w", []byte("a\x00b")); err != nil {
		t.Fatalf("a blob with a NUL: %v", err)
	}
	var got []byte
	if err := db.QueryRow("SELECT v FROM t WHERE k = 'w'").Scan(&got); err != nil || string(got) != "a\x00b" {
		t.Fatalf("blob read back %q, %v", got, err)
	}
	if err := db.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows = %d, %v; want 2 (nothing cut was stored)", n, err)
	}
}

func TestDiagnosticKeepsAPeersTextStorable(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	if _, err := db.Exec("CREATE TABLE t (v TEXT)"); err != nil {
		t.Fatal(err)
	}
	got := Diagnostic("bad\x00answer")
	if _, err := db.Exec("INSERT INTO t (v) VALUES (?)", got); err != nil || got != "bad\uFFFDanswer" {
		t.Fatalf("Diagnostic = %q, stored: %v", got, err)
	}
}
