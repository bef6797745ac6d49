package database

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// openPair opens a file database through Open (file connections keep
// compiled statements) and one straight through go-libsql (no wrapper,
// every statement compiled on every call), one connection each: the same
// file when same, else two files side by side.
func openPair(t *testing.T, same bool) (kept *DB, plain *sql.DB) {
	t.Helper()
	dir := t.TempDir()
	path, other := filepath.Join(dir, "a.db"), filepath.Join(dir, "b.db")
	if same {
		other = path
	}
	kept, err := Open(context.Background(), Options{URL: "file:" + path, BusyTimeout: 5 * time.Second, MaxOpenConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kept.Close() })
	c, err := libsqlConnector(fileDSN(other))
	if err != nil {
		t.Fatal(err)
	}
	plain = sql.OpenDB(c)
	plain.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = plain.Close() })
	if rows, err := plain.Query("PRAGMA busy_timeout = 5000"); err != nil {
		t.Fatal(err)
	} else {
		rows.Close()
	}
	return kept, plain
}

// cacheOf returns the statement cache of db's one connection.
func cacheOf(t *testing.T, db *DB) *stmtCache {
	t.Helper()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var c *stmtCache
	if err := conn.Raw(func(dc any) error {
		rc, ok := dc.(*remoteConn)
		if !ok {
			return fmt.Errorf("driver connection is %T", dc)
		}
		c = rc.cache
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestFileConnectionsKeepCompiledStatements(t *testing.T) {
	kept, _ := openPair(t, false)
	c := cacheOf(t, kept)
	if c == nil {
		t.Fatal("a file connection keeps no statements: the go-libsql connection's layout or C API changed (see nativeConn)")
	}
	if _, err := kept.Exec("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)"); err != nil {
		t.Fatal(err)
	}
	const q = "INSERT INTO t (k, v) VALUES (?, ?)"
	for i := range 3 {
		if _, err := kept.Exec(q, i, "x"); err != nil {
			t.Fatal(err)
		}
		_, in := c.byQuery[q]
		if want := i > 0; in != want { // kept from its second compile on
			t.Fatalf("after run %d: kept %v, want %v", i+1, in, want)
		}
	}
	// A statement with more arguments than stmtCacheMaxArgs is never kept.
	big := "SELECT " + InList(stmtCacheMaxArgs+1)
	args := make([]any, stmtCacheMaxArgs+1)
	for i := range args {
		args[i] = i
	}
	for range 2 {
		rows, err := kept.Query(big, args...)
		if err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	if _, in := c.byQuery[big]; in {
		t.Fatal("a statement with too many arguments was kept")
	}
}

// A statement is kept from its second compile on a connection, not its
// first: texts that never come back do not push out the ones that do.
func TestAStatementIsKeptFromItsSecondCompile(t *testing.T) {
	kept, _ := openPair(t, false)
	c := cacheOf(t, kept)
	if c == nil {
		t.Fatal("a file connection keeps no statements")
	}
	const q = "SELECT 2 + ?1 AS kept_later"
	for run := 1; run <= 2; run++ {
		var n int64
		if err := kept.QueryRow(q, 1).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if _, in := c.byQuery[q]; in != (run == 2) {
			t.Errorf("after run %d: kept = %v", run, in)
		}
	}
}

// compare runs the same statement on both and fails if results differ.
func compareExec(t *testing.T, kept *DB, plain *sql.DB, q string, args ...any) {
	t.Helper()
	r1, err1 := kept.Exec(q, args...)
	r2, err2 := plain.Exec(q, args...)
	if (err1 == nil) != (err2 == nil) {
		t.Fatalf("%s: kept err %v, go-libsql err %v", q, err1, err2)
	}
	if err1 != nil {
		if err1.Error() != err2.Error() {
			t.Fatalf("%s: errors differ:\nkept:     %v\ngo-libsql: %v", q, err1, err2)
		}
		return
	}
	n1, _ := r1.RowsAffected()
	n2, _ := r2.RowsAffected()
	id1, _ := r1.LastInsertId()
	id2, _ := r2.LastInsertId()
	if n1 != n2 || id1 != id2 {
		t.Fatalf("%s: kept (changes %d, id %d), go-libsql (changes %d, id %d)", q, n1, id1, n2, id2)
	}
}

func readAll(t *testing.T, q interface {
	Query(string, ...any) (*sql.Rows, error)
}, query string, args ...any) ([]string, [][]any) {
	t.Helper()
	rows, err := q.Query(query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out [][]any
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		out = append(out, vals)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return cols, out
}

// Every statement runs twice on each side: the second run of a kept
// statement is the reused one.
func TestKeptStatementsAnswerAsGoLibsqlDoes(t *testing.T) {
	kept, plain := openPair(t, false)
	for _, db := range []interface {
		Exec(string, ...any) (sql.Result, error)
	}{kept, plain} {
		if _, err := db.Exec(`CREATE TABLE v (k INTEGER PRIMARY KEY, i INTEGER, f REAL, s TEXT, b BLOB, n TEXT UNIQUE)`); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Date(2024, 6, 1, 12, 0, 0, 500, time.UTC)
	for round := range 2 {
		base := int64(round * 100)
		// every argument type go-libsql binds
		compareExec(t, kept, plain, `INSERT INTO v (k, i, f, s, b, n) VALUES (?, ?, ?, ?, ?, ?)`, base+1, int64(-7), 2.5, "héllo", []byte{0, 1, 2}, nil)
		compareExec(t, kept, plain, `INSERT INTO v (k, i, f, s, b, n) VALUES (?, ?, ?, ?, ?, ?)`, base+2, true, 0.0, "", []byte{}, "u1")
		compareExec(t, kept, plain, `INSERT INTO v (k, s, n) VALUES (?, ?, ?)`, base+3, at, "2024-06-01")
		compareExec(t, kept, plain, `INSERT INTO v (k, s) VALUES (?, ?)`, base+4, "2024-06-01 12:00")
		// sql.Named binds by position, as go-libsql does
		compareExec(t, kept, plain, `INSERT INTO v (k, s) VALUES (:a, :b)`, sql.Named("b", base+5), sql.Named("a", "x"))
		// a constraint failure, then the same statement again (reset after a failure)
		compareExec(t, kept, plain, `INSERT INTO v (k, n) VALUES (?, ?)`, base+6, "dup")
		compareExec(t, kept, plain, `INSERT INTO v (k, n) VALUES (?, ?)`, base+7, "dup")
		compareExec(t, kept, plain, `INSERT INTO v (k, n) VALUES (?, ?)`, base+8, fmt.Sprint("n", base+8))
		// a statement returning rows under Exec fails
		compareExec(t, kept, plain, `INSERT INTO v (k) VALUES (?) RETURNING k`, base+9)
		// no arguments, several rows changed
		compareExec(t, kept, plain, `UPDATE v SET i = COALESCE(i, 0) + 1`)
		// unknown argument type
		compareExec(t, kept, plain, `SELECT ?`, struct{}{})
		// more arguments than parameters: the bind fails, naming the argument
		compareExec(t, kept, plain, `INSERT INTO v (k) VALUES (?1)`, base+10, int64(2))
		// long values (the staging grows); a NUL in text is refused before
		// either side binds it (nultext_test.go)
		long := strings.Repeat("ü", 3000)
		compareExec(t, kept, plain, `INSERT INTO v (k, s, b) VALUES (?, ?, ?)`, base+11, long, []byte(long))
		huge := strings.Repeat("x", 200<<10) // above what a connection keeps staged
		compareExec(t, kept, plain, `INSERT INTO v (k, s) VALUES (?, ?)`, base+14, huge)
		compareExec(t, kept, plain, `UPDATE v SET s = ? WHERE k = ?`, "after", base+14)
		compareExec(t, kept, plain, `INSERT INTO v (k, s) VALUES (?, ?)`, base+12, "a b")
		// many arguments
		many := []any{base + 13}
		for i := range 40 {
			many = append(many, int64(i))
		}
		compareExec(t, kept, plain, `INSERT INTO v (k, i) SELECT ?, max(`+strings.TrimSuffix(strings.Repeat("?,", 40), ",")+`)`, many...)
		// syntax error
		compareExec(t, kept, plain, `INSERT INTO nowhere VALUES (?)`, 1)
		compareExec(t, kept, plain, `UPDATE v SET n = NULL WHERE n = 'dup'`)
	}
	for _, q := range []string{
		`SELECT k, i, f, s, b, n FROM v ORDER BY k`,
		`SELECT typeof(s), s FROM v WHERE s IS NOT NULL ORDER BY k`,
		`SELECT count(*) FROM v WHERE k > ?`,
		`SELECT 1 WHERE 0`,
	} {
		for range 2 {
			var args []any
			if strings.Contains(q, "?") {
				args = []any{int64(3)}
			}
			c1, r1 := readAll(t, kept, q, args...)
			c2, r2 := readAll(t, plain, q, args...)
			if !reflect.DeepEqual(c1, c2) || !reflect.DeepEqual(r1, r2) {
				t.Fatalf("%s:\nkept:      %v %v\ngo-libsql: %v %v", q, c1, r1, c2, r2)
			}
		}
	}
}

func TestAKeptStatementBoundWithFewerArgumentsGetsNullInTheRest(t *testing.T) {
	kept, _ := openPair(t, false)
	const q = `SELECT ?1, ?2`
	var a, b any
	for range 2 { // kept after the second compile
		if err := kept.QueryRow(q, "x", "y").Scan(&a, &b); err != nil {
			t.Fatal(err)
		}
	}
	if err := kept.QueryRow(q, "z").Scan(&a, &b); err != nil {
		t.Fatal(err)
	}
	if a != "z" || b != nil {
		t.Fatalf("got %v, %v; want z, <nil> (a fresh statement's NULL, not the last call's y)", a, b)
	}
}

func TestAStatementRunsAgainWhileItsRowsAreOpen(t *testing.T) {
	kept, _ := openPair(t, false)
	ctx := context.Background()
	if _, err := kept.Exec(`CREATE TABLE t (k INTEGER PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := kept.Exec(`INSERT INTO t (k) VALUES (?)`, i); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := kept.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	const q = `SELECT k FROM t WHERE k >= ? ORDER BY k`
	for range 2 { // make it a kept one
		_, rows := readAll(t, tx, q, 0)
		if len(rows) != 5 {
			t.Fatalf("got %d rows", len(rows))
		}
	}
	outer, err := tx.Query(q, 0)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for outer.Next() {
		var k int64
		if err := outer.Scan(&k); err != nil {
			t.Fatal(err)
		}
		_, inner := readAll(t, tx, q, k) // the same text while the outer rows are open
		seen = append(seen, fmt.Sprint(k, ":", len(inner)))
		if _, err := tx.Exec(`UPDATE t SET k = k WHERE k = ?`, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := outer.Close(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(seen, " "); got != "0:5 1:4 2:3 3:2 4:1" {
		t.Fatalf("nested runs: %s", got)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit after nested kept statements: %v", err)
	}
}

func TestAKeptStatementSeesASchemaChangedByAnotherConnection(t *testing.T) {
	kept, plain := openPair(t, true)
	if _, err := kept.Exec(`CREATE TABLE t (a INTEGER)`); err != nil {
		t.Fatal(err)
	}
	const q = `SELECT * FROM t WHERE 1 = ?`
	for range 2 {
		if cols, _ := readAll(t, kept, q, 1); len(cols) != 1 {
			t.Fatalf("columns %v", cols)
		}
	}
	if _, err := plain.Exec(`ALTER TABLE t ADD COLUMN b TEXT`); err != nil {
		t.Fatal(err)
	}
	if cols, _ := readAll(t, kept, q, 1); !reflect.DeepEqual(cols, []string{"a", "b"}) {
		t.Fatalf("after ALTER TABLE on another connection the kept statement reads columns %v", cols)
	}
}

func TestTheCacheDropsTheLeastRecentlyUsedStatements(t *testing.T) {
	kept, _ := openPair(t, false)
	c := cacheOf(t, kept)
	if c == nil {
		t.Skip("no statement cache")
	}
	for i := range stmtCacheSize + 20 {
		q := fmt.Sprintf("SELECT ? + %d", i)
		for range 2 {
			var n int64
			if err := kept.QueryRow(q, 1).Scan(&n); err != nil || n != int64(i+1) {
				t.Fatalf("%s: %d, %v", q, n, err)
			}
		}
	}
	if c.lru.Len() != stmtCacheSize || len(c.byQuery) != stmtCacheSize {
		t.Fatalf("cache holds %d (%d by text), want %d", c.lru.Len(), len(c.byQuery), stmtCacheSize)
	}
	if _, in := c.byQuery["SELECT ? + 0"]; in {
		t.Fatal("the least recently used statement is still kept")
	}
}

func TestBucketAndPad(t *testing.T) {
	for n, want := range map[int]int{1: 1, 2: 2, 3: 4, 5: 8, 8: 8, 9: 16, 500: 512} {
		if got := Bucket(n); got != want {
			t.Errorf("Bucket(%d) = %d, want %d", n, got, want)
		}
	}
	got := Pad([]any{"a", 1, "b", 2, "c", 3}, 2)
	want := []any{"a", 1, "b", 2, "c", 3, "c", 3}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Pad = %v, want %v", got, want)
	}
	if got := Pad(nil, 3); len(got) != 0 {
		t.Errorf("Pad(nil) = %v", got)
	}
	if InList(3) != "?, ?, ?" {
		t.Errorf("InList(3) = %q", InList(3))
	}
}

// BenchmarkUpsert prices one version-checked upsert (the shape of the
// processor's) on a kept statement and compiled on every call, inside
// transactions of 100 as the consumer commits them:
// go test -run '^$' -bench Upsert ./internal/database
func BenchmarkUpsert(b *testing.B) {
	const schema = `CREATE TABLE t (did TEXT NOT NULL, rkey TEXT NOT NULL, body TEXT NOT NULL, version TEXT NOT NULL,
  PRIMARY KEY (did, rkey))`
	const upsert = `INSERT INTO t (did, rkey, body, version) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (did, rkey) DO UPDATE SET body = excluded.body, version = excluded.version
WHERE excluded.version > t.version`
	dir := b.TempDir()
	kept, err := Open(context.Background(), Options{URL: "file:" + filepath.Join(dir, "kept.db"), BusyTimeout: 5 * time.Second, MaxOpenConns: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer kept.Close()
	c, err := libsqlConnector(fileDSN(filepath.Join(dir, "plain.db")))
	if err != nil {
		b.Fatal(err)
	}
	plain := sql.OpenDB(c)
	plain.SetMaxOpenConns(1)
	defer plain.Close()
	for name, db := range map[string]*sql.DB{"kept": kept.DB, "compiled-each-call": plain} {
		if _, err := db.Exec(schema); err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			var tx *sql.Tx
			for i := 0; b.Loop(); i++ {
				if i%100 == 0 {
					if tx != nil {
						if err := tx.Commit(); err != nil {
							b.Fatal(err)
						}
					}
					if tx, err = db.Begin(); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := tx.Exec(upsert, fmt.Sprint("did:plc:", i%500), fmt.Sprint("k", i%5000), "a record body", fmt.Sprint(i)); err != nil {
					b.Fatal(err)
				}
			}
			if tx != nil {
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
