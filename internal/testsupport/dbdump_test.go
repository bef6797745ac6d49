package testsupport_test

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

func TestSelectAllReadsWholeRowsLosslesslyUnderTheirColumnNames(t *testing.T) {
	db := testsupport.OpenUnmigrated(t, filepath.Join(t.TempDir(), "a.db"))
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE t (id INTEGER, v TEXT, "odd ""name""", b BLOB, r REAL)`); err != nil {
		t.Fatal(err)
	}
	// The untyped column holds text too: testsupport.SelectAll goes by each value's type.
	if _, err := db.Exec(`INSERT INTO t VALUES (1, '2024-06-01', '2024-06-01T12:00:00.000Z', x'00ff', 1.5), (2, NULL, 7, NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	q, err := testsupport.SelectAll(ctx, db, "t")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(q + " ORDER BY id")
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	if !reflect.DeepEqual(cols, []string{"id", "v", `odd "name"`, "b", "r"}) {
		t.Fatalf("columns %q", cols)
	}
	var got [][]any
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		got = append(got, vals)
	}
	want := [][]any{
		{int64(1), []byte("2024-06-01"), []byte("2024-06-01T12:00:00.000Z"), []byte{0, 0xff}, 1.5},
		{int64(2), nil, int64(7), nil, nil},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("rows\n got %#v\nwant %#v", got, want)
	}
}

func TestSelectAllOfAMissingTableIsAnError(t *testing.T) {
	db := testsupport.OpenUnmigrated(t, filepath.Join(t.TempDir(), "a.db"))
	if q, err := testsupport.SelectAll(context.Background(), db, "nope"); err == nil {
		t.Fatalf("testsupport.SelectAll of a missing table = %q, want an error", q)
	}
}
