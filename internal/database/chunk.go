package database

import "strings"

// MaxParams is the most parameters one SQLite statement may bind
// (SQLITE_MAX_VARIABLE_NUMBER's default since SQLite 3.32: 32,766, which
// go-libsql and sqld keep). A statement with more fails with "too many SQL
// variables".
const MaxParams = 32766

// chunkParams is the parameter budget Chunks fills per statement: well
// under MaxParams, so a statement's text (about 3 bytes per parameter)
// stays small for go-libsql's parser and a Hrana request stays small.
const chunkParams = 4096

// Chunks splits n rows of width parameters each, in a statement that also
// binds fixed parameters of its own, into consecutive [lo, hi) ranges small
// enough for one statement, and calls fn for each in order until fn
// returns an error, which it returns. Every statement whose parameter count
// grows with input (multi-row VALUES, IN lists) goes through it, so no
// input can make a statement exceed MaxParams. It panics when one row
// alone (width + fixed) exceeds the budget: a programming error.
func Chunks(n, width, fixed int, fn func(lo, hi int) error) error {
	if width <= 0 || width+fixed > chunkParams {
		panic("database.Chunks: a row of this width does not fit in one statement")
	}
	per := (chunkParams - fixed) / width
	for lo := 0; lo < n; lo += per {
		if err := fn(lo, min(n, lo+per)); err != nil {
			return err
		}
	}
	return nil
}

// Values renders n placeholder tuples of width w for a multi-row VALUES
// list: Values(2, 2) is "(?, ?), (?, ?)".
func Values(n, w int) string {
	tuple := "(" + InList(w) + ")"
	return strings.TrimSuffix(strings.Repeat(tuple+", ", n), ", ")
}

// InList renders the placeholders of an IN list of n entries: "?, ?, ?".
func InList(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
