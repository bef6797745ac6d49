package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/atcr-io/appview/internal/database"
)

// logTable is where the triggers append row images; it is not recorded.
const logTable = "rowcapture_log"

// Row is one row image as a writer left it.
type Row struct {
	// Table is the table written.
	Table string
	// Values are the row's columns in Capture.Columns[Table] order: int64,
	// string or nil.
	Values []any
}

// Capture is every row image of a recorded run, batch by batch.
type Capture struct {
	// Columns are each recorded table's columns, in schema order.
	Columns map[string][]string
	// Batches are the row images of each batch (between two Cuts), in the
	// order they were written.
	Batches [][]Row
}

// Rows is the number of row images over all batches.
func (c *Capture) Rows() int {
	n := 0
	for _, b := range c.Batches {
		n += len(b)
	}
	return n
}

// Insert writes every batch into db (a database with the recorded one's
// schema) with INSERT OR REPLACE, one transaction per batch, one statement
// per row image. It returns the first error, naming the table.
func (c *Capture) Insert(ctx context.Context, db *sql.DB) error {
	queries := make(map[string]string, len(c.Columns))
	for t, cols := range c.Columns {
		queries[t] = fmt.Sprintf("INSERT OR REPLACE INTO %s (%s) VALUES (%s)", quote(t), quoteAll(cols),
			strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", "))
	}
	for i, batch := range c.Batches {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("rowcapture: batch %d: %w", i, err)
		}
		for _, row := range batch {
			if _, err := tx.ExecContext(ctx, queries[row.Table], row.Values...); err != nil {
				_ = tx.Rollback()
				return fmt.Errorf("rowcapture: batch %d: insert into %s: %w", i, row.Table, err)
			}
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("rowcapture: batch %d: commit: %w", i, err)
		}
	}
	return nil
}

// Recorder records the row images written to one database (see Install).
type Recorder struct {
	db   *sql.DB
	last int64
	c    Capture
}

// Install records from now on every row inserted or updated in any table
// of db (a throwaway database: it adds a log table and two triggers per
// table, and never removes them). Errors are the database's.
func Install(ctx context.Context, db *sql.DB) (*Recorder, error) {
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+logTable+` (id INTEGER PRIMARY KEY, tbl TEXT NOT NULL, row TEXT NOT NULL)`); err != nil {
		return nil, fmt.Errorf("rowcapture: create log: %w", err)
	}
	tables, err := database.Column(ctx, db, `SELECT name FROM sqlite_master WHERE type = 'table'
AND name NOT LIKE 'sqlite\_%' ESCAPE '\' AND name <> '`+logTable+`' ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("rowcapture: list tables: %w", err)
	}
	r := &Recorder{db: db, c: Capture{Columns: map[string][]string{}}}
	for _, t := range tables {
		cols, err := database.Column(ctx, db, `SELECT name FROM pragma_table_info(?) ORDER BY cid`, t)
		if err != nil {
			return nil, fmt.Errorf("rowcapture: columns of %s: %w", t, err)
		}
		r.c.Columns[t] = cols
		news := make([]string, len(cols))
		for i, c := range cols {
			news[i] = "NEW." + quote(c)
		}
		for _, op := range []string{"INSERT", "UPDATE"} {
			// One statement per Exec: go-libsql runs only the first of several.
			q := fmt.Sprintf(`CREATE TRIGGER %s AFTER %s ON %s BEGIN INSERT INTO %s (tbl, row) VALUES ('%s', json_array(%s)); END`,
				quote("rowcapture_"+t+"_"+strings.ToLower(op)), op, quote(t), logTable, strings.ReplaceAll(t, "'", "''"),
				strings.Join(news, ", "))
			if _, err := db.ExecContext(ctx, q); err != nil {
				return nil, fmt.Errorf("rowcapture: trigger on %s: %w", t, err)
			}
		}
	}
	return r, nil
}

// Cut ends a batch: the row images written since the previous Cut (or
// Install) become the next batch of the Capture, possibly empty. Call it
// after each committed transaction of the recorded run.
func (r *Recorder) Cut(ctx context.Context) error {
	rows, err := r.db.QueryContext(ctx, `SELECT id, tbl, row FROM `+logTable+` WHERE id > ? ORDER BY id`, r.last)
	if err != nil {
		return fmt.Errorf("rowcapture: read log: %w", err)
	}
	defer rows.Close()
	batch := []Row{}
	for rows.Next() {
		var (
			row  Row
			text []byte
		)
		if err := rows.Scan(&r.last, &row.Table, &text); err != nil {
			return fmt.Errorf("rowcapture: read log: %w", err)
		}
		if row.Values, err = decodeImage(text); err != nil {
			return fmt.Errorf("rowcapture: row image of %s: %w", row.Table, err)
		}
		batch = append(batch, row)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("rowcapture: read log: %w", err)
	}
	r.c.Batches = append(r.c.Batches, batch)
	return nil
}

// Capture returns what was recorded up to the last Cut.
func (r *Recorder) Capture() *Capture { return &r.c }

// decodeImage turns a JSON array written by json_array back into column
// values: integers as int64 (exact past 2^53, where float64 is not), text
// as string, null as nil. SQLite REAL values come back as float64.
func decodeImage(text []byte) ([]any, error) {
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	var vals []any
	if err := dec.Decode(&vals); err != nil {
		return nil, err
	}
	for i, v := range vals {
		n, ok := v.(json.Number)
		if !ok {
			continue
		}
		if x, err := strconv.ParseInt(string(n), 10, 64); err == nil {
			vals[i] = x
		} else if f, err := strconv.ParseFloat(string(n), 64); err == nil {
			vals[i] = f
		} else {
			return nil, fmt.Errorf("number %s: %w", n, err)
		}
	}
	return vals, nil
}

// quote makes a SQL identifier of name.
func quote(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = quote(n)
	}
	return strings.Join(q, ", ")
}
