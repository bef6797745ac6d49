// Package dbdump renders query results as text lines, so tests can compare
// whole tables between two databases (or two moments) with ==.
package dbdump

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
)

// Rows runs query and returns one line per row, sorted: each column as
// name="value" (fmt.Sprint of the scanned value, []byte as a string),
// separated by spaces. Read TEXT columns through database.Text or build
// the query with database.SelectAll, or go-libsql rewrites date-like text.
func Rows(ctx context.Context, db *sql.DB, query string, args ...any) ([]string, error) {
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
