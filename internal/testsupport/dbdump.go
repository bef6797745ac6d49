// This file renders query results as text lines, so tests can compare
// whole tables between two databases (or two moments) with ==.

package testsupport

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
)

// DumpRows runs query and returns one line per row, sorted: each column as
// name="value" (fmt.Sprint of the scanned value, []byte as a string),
// separated by spaces. Read TEXT columns through database.Text or build
// the query with SelectAll, or go-libsql rewrites date-like text.
func DumpRows(ctx context.Context, db *sql.DB, query string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", query, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var lines []string
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for rows.Next() {
		for i := range vals {
			vals[i], ptrs[i] = nil, &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		parts := make([]string, len(cols))
		for i, v := range vals {
			if b, ok := v.([]byte); ok {
				v = string(b)
			}
			parts[i] = fmt.Sprintf("%s=%q", cols[i], fmt.Sprint(v))
		}
		lines = append(lines, strings.Join(parts, " "))
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sort.Strings(lines)
	return lines, nil
}

// SelectAll returns "SELECT ... FROM table", reading every column of table
// in declared order under its own name, a TEXT value cast to BLOB as database.Text
// does (whatever the column's declared type). It is for code that reads
// whole rows without naming columns, such as dumps and equality checks,
// where SELECT * would let go-libsql rewrite date-like text. Append a
// WHERE or ORDER BY clause as needed. table is trusted (a name from the
// schema, never user input). It returns an error when the schema cannot
// be read or table has no columns.
func SelectAll(ctx context.Context, q querier, table string) (string, error) {
	rows, err := q.QueryContext(ctx, "SELECT "+asBlob("name")+" FROM pragma_table_info(?1) ORDER BY cid", table)
	if err != nil {
		return "", fmt.Errorf("read columns of %s: %w", table, err)
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return "", fmt.Errorf("read columns of %s: %w", table, err)
		}
		id := `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
		cols = append(cols, "CASE typeof("+id+") WHEN 'text' THEN "+asBlob(id)+" ELSE "+id+" END AS "+id)
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("read columns of %s: %w", table, err)
	}
	if len(cols) == 0 {
		return "", fmt.Errorf("read columns of %s: no such table", table)
	}
	return "SELECT " + strings.Join(cols, ", ") + " FROM " + table, nil
}

// querier is *sql.DB, *sql.Conn or *sql.Tx (database.Querier; dbdump does
// not import database, whose own tests use it).
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// asBlob is database.Text: the cast that keeps go-libsql from rewriting
// date-like text.
func asBlob(expr string) string { return "CAST(" + expr + " AS BLOB)" }
