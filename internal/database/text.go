package database

// Text returns the SQL expression that reads the TEXT expression expr (a
// column such as "t.tag", or any expression yielding text, such as
// "COALESCE(p.description, u.handle)") so its value reaches Go byte for byte:
// "CAST(expr AS BLOB)".
//
// Why: for every TEXT value in a result row, go-libsql's rows.Next tries a
// list of date layouts (RFC 3339, "2006-01-02 15:04:05",
// "2006-01-02T15:04", "2006-01-02", ...) and, when one parses, hands
// database/sql a time.Time instead of the string; scanning that into a
// string formats it with time.RFC3339Nano. A tag "2024-06-01" would read
// back as "2024-06-01T00:00:00Z" and an annotation value
// "2024-06-01T12:00:00.000Z" as "2024-06-01T12:00:00Z". A BLOB is returned
// as []byte, untouched, and database/sql scans []byte into a string,
// []byte, sql.NullString or sql.RawBytes as is; NULL stays NULL. The cast
// only changes the type of the result, never the bytes, so it is lossless
// for any text, date-like or not.
//
// Use it in the select list (and RETURNING) for every TEXT value read into
// Go; comparisons in WHERE, ORDER BY and GROUP BY need no wrapping (the
// rewrite happens only when a row is handed to Go). INTEGER and REAL
// values are never rewritten and must not be wrapped: the cast would hand
// Go the bytes of their decimal text instead of a number.
func Text(expr string) string {
	return "CAST(" + expr + " AS BLOB)"
}
