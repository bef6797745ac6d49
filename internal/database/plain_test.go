package database

import (
	"errors"
	"fmt"
	"testing"
)

// A refusal's line says what failed in the project's words and the
// cause in a few; the driver's statement, codes and nesting are left to
// the debug line.
func TestPlainTellsTheDriversCauseInAFewWords(t *testing.T) {
	connect := func(detail string) error {
		return errors.New("failed to connect to database\nerror code = 1: Unable to connect: Failed to connect to database: `" + detail + "`")
	}
	hrana := func(detail string) error {
		return errors.New("failed to execute query SELECT 1\nerror code = 1: Error executing statement: Hrana: `" + detail + "`")
	}
	local := func(msg string) error {
		return errors.New("failed to execute query CREATE TABLE x (a)\nerror code = 2: Error executing statement: SQLite failure: `" + msg + "`")
	}
	cantOpen := connect("Unable to open connection to local database file:/srv/ro/a.db: 14")
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"a directory SQLite cannot write", &faultError{fault: openFault(cantOpen), err: cantOpen},
			"database file cannot be opened (SQLITE_CANTOPEN: a directory that cannot be written, or a path that cannot be created)"},
		{"connection refused", fmt.Errorf("ping: %w", &faultError{fault: "database not answering", err: hrana("http error: `error trying to connect: tcp connect error: Connection refused (os error 111)`")}),
			"ping: database not answering: Connection refused"},
		{"wrong token", &faultError{fault: "database not answering", err: hrana("api error: `status=401 Unauthorized, body=unauthorized`")},
			"database not answering: HTTP status=401 Unauthorized"},
		{"a name that does not resolve", hrana("http error: `error trying to connect: dns error: failed to lookup address information: Name or service not known`"),
			"Name or service not known"},
		{"a web page", hrana("json error: `expected value at line 1 column 1`"), "the server's answer is not libSQL's (Hrana) JSON"},
		{"a migration SQLite refused", fmt.Errorf("migration 3: %w", local("attempt to write a readonly database")),
			"migration 3: SQLite: attempt to write a readonly database"},
		{"SQLite's answer already told", &faultError{fault: "not an SQLite database", err: local("file is not a database")},
			"not an SQLite database (SQLite: file is not a database)"},
		{"no driver text", errors.New("create database directory: mkdir /srv/ro/x: permission denied"),
			"create database directory: mkdir /srv/ro/x: permission denied"},
	} {
		if got := Plain(tc.err); got != tc.want {
			t.Errorf("%s: Plain = %q, want %q", tc.name, got, tc.want)
		}
	}
}
