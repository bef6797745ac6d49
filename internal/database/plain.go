package database

import (
	"regexp"
	"strings"
)

// Plain is err's text with the database driver's own error (go-libsql's
// "failed to execute query QUERY\nerror code = N: ..." and the nesting
// around the cause) replaced by its cause in a few words, for a refusal's
// one line; the whole text belongs in a debug line. The cause is SQLite's
// answer ("SQLite: attempt to write a readonly database"), what the way
// to a libSQL server answered ("Connection refused", "HTTP status=401
// Unauthorized", "Name or service not known"), or nothing when err says
// it all before the driver's part (SQLite could not open the file). Text
// without the driver's is returned as it is.
func Plain(err error) string {
	if err == nil {
		return ""
	}
	full := err.Error()
	leaf := DriverError(err)
	i := strings.LastIndex(full, leaf)
	if leaf == "" || i < 0 {
		return full
	}
	before, after := full[:i], full[i+len(leaf):]
	cause := driverCause(leaf)
	if cause == "" {
		return strings.TrimSuffix(strings.TrimSuffix(before, " "), ":") + after
	}
	return before + cause + after
}

// DriverError is the text of the innermost error of err's chain that
// carries the database driver's own words (go-libsql's "... error code =
// N: ..."), "" when none does: for a debug line.
func DriverError(err error) string {
	var found string
	var walk func(error)
	walk = func(e error) {
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, c := range u.Unwrap() {
				walk(c)
			}
		case interface{ Unwrap() error }:
			if c := u.Unwrap(); c != nil {
				walk(c)
				return
			}
		}
		if t := e.Error(); found == "" && strings.Contains(t, driverMark) {
			found = t
		}
	}
	walk(err)
	return found
}

// osError is the " (os error N)" Rust's io::Error adds to the system's
// words.
var osError = regexp.MustCompile(` \(os error \d+\)$`)

// driverCause is the cause a driver error's text (driverLeaf) says, in a
// few words (see Plain).
func driverCause(text string) string {
	if m := answerText(errorString(text)); m != "" {
		return "SQLite: " + m
	}
	if cantOpen(text) {
		return ""
	}
	if i := strings.Index(text, httpStatus); i >= 0 {
		status, _, _ := strings.Cut(text[i+len(httpStatus)-len("status="):], ",")
		return "HTTP " + strings.TrimRight(status, "`")
	}
	if strings.Contains(text, hranaJSONError) {
		return "the server's answer is not libSQL's (Hrana) JSON"
	}
	// The innermost part of the driver's nesting ("Hrana: `http error:
	// `error trying to connect: tcp connect error: Connection refused (os
	// error 111)``"), and of it what follows the last ": ".
	inner := strings.TrimRight(text, "`")
	if i := strings.LastIndex(inner, "`"); i >= 0 {
		inner = inner[i+1:]
	}
	if i := strings.LastIndex(inner, ": "); i >= 0 {
		inner = inner[i+2:]
	}
	return osError.ReplaceAllString(strings.TrimSpace(inner), "")
}

// errorString is text as an error, for the helpers that take one.
type errorString string

func (e errorString) Error() string { return string(e) }
