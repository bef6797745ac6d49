package database

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// The shapes below are go-libsql's, captured from a file database and from
// sqld 0.24 (see errors.go).
func TestRefusedAndUnavailableClassifyGoLibsqlErrors(t *testing.T) {
	local := func(msg string) error {
		return fmt.Errorf("apply: %w", errors.New("failed to execute query INSERT INTO t\nerror code = 2: Error executing statement: SQLite failure: `"+msg+"`"))
	}
	remote := func(msg, code string) error {
		return errors.New("failed to execute query INSERT INTO t\nerror code = 2: Error executing statement: Hrana: `stream error: `Error { message: \"SQLite error: " + msg + "\", code: \"" + code + "\" }``")
	}
	// A row fetched (a query, INSERT ... RETURNING) fails in another shape.
	cursor := func(msg, code string) error {
		return errors.New("failed to get next row\nerror code = 1: Error fetching next row: Hrana: `cursor error: `error at step 0: (error code: " + code + ") `SQLite error: " + msg + "```")
	}
	transport := func(detail string) error {
		return errors.New("failed to execute query UPDATE leases\nerror code = 1: Error executing statement: Hrana: `" + detail + "`")
	}
	cases := []struct {
		name        string
		err         error
		refused     bool
		unavailable bool
	}{
		{"local unique", local("UNIQUE constraint failed: t.b"), true, false},
		{"local trigger raise", local("tag boom is refused"), true, false},
		{"local mismatch", local("datatype mismatch"), true, false},
		{"local locked", local("database is locked"), false, true},
		{"local io", local("disk I/O error"), false, false},
		{"local readonly", local("attempt to write a readonly database"), false, false},
		{"local missing table", local("no such table: tags"), false, false},
		{"local full", local("database or disk is full"), false, false},
		{"remote constraint", remote("NOT NULL constraint failed: t.b", "SQLITE_CONSTRAINT"), true, false},
		{"remote malformed json", remote("malformed JSON", "SQLITE_UNKNOWN"), true, false},
		{"remote busy", remote("database is locked", "SQLITE_BUSY"), false, true},
		{"remote missing table", remote("no such table: nosuch", "SQLITE_UNKNOWN"), false, false},
		{"remote interrupted", remote("interrupted", "SQLITE_INTERRUPT"), false, true},
		{"remote busy snapshot", remote("database is locked", "SQLITE_BUSY_SNAPSHOT"), false, true},
		{"remote io", remote("disk I/O error", "SQLITE_IOERR_WRITE"), false, false},
		{"cursor constraint", cursor("UNIQUE constraint failed: t.b", "SQLITE_CONSTRAINT"), true, false},
		{"cursor malformed json", cursor("malformed JSON", "SQLITE_UNKNOWN"), true, false},
		{"cursor interrupted", cursor("interrupted", "SQLITE_INTERRUPT"), false, true},
		{"cursor busy", cursor("database is locked", "SQLITE_BUSY"), false, true},
		{"cursor readonly", cursor("attempt to write a readonly database", "SQLITE_READONLY"), false, false},
		{"cursor missing table", cursor("no such table: nosuch", "SQLITE_UNKNOWN"), false, false},
		{"connection refused", transport("http error: `error trying to connect: tcp connect error: Connection refused (os error 111)`"), false, true},
		{"http 503", transport("api error: `status=503 Service Unavailable, body=`"), false, true},
		{"stream expired", transport("stream error: `Error { message: \"The stream has expired due to inactivity\", code: \"STREAM_EXPIRED\" }`"), false, true},
		{"transaction timeout", transport("stream error: `Error { message: \"Transaction timed out\", code: \"TRANSACTION_TIMEOUT\" }`"), false, true},
		{"unknown shape", errors.New("something odd"), false, false},
		// What a caller wraps around the driver's error may quote user
		// input (an event key holds a repository name): it never steers.
		{"user text looking like a refusal, around an outage", fmt.Errorf("enqueue push:did:plc:x/x SQLite failure: `y`@sha256:1: %w",
			transport("http error: `error trying to connect: tcp connect error: Connection refused (os error 111)`")), false, true},
		{"user text looking like a failure, around a refusal", fmt.Errorf("enqueue push:did:plc:x/disk i/o error database is locked: %w",
			local("UNIQUE constraint failed: webhook_deliveries.event_key")), true, false},
		{"joined", errors.Join(errors.New("rollback: database is locked"), local("CHECK constraint failed: c < 10")), true, false},
		{"deadline", fmt.Errorf("renew: %w", context.DeadlineExceeded), false, true},
		{"cancelled", context.Canceled, false, false},
		{"nil", nil, false, false},
	}
	for _, tc := range cases {
		if got := Refused(tc.err); got != tc.refused {
			t.Errorf("%s: Refused = %v, want %v", tc.name, got, tc.refused)
		}
		if got := Unavailable(tc.err); got != tc.unavailable {
			t.Errorf("%s: Unavailable = %v, want %v", tc.name, got, tc.unavailable)
		}
	}
}

// Unavailable is what a start may wait out (exit 1, restarted by the
// service manager) rather than refuse (exit 2), and a lease holder counts
// as a blackout: no answer, or one that may change, not the HTTP answers
// that say the URL or the token is wrong.
func TestUnavailableIsNoAnswerNotAWrongURLOrToken(t *testing.T) {
	local := func(msg string) error {
		return fmt.Errorf("migrate: %w", errors.New("failed to execute query BEGIN IMMEDIATE\nerror code = 2: Error executing statement: SQLite failure: `"+msg+"`"))
	}
	transport := func(detail string) error {
		return errors.New("failed to execute query SELECT 1\nerror code = 1: Error executing statement: Hrana: `" + detail + "`")
	}
	status := func(line string) error { return transport("api error: `status=" + line + ", body=x`") }
	for _, tc := range []struct {
		name      string
		err       error
		transient bool
	}{
		{"connection refused", transport("http error: `error trying to connect: tcp connect error: Connection refused (os error 111)`"), true},
		{"name not resolved yet", transport("http error: `error trying to connect: dns error: failed to lookup address information: Name or service not known`"), true},
		{"no answer in time", fmt.Errorf("open: %w", context.DeadlineExceeded), true},
		{"locked past busy_timeout", local("database is locked"), true},
		{"stream expired", transport("stream error: `Error { message: \"The stream has expired due to inactivity\", code: \"STREAM_EXPIRED\" }`"), true},
		{"503 from a proxy", status("503 Service Unavailable"), true},
		{"502 from a proxy", status("502 Bad Gateway"), true},
		{"500", status("500 Internal Server Error"), true},
		{"408", status("408 Request Timeout"), true},
		{"429", status("429 Too Many Requests"), true},
		{"wrong token", status("401 Unauthorized"), false},
		{"forbidden", status("403 Forbidden"), false},
		{"wrong path", status("404 Not Found"), false},
		{"a web server, not sqld", status("501 Not Implemented"), false},
		// libsql:// or https:// naming a server without TLS (a new user's
		// exit 1, restarted for ever): retrying never changes it.
		// A web server answering 200 with a page or other JSON, and a
		// redirect: exit 1 restarted them for ever (a new user's).
		{"a web page with 200", transport("json error: `expected value at line 1 column 1`"), false},
		{"a redirect", status("308 Permanent Redirect"), false},
		{"tls to a plain http server", transport("http error: `error trying to connect: received corrupt message of type InvalidContentType`"), false},
		{"tls to a plain server, go's words", transport("http error: `tls: first record does not look like a TLS handshake`"), false},
		{"status cut short", transport("api error: `status=5"), true},
		{"unwritable", local("attempt to write a readonly database"), false},
		{"not a database", local("file is not a database"), false},
		{"cannot open", local("unable to open database file"), false},
		{"constraint", local("UNIQUE constraint failed: t.b"), false},
		{"unknown shape", errors.New("database url: scheme must be one of file, http, https, libsql"), false},
		{"cancelled", context.Canceled, false},
		{"nil", nil, false},
	} {
		if got := Unavailable(tc.err); got != tc.transient {
			t.Errorf("%s: Unavailable = %v, want %v", tc.name, got, tc.transient)
		}
	}
}

// openFault words a failed first statement by what the driver said. The
// texts are go-libsql's; the read-only directory one was captured from
// `appview serve` on file:./rodir/a.db in a directory mode 0555.
func TestOpenFaultWordsTheDriversAnswer(t *testing.T) {
	local := func(msg string) error {
		return errors.New("failed to execute query PRAGMA journal_mode = WAL\nerror code = 2: Error executing statement: SQLite failure: `" + msg + "`")
	}
	connect := func(detail string) error {
		return errors.New("failed to connect to database\nerror code = 1: Unable to connect: Failed to connect to database: `" + detail + "`")
	}
	status := func(line string) error {
		return errors.New("failed to execute query SELECT 1\nerror code = 1: Error executing statement: Hrana: `api error: `status=" + line + ", body=x``")
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"read-only directory", connect("Unable to open connection to local database file:./rodir/a.db: 14"),
			"database file cannot be opened (SQLITE_CANTOPEN: a directory that cannot be written, or a path that cannot be created)"},
		{"wrapped", fmt.Errorf("PRAGMA busy_timeout = 5000: %w", connect("Unable to open connection to local database file:/x/a.db: 14")),
			"database file cannot be opened (SQLITE_CANTOPEN: a directory that cannot be written, or a path that cannot be created)"},
		{"text file", local("file is not a database"), "not an SQLite database"},
		{"read-only file", local("attempt to write a readonly database"), "database is read-only here"},
		{"connection refused", errors.New("failed to execute query SELECT 1\nerror code = 1: Error executing statement: Hrana: `http error: `error trying to connect: tcp connect error: Connection refused (os error 111)``"), "database not answering"},
		{"wrong token", status("401 Unauthorized"), "the server refused database.auth_token"},
		{"read-only token", status("403 Forbidden"), "the server refused database.auth_token"},
		{"an admin port", status("404 Not Found"), "not a libSQL server (a wrong host, port or path?)"},
		{"a web page", errors.New("failed to execute query SELECT 1\nerror code = 1: Error executing statement: Hrana: `json error: `expected value at line 1 column 1``"), "not a libSQL server (a wrong host, port or path?)"},
		{"server error", status("503 Service Unavailable"), "database not answering"},
	} {
		if got := openFault(tc.err); got != tc.want {
			t.Errorf("%s: openFault = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A failed first statement reads as what it means and SQLite's own words,
// not the statement and the driver's codes; the driver's error stays
// wrapped for the classifications.
func TestAFaultErrorQuotesSQLiteAndWrapsTheDriversError(t *testing.T) {
	local := errors.New("failed to execute query PRAGMA synchronous = NORMAL\nerror code = 1: Error executing statement: SQLite failure: `file is not a database`")
	remote := errors.New("failed to execute query SELECT 1\nerror code = 2: Error executing statement: Hrana: `stream error: `Error { message: \"SQLite error: no such table: x\", code: \"SQLITE_UNKNOWN\" }``")
	refused := errors.New("failed to execute query SELECT 1\nerror code = 1: Error executing statement: Hrana: `http error: `error trying to connect: tcp connect error: Connection refused (os error 111)``")
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("PRAGMA synchronous = NORMAL: %w", local), "not an SQLite database (SQLite: file is not a database)"},
		{remote, "(SQLite: no such table: x)"},
		{refused, "database not answering: failed to execute query SELECT 1"},
	} {
		err := &faultError{fault: openFault(tc.err), err: tc.err}
		if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "PRAGMA") {
			t.Errorf("%v: Error() = %q, want it to contain %q and no statement", tc.err, err.Error(), tc.want)
		}
		if !errors.Is(err, tc.err) || Unavailable(err) != Unavailable(tc.err) {
			t.Errorf("%v: the driver's error is not kept (Is %v, Unavailable %v against %v)", tc.err, errors.Is(err, tc.err), Unavailable(err), Unavailable(tc.err))
		}
	}
}

// TestARefusalIsRefusedInEveryStatementShape: the database refusing a
// value is Refused, not a failure, whether the statement ran (Exec) or its
// rows were fetched (a query, INSERT ... RETURNING). Over a libSQL server
// the second shape is another text; read as "no answer", a refused event
// written by a RETURNING statement was retried for ever instead of
// skipped (see TestARefusalIsRefusedInEveryStatementShapeOverSqld).
func TestARefusalIsRefusedInEveryStatementShape(t *testing.T) {
	assertRefusalsRefused(t, openTemp(t, filepath.Join(t.TempDir(), "a.db")))
}

func assertRefusalsRefused(t *testing.T, db *DB) {
	t.Helper()
	if _, err := db.Exec("CREATE TABLE r (k INTEGER PRIMARY KEY, v TEXT NOT NULL UNIQUE)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO r (v) VALUES ('taken')"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var k int64
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"exec not null", func() error { _, err := db.Exec("INSERT INTO r (v) VALUES (NULL)"); return err }()},
		{"returning not null", func() error {
			_, err := QueryReturning(ctx, db, "INSERT INTO r (v) VALUES (NULL) RETURNING k", nil, &k)
			return err
		}()},
		{"returning unique", func() error {
			_, err := QueryReturning(ctx, db, "INSERT INTO r (v) VALUES (?) RETURNING k", []any{"taken"}, &k)
			return err
		}()},
		{"query malformed json", db.QueryRow("SELECT json_extract(?, '$.a')", "{").Scan(&k)},
	} {
		if tc.err == nil || !Refused(tc.err) || Unavailable(tc.err) {
			t.Errorf("%s: err = %v; want refused, not unavailable", tc.name, tc.err)
		}
	}
}
