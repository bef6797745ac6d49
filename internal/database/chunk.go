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

// Bucket is how many entries a statement should list for n (n > 0): n
// rounded up to a power of two, so never more than 2n. A statement whose
// IN list or VALUES rows follow its input would otherwise have a new text
// for every length, compiled anew each time; bucketed, it comes in a few
// shapes that each connection keeps compiled (stmtcache.go). The caller
// fills the extra entries by repeating the last one, which is only right
// where a duplicate changes nothing: an IN list, a lookup whose rows land
// in a map, a SELECT DISTINCT.
func Bucket(n int) int {
	b := 1
	for b < n {
		b <<= 1
	}
	return b
}

// Pad returns args extended to Bucket(len(args)/width) rows of width
// values by repeating its last row (see Bucket); args itself when it is
// already that long or empty.
func Pad(args []any, width int) []any {
	rows := len(args) / width
	if rows == 0 {
		return args
	}
	want := Bucket(rows)
	if want == rows {
		return args
	}
	last := args[len(args)-width:]
	for range want - rows {
		args = append(args, last...)
	}
	return args
}

// InList renders the placeholders of an IN list of n entries: "?, ?, ?".
func InList(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
