package main

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
)

const schema = `CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "big count" INTEGER, note TEXT)`

func open(t *testing.T) *sql.DB {
	t.Helper()
	db, err := database.Open(context.Background(), database.Options{
		URL: "file:" + filepath.Join(t.TempDir(), "a.db"), BusyTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(schema); err != nil {
		t.Fatal(err)
	}
	return db.DB
}

func inTx(t *testing.T, db *sql.DB, stmts ...string) {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stmts {
		if _, err := tx.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func dump(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query(`SELECT id, name, "big count", note FROM items ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var (
			id    int64
			name  string
			count sql.NullInt64
			note  sql.NullString
		)
		if err := rows.Scan(&id, &name, &count, &note); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%d %s %v %v\n", id, name, count, note)
	}
	return b.String()
}

func TestEachCutHoldsTheInsertsAndUpdatesOfItsTransactionInOrder(t *testing.T) {
	ctx := context.Background()
	db := open(t)
	rec, err := Install(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	inTx(t, db, `INSERT INTO items (id, name, "big count") VALUES (1, 'a', 1152921504606846977)`,
		`INSERT INTO items (id, name, note) VALUES (2, 'b', 'it''s')`)
	if err := rec.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rec.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	inTx(t, db, `UPDATE items SET name = 'b2' WHERE id = 2`, `DELETE FROM items WHERE id = 1`)
	if err := rec.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	c := rec.Capture()
	want := [][]Row{
		{
			{Table: "items", Values: []any{int64(1), "a", int64(1152921504606846977), nil}},
			{Table: "items", Values: []any{int64(2), "b", nil, "it's"}},
		},
		{},
		{{Table: "items", Values: []any{int64(2), "b2", nil, "it's"}}},
	}
	if !reflect.DeepEqual(c.Batches, want) {
		t.Errorf("batches:\n got %#v\nwant %#v", c.Batches, want)
	}
	if c.Rows() != 3 {
		t.Errorf("Rows() = %d, want 3", c.Rows())
	}
	if got := c.Columns["items"]; !reflect.DeepEqual(got, []string{"id", "name", "big count", "note"}) {
		t.Errorf("columns %q", got)
	}
}

func TestInsertReplaysTheImagesIntoAFreshSchema(t *testing.T) {
	ctx := context.Background()
	src := open(t)
	rec, err := Install(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	inTx(t, src, `INSERT INTO items (id, name, "big count") VALUES (1, 'a', 9007199254740993)`, `INSERT INTO items (id, name) VALUES (2, 'b')`)
	if err := rec.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	inTx(t, src, `UPDATE items SET note = 'n' WHERE id = 1`)
	if err := rec.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	dst := open(t)
	if err := rec.Capture().Insert(ctx, dst); err != nil {
		t.Fatal(err)
	}
	if got, want := dump(t, dst), dump(t, src); got != want {
		t.Errorf("replayed:\n%s\nwant:\n%s", got, want)
	}
}

func TestInsertNamesTheTableARowImageDoesNotFit(t *testing.T) {
	ctx := context.Background()
	src := open(t)
	rec, err := Install(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	inTx(t, src, `INSERT INTO items (id, name) VALUES (1, 'a')`)
	if err := rec.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	dst := open(t)
	if _, err := dst.Exec(`CREATE TRIGGER refuse BEFORE INSERT ON items BEGIN SELECT RAISE(ABORT, 'refused'); END`); err != nil {
		t.Fatal(err)
	}
	err = rec.Capture().Insert(ctx, dst)
	if err == nil || !strings.Contains(err.Error(), "items") {
		t.Fatalf("Insert = %v, want an error naming the table", err)
	}
}
