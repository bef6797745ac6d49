package database

import (
	"context"
	"errors"
	"strconv"
	"strings"
)

// go-libsql reports every failure as text with the same error code (2), so
// the classification below reads the text. Three shapes mean that SQLite
// itself answered the statement:
//
//   - a file database: "... SQLite failure: `MESSAGE`"
//   - a libSQL server (Hrana), a statement run: `... Error { message: "SQLite error: MESSAGE", code: "SQLITE_..." }`
//   - a libSQL server, a row fetched (a query, INSERT ... RETURNING): "... cursor error: ... (error code: SQLITE_...) `SQLite error: MESSAGE` ..."
//
// Anything else — "error trying to connect ... Connection refused", an
// HTTP status such as 503, a Hrana stream or transaction error
// (STREAM_EXPIRED, TRANSACTION_TIMEOUT), an invalid baton — means the
// statement never got an answer from the database engine.
const (
	localAnswer  = "SQLite failure: `"
	remoteAnswer = `message: "SQLite error: `
	cursorAnswer = "`SQLite error: "
	// hrana marks every error of a libSQL server connection: an SQL answer
	// (remoteAnswer, cursorAnswer) or a transport one ("Hrana: `http
	// error: ...", "Hrana: `api error: `status=503 ...", a stream error
	// with code STREAM_EXPIRED or TRANSACTION_TIMEOUT).
	hrana = "Hrana: `"
)

// unavailableMessages are SQLite answers that say the database could not
// serve the statement now (another writer held it past busy_timeout, or a
// libSQL server interrupted it), not that the statement was wrong.
var unavailableMessages = []string{
	"database is locked",
	"database table is locked",
	"database is busy",
	"interrupted",
}

// failureMessages are SQLite answers about the database itself: its file,
// its schema, its resources. Repeating the statement with other values
// fails the same way.
var failureMessages = []string{
	"disk i/o error",
	"readonly database",
	"read-only",
	"database or disk is full",
	"out of memory",
	"disk image is malformed",
	"file is not a database",
	"unable to open database",
	"no such table",
	"no such column",
	"no such savepoint",
	"cannot start a transaction",
	"cannot commit",
	"cannot rollback",
}

// ErrSchemaLost means a table the migrations create is missing from a
// database this process migrated: the file or the libSQL server's data
// was wiped or replaced under it (a sqld restarted on an empty data
// directory). Nothing here recreates it while the process runs (the
// fence floors went with it); a restart migrates the new database.
var ErrSchemaLost = errors.New("the database has lost its schema (wiped or replaced under this process); the start of any instance migrates it again")

// SchemaLost reports whether err is the database saying a table does not
// exist ("no such table"): on a database this process migrated, that is
// ErrSchemaLost.
func SchemaLost(err error) bool {
	return err != nil && (errors.Is(err, ErrSchemaLost) || strings.Contains(strings.ToLower(driverText(err)), "no such table"))
}

// remoteFailureCodes and remoteUnavailableCodes are the SQLite result
// codes of a libSQL server's answer that mean the same as failureMessages
// and unavailableMessages. A code matches its extended codes too
// (SQLITE_BUSY_SNAPSHOT).
var (
	remoteFailureCodes = []string{
		"SQLITE_IOERR", "SQLITE_FULL", "SQLITE_READONLY", "SQLITE_NOMEM", "SQLITE_CORRUPT",
		"SQLITE_CANTOPEN", "SQLITE_NOTADB", "SQLITE_PERM", "SQLITE_AUTH",
	}
	remoteUnavailableCodes = []string{"SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_INTERRUPT"}
)

// remoteCode is the SQLite result code of a libSQL server's answer in s
// (a driverText), in either of its shapes, or "".
func remoteCode(s string) string {
	if i := strings.LastIndex(s, `code: "`); i >= 0 {
		code, _, _ := strings.Cut(s[i+len(`code: "`):], `"`)
		return code
	}
	if i := strings.LastIndex(s, "(error code: "); i >= 0 {
		code, _, _ := strings.Cut(s[i+len("(error code: "):], ")")
		return code
	}
	return ""
}

// hasCode reports whether code is one of codes or an extended code of one.
func hasCode(code string, codes []string) bool {
	for _, c := range codes {
		if code == c || strings.HasPrefix(code, c+"_") {
			return true
		}
	}
	return false
}

// driverMark starts the part of a go-libsql error that is the driver's
// own ("failed to execute query QUERY\nerror code = N: ...").
const driverMark = "error code = "

// driverText is the text that classifies err: the driver's own words, from
// the innermost error that carries them and from driverMark on, so that
// neither the query nor anything a caller wrapped around the error (which
// may quote user input: a repository name, an event key) can steer the
// classification. An error without them is classified on its innermost
// text.
func driverText(err error) string {
	var leaves []error
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
			leaves = append(leaves, e)
		default:
			leaves = append(leaves, e)
		}
	}
	walk(err)
	for _, l := range leaves {
		if t := l.Error(); strings.Contains(t, driverMark) {
			return t[strings.LastIndex(t, driverMark):]
		}
	}
	if len(leaves) == 0 {
		return err.Error()
	}
	return leaves[0].Error()
}

// FromDriver reports whether err carries an error of the database driver
// (go-libsql's "error code = N: ..."): the database, or the way to it,
// failed or refused the statement, as opposed to an error of the caller.
func FromDriver(err error) bool {
	return err != nil && strings.Contains(driverText(err), driverMark)
}

// answerText is SQLite's own message in err when the database answered
// (a file database's "SQLite failure: `MESSAGE`", a libSQL server's
// "SQLite error: MESSAGE"), else "".
func answerText(err error) string {
	s := driverText(err)
	if i := strings.Index(s, localAnswer); i >= 0 {
		m, _, _ := strings.Cut(s[i+len(localAnswer):], "`")
		return m
	}
	if i := strings.Index(s, remoteAnswer); i >= 0 {
		m, _, _ := strings.Cut(s[i+len(remoteAnswer):], `"`)
		return m
	}
	if i := strings.Index(s, cursorAnswer); i >= 0 {
		m, _, _ := strings.Cut(s[i+len(cursorAnswer):], "`")
		return m
	}
	return ""
}

// answered reports whether SQLite itself answered the statement that
// failed (see the shapes above); s is its driverText.
func answered(s string) bool {
	return strings.Contains(s, localAnswer) || strings.Contains(s, remoteAnswer) || strings.Contains(s, cursorAnswer)
}

// Refused reports whether err is the database refusing a statement for
// the values it carries: a UNIQUE, NOT NULL, CHECK or FOREIGN KEY
// constraint, a trigger's RAISE, a datatype mismatch, a value too big,
// malformed JSON, a text argument with a NUL byte (ErrTextNUL, refused
// before the statement runs). The same statement with other values can succeed, so a
// caller may skip the one input that caused it and go on.
//
// Everything else is a failure of the database itself, and Refused is
// false: no answer at all (connection refused, an HTTP 5xx, a Hrana stream
// or transaction timeout, a cancelled context), busy or locked past
// busy_timeout, an I/O error, a read-only or full database, a missing
// table. Input must never be skipped over those: the caller retries from
// its checkpoint instead. An unknown shape counts as a failure of the
// database, because skipping on a guess loses data and retrying does not.
func Refused(err error) bool {
	if errors.Is(err, ErrTextNUL) {
		return true // refused before it ran: the value, not the database
	}
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	s := driverText(err)
	if !answered(s) {
		return false
	}
	if code := remoteCode(s); hasCode(code, remoteFailureCodes) || hasCode(code, remoteUnavailableCodes) {
		return false
	}
	msg := strings.ToLower(s)
	for _, list := range [][]string{unavailableMessages, failureMessages} {
		for _, m := range list {
			if strings.Contains(msg, m) {
				return false
			}
		}
	}
	return true
}

// Unavailable reports whether err says the database could not be reached
// or could not serve the statement in time, a condition that can pass by
// itself: a libSQL server that did not answer with SQL (connection
// refused, a name that does not resolve yet, an HTTP 5xx, 408, 425 or
// 429, a Hrana stream or transaction timeout), busy or locked past
// busy_timeout, a statement the server interrupted (SQLITE_INTERRUPT,
// seen from sqld 0.24 under load), or a deadline that ran out.
//
// It is false for an answer that retrying does not change (settled): an
// HTTP 3xx (not followed) or 4xx (a wrong token, a wrong path), a 501 or
// 505 (a web server, not a libSQL server), a 2xx whose body is not
// Hrana's JSON, a TLS connection to a server without TLS (TLSMismatch).
// A start that failed on an unavailable database exits 1, to be
// restarted; on anything else it is refused (exit 2). A lease holder
// that sees only unavailable errors until its renew deadline is in a
// blackout; any other error is the database (or this process) answering
// that something is wrong.
func Unavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	s := driverText(err)
	if hasCode(remoteCode(s), remoteUnavailableCodes) {
		return true
	}
	if strings.Contains(s, hrana) && !answered(s) {
		return !settled(err, s)
	}
	msg := strings.ToLower(s)
	for _, m := range unavailableMessages {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// settled reports whether err, a libSQL server's answer that is not SQL
// (s is its driverText), is one retrying does not change (see
// Unavailable).
func settled(err error, s string) bool {
	if TLSMismatch(err) || strings.Contains(s, hranaJSONError) {
		return true
	}
	code := HTTPStatus(err)
	return code >= 300 && code < 500 && code != 408 && code != 425 && code != 429 || code == 501 || code == 505
}

// AuthRefused reports whether err is a libSQL server refusing this
// process's credentials (database.auth_token): HTTP 401 or 403.
func AuthRefused(err error) bool {
	code := HTTPStatus(err)
	return code == 401 || code == 403
}

// HTTPStatus is the HTTP status of a libSQL server's answer that was not
// SQL ("Hrana: `api error: `status=401 Unauthorized, ..."), or 0.
func HTTPStatus(err error) int {
	if err == nil {
		return 0
	}
	s := driverText(err)
	i := strings.Index(s, httpStatus)
	if i < 0 || len(s) < i+len(httpStatus)+3 {
		return 0
	}
	code, perr := strconv.Atoi(s[i+len(httpStatus) : i+len(httpStatus)+3])
	if perr != nil {
		return 0
	}
	return code
}

// tlsMismatchMessages are what the client's TLS stack says when the peer
// does not speak TLS at all (a libsql:// or https:// URL naming a plain
// HTTP server): rustls's "received corrupt message of type
// InvalidContentType" (go-libsql's Hrana client), Go's and OpenSSL's
// words for the same. Retrying never changes them.
var tlsMismatchMessages = []string{
	"received corrupt message",
	"invalidcontenttype",
	"first record does not look like a tls handshake",
	"wrong version number",
}

// TLSMismatch reports whether err is a TLS connection to a peer that does
// not speak TLS: the URL's scheme is wrong for the server (libsql:// and
// https:// use TLS; http:// and ws:// do not).
func TLSMismatch(err error) bool {
	if err == nil {
		return false
	}
	msg := strings.ToLower(driverText(err))
	for _, m := range tlsMismatchMessages {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// hranaJSONError is how go-libsql's Hrana client reports an answer whose
// body is not the JSON it expects ("Hrana: `json error: expected value
// at line 1 column 1`").
const hranaJSONError = "Hrana: `json error"

// httpStatus precedes the HTTP status of a libSQL server's answer that
// was not SQL ("Hrana: `api error: `status=401 Unauthorized, body=...").
const httpStatus = "api error: `status="
