package database

import (
	"context"
	"database/sql/driver"
	"math"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func TestInlineSpellsEachParameterAsALiteral(t *testing.T) {
	for _, c := range []struct {
		query string
		args  []any
		want  string
	}{
		{"SELECT ?1, ?2, ?1", []any{"it's", int64(-3)}, "SELECT 'it''s', (-3), 'it''s'"},
		{"SELECT ?, ?", []any{int64(1), true}, "SELECT 1, 1"},
		{"SELECT ?2, ?1, ?", []any{nil, []byte{0xab, 0}, int64(7)}, "SELECT X'ab00', NULL, 7"}, // ? is one above the largest so far
		{"SELECT '?1', \"?1\", `?1`, [?1], ?1 -- ?1\n/* ?1 */", []any{false}, "SELECT '?1', \"?1\", `?1`, [?1], 0 -- ?1\n/* ?1 */"},
		{"SELECT 'a''?1', ?1", []any{"x"}, "SELECT 'a''?1', 'x'"},
		{"SELECT x-?1", []any{int64(-1)}, "SELECT x-(-1)"},
		{"SELECT ?1", []any{int64(math.MaxInt64)}, "SELECT 9223372036854775807"},
		{"SELECT ?1", []any{time.Date(2026, 12, 6, 1, 2, 3, 4, time.UTC)}, "SELECT '2026-12-06T01:02:03.000000004Z'"},
	} {
		got, ok := inline(c.query, named(c.args))
		if !ok || got != c.want {
			t.Errorf("inline(%q, %v) = %q, %v; want %q", c.query, c.args, got, ok, c.want)
		}
	}
}

// What a literal cannot say exactly is bound as given.
func TestInlineLeavesToTheDriverWhatALiteralCannotSay(t *testing.T) {
	for _, c := range []struct {
		query string
		args  []any
	}{
		{"SELECT :a", []any{1}},
		{"SELECT @a, $b", []any{1, 2}},
		{"SELECT ?1", []any{1, 2}},                       // an argument unused
		{"SELECT ?2", []any{1}},                          // an argument missing
		{"SELECT ?1", []any{int64(math.MinInt64)}},       // would read as a REAL
		{"SELECT ?1", []any{1.5}},                        // floats
		{"SELECT ?1", []any{"a\x00b"}},                   // ErrTextNUL's to say
		{"SELECT ?1", []any{string([]byte{0xff, 0xfe})}}, // not UTF-8
	} {
		if got, ok := inline(c.query, named(c.args)); ok {
			t.Errorf("inline(%q, %v) = %q; want it left to the driver", c.query, c.args, got)
		}
	}
}

// A statement spelled with literals stores and finds exactly what the
// same statement bound stores and finds, on SQLite itself.
func TestAnInlinedStatementWritesWhatTheBoundOneWrites(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, Options{URL: "file:" + filepath.Join(t.TempDir(), "a.db"), BusyTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE t (k INTEGER PRIMARY KEY, a, b, c, d, e)`); err != nil {
		t.Fatal(err)
	}
	const insert = `INSERT INTO t (k, a, b, c, d, e) VALUES (?1, ?2, ?3, ?4, ?5, ?6)`
	args := []any{int64(1), "O'Brien -- not a comment", int64(-42), []byte("\x00\x01"), nil, true}
	if _, err := db.Exec(insert, args...); err != nil {
		t.Fatal(err)
	}
	q, ok := inline(insert, named(append([]any{int64(2)}, args[1:]...)))
	if !ok {
		t.Fatal("not inlined")
	}
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	row := func(k int64) []any {
		var a, b, c, d, e any
		if err := db.QueryRow(`SELECT typeof(a) || typeof(b) || typeof(c) || typeof(d) || typeof(e), a, b, c, e FROM t WHERE k = ?1`, k).
			Scan(&a, &b, &c, &d, &e); err != nil {
			t.Fatal(err)
		}
		return []any{a, b, c, d, e}
	}
	if bound, inlined := row(1), row(2); !reflect.DeepEqual(bound, inlined) {
		t.Fatalf("bound %v, inlined %v", bound, inlined)
	}
}

// named gives args the ordinals database/sql does.
func named(args []any) []driver.NamedValue {
	nv := make([]driver.NamedValue, len(args))
	for i, a := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	return nv
}
