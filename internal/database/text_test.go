package database

import (
	"database/sql"
	"path/filepath"
	"testing"
)

// dateLikeTexts are TEXT values go-libsql would otherwise parse as dates:
// one per layout the driver tries, plus user-controlled values seen in
// registry records (a tag, an OCI created annotation).
var dateLikeTexts = []string{
	"2024-06-01",
	"2024-06-01T12:00",
	"2024-06-01 12:00",
	"2024-06-01T12:00:00",
	"2024-06-01 12:00:00",
	"2024-06-01T12:00:00.000",
	"2024-06-01 12:00:00.5",
	"2024-06-01T12:00:00.000Z",
	"2024-06-01T12:00:00+02:00",
	"2024-06-01 12:00:00.000000000-07:00",
}

func TestPlainTextColumnReadLosesADateLikeValue(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	if _, err := db.Exec("CREATE TABLE t (v TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO t (v) VALUES (?1)", "2024-06-01"); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := db.QueryRow("SELECT v FROM t").Scan(&got); err != nil {
		t.Fatal(err)
	}
	// If this ever fails, go-libsql stopped turning TEXT into time.Time and
	// Text is no longer needed (see the package comment).
	if got == "2024-06-01" {
		t.Fatalf("read %q back unchanged: the driver no longer rewrites date-like TEXT", got)
	}
}

func TestTextReadsEveryDateLikeValueBackUnchanged(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	assertTextRoundTrips(t, db)
}

// assertTextRoundTrips stores every date-like value, an empty string,
// non-ASCII text and a NULL, and reads each back through Text into a
// string, a sql.NullString and a []byte.
func assertTextRoundTrips(t *testing.T, db *DB) {
	t.Helper()
	if _, err := db.Exec("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"); err != nil {
		t.Fatal(err)
	}
	values := append([]string{"", "latest", "café ☕", "2024-06-01T12-00"}, dateLikeTexts...)
	for i, v := range values {
		if _, err := db.Exec("INSERT INTO t (id, v) VALUES (?1, ?2)", i, v); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec("INSERT INTO t (id, v) VALUES (?1, NULL)", len(values)); err != nil {
		t.Fatal(err)
	}
	q := "SELECT " + Text("v") + ", " + Text("v") + ", " + Text("v") + " FROM t WHERE id = ?1"
	for i, want := range values {
		var (
			s  string
			ns sql.NullString
			b  []byte
		)
		if err := db.QueryRow(q, i).Scan(&s, &ns, &b); err != nil {
			t.Fatalf("read %q: %v", want, err)
		}
		if s != want || !ns.Valid || ns.String != want || string(b) != want {
			t.Errorf("stored %q, read string %q, NullString %+v, []byte %q", want, s, ns, b)
		}
	}
	var ns sql.NullString
	if err := db.QueryRow("SELECT "+Text("v")+" FROM t WHERE id = ?1", len(values)).Scan(&ns); err != nil {
		t.Fatal(err)
	}
	if ns.Valid {
		t.Errorf("stored NULL, read %+v", ns)
	}
}

func TestTextWorksInReturning(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	if _, err := db.Exec("CREATE TABLE t (v TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := db.QueryRow("INSERT INTO t (v) VALUES (?1) RETURNING "+Text("v"), "2024-06-01").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "2024-06-01" {
		t.Fatalf("RETURNING read %q, want 2024-06-01", got)
	}
}
