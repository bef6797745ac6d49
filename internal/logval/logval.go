// Package logval bounds the values that reach a log line from input: a
// record, a frame, a URL, a peer's answer, or an error that quotes any of
// them (a database error can quote a whole statement). One such value
// once made a 122 KB log line. Every log call that writes a value taken
// from input passes it through String, Err or Error, which keep at
// most MaxBytes bytes (from both ends) and mark what they cut.
package logval

import (
	"strconv"
	"unicode/utf8"
)

// MaxBytes is the most bytes of one value a log line keeps, marker
// excluded.
const MaxBytes = 512

// String returns s when it is at most MaxBytes long. Otherwise it keeps
// about MaxBytes/2 bytes from each end (cut at whole UTF-8 characters)
// around the marker "…[truncated N bytes]…", N being the bytes cut: the
// start says what the value is, and the end of an error is usually its
// cause (a database error quotes the statement first and the reason last).
func String(s string) string {
	if len(s) <= MaxBytes {
		return s
	}
	h, t := cuts(s)
	return s[:h] + marker(t-h) + s[t:]
}

// cuts returns where the kept head of v ends and its kept tail starts, for
// len(v) > MaxBytes: MaxBytes/2 bytes each, moved by at most a character's
// length so as not to split one (invalid UTF-8 is cut where it falls).
func cuts(v string) (head, tail int) {
	const half = MaxBytes / 2
	head = half
	for head > half-utf8.UTFMax && !utf8.RuneStart(v[head]) {
		head--
	}
	if !utf8.RuneStart(v[head]) {
		head = half
	}
	tail = len(v) - half
	for tail < len(v)-half+utf8.UTFMax && tail < len(v) && !utf8.RuneStart(v[tail]) {
		tail++
	}
	if tail == len(v) || !utf8.RuneStart(v[tail]) {
		tail = len(v) - half
	}
	return head, tail
}

func marker(n int) string { return "…[truncated " + strconv.Itoa(n) + " bytes]…" }

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
