package database

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
)

// ErrTextNUL is the error of a statement given a text argument with a NUL
// byte (U+0000). SQLite's C API takes text as a C string
// (libsql_bind_string, go-libsql's C.CString), which ends at the first
// NUL: such a value would be stored, or looked up, cut short without a
// word, so that "v\x00tail" became "v" and two different keys met on one
// row. Every connection refuses it before the statement runs; Refused
// counts it as the database answering "not this value" (the caller skips
// the input, it does not retry). Callers that take text from outside
// check it first and name the field.
var ErrTextNUL = errors.New("a text argument contains a NUL byte, which SQLite's C API would cut the text at")

// Diagnostic returns s with every NUL byte replaced by U+FFFD, for a
// free-form text a peer may have put anything in (an error message, the
// start of a receiver's answer) that is stored to be read by an
// operator: such text is kept, where a NUL would make the database refuse
// the statement (ErrTextNUL) and fail whatever records it. Never for
// data, which is stored as written or refused.
func Diagnostic(s string) string {
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// textNUL returns an error wrapping ErrTextNUL naming the first argument
// (1-based position) whose string value contains a NUL byte, or nil.
// Blobs ([]byte) may hold any byte and are not checked.
func textNUL(args []driver.NamedValue) error {
	for i, a := range args {
		if s, ok := a.Value.(string); ok && strings.IndexByte(s, 0) >= 0 {
			pos := a.Ordinal
			if pos == 0 {
				pos = i + 1
			}
			return fmt.Errorf("argument %d: %w", pos, ErrTextNUL)
		}
	}
	return nil
}

// textNULValues is textNUL for the positional values of driver.Stmt.
func textNULValues(args []driver.Value) error {
	for i, v := range args {
		if s, ok := v.(string); ok && strings.IndexByte(s, 0) >= 0 {
			return fmt.Errorf("argument %d: %w", i+1, ErrTextNUL)
		}
	}
	return nil
}
