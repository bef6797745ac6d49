// Package logval bounds the values that reach a log line from input: a
// record, a frame, a URL, a peer's answer, or an error that quotes any of
// them (a database error can quote a whole statement). One such value
// once made a 122 KB log line. Every log call that writes a value taken
// from input passes it through String, Bytes, Err or Error, which keep at most
// MaxBytes bytes and mark what they cut.
package logval

import (
	"strconv"
	"unicode/utf8"
)

// MaxBytes is the most bytes of one value a log line keeps, marker
// excluded.
const MaxBytes = 512

// String returns s when it is at most MaxBytes long; otherwise its first
// MaxBytes bytes (cut back to a whole UTF-8 character) followed by the
// marker "…[truncated N bytes]", N being the bytes cut.
func String(s string) string {
	if len(s) <= MaxBytes {
		return s
	}
	cut := cutAt(s[:MaxBytes+1])
	return s[:cut] + marker(len(s)-cut)
}

// Bytes is String for a byte slice (a frame, a response body); it copies
// only what it keeps.
func Bytes(b []byte) string {
	if len(b) <= MaxBytes {
		return string(b)
	}
	cut := cutAt(string(b[:MaxBytes+1]))
	return string(b[:cut]) + marker(len(b)-cut)
}

// cutAt returns the largest n <= MaxBytes at which prefix (at least
// MaxBytes+1 bytes of the value) can be cut without splitting a UTF-8
// character.
func cutAt(prefix string) int {
	cut := MaxBytes
	for cut > 0 && !utf8.RuneStart(prefix[cut]) && cut > MaxBytes-utf8.UTFMax {
		cut--
	}
	return cut
}

func marker(n int) string { return "…[truncated " + strconv.Itoa(n) + " bytes]" }

// Err is String of err's message, "" for nil.
func Err(err error) string {
	if err == nil {
		return ""
	}
	return String(err.Error())
}

// Error returns err with its message bounded as String bounds it (nil for
// nil), for zerolog's Err: log.Warn().Err(logval.Error(err)). Unwrap gives
// err back, so errors.Is and errors.As still see through it.
func Error(err error) error {
	if err == nil {
		return nil
	}
	return bounded{err}
}

type bounded struct{ err error }

func (b bounded) Error() string { return String(b.err.Error()) }
func (b bounded) Unwrap() error { return b.err }
