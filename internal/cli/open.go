package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
)

// OpenTimeout bounds opening and migrating the database at start.
const OpenTimeout = 20 * time.Second

// OpenDatabase opens and migrates the configured database. A failure is
// a start error naming database.url: a refusal (exit 2) when the
// configuration or the database is wrong, a *TransientError (exit 1, to
// be restarted) when the database is only unavailable for now.
func OpenDatabase(ctx context.Context, cfg config.Config) (*database.DB, error) {
	return OpenWithin(ctx, cfg, OpenTimeout)
}

// OpenWithin is OpenDatabase bounded by within instead of OpenTimeout.
func OpenWithin(ctx context.Context, cfg config.Config, within time.Duration) (*database.DB, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	db, err := database.Open(ctx, database.Options{
		URL: cfg.Database.URL, AuthToken: cfg.Database.AuthToken, BusyTimeout: cfg.Database.BusyTimeout,
	})
	if err != nil {
		return nil, refuseDatabase(err, "cannot open %s: %s", cfg.Database.URL, database.Plain(noAnswer(err, "opening", within, cfg.Database.URL)))
	}
	err = database.Bounded(ctx, func() error { _, err := db.Migrate(ctx); return err })
	if err != nil {
		db.Close()
		format := "cannot migrate (is it writable?) %s: %s"
		if database.Unavailable(err) || errors.Is(err, database.ErrForeignDatabase) || errors.Is(err, database.ErrSchemaTooNew) {
			format = "cannot migrate %s: %s" // not a matter of permissions
		}
		return nil, refuseDatabase(err, format, cfg.Database.URL, database.Plain(noAnswer(err, "migrating", within, cfg.Database.URL)))
	}
	return db, nil
}

// refuseDatabase is the start error of a database that could not be
// opened or migrated because of err: a *TransientError (exit 1) when err
// may pass by itself (database.Unavailable: a server not up yet, a write
// lock held past busy_timeout), else a refusal (exit 2) of database.url,
// or of database.auth_token when the server refused it (HTTP 401, 403).
// Its line is format and args (the cause in the project's words,
// database.Plain); err's whole text, the driver's own words, is its
// Detail.
func refuseDatabase(err error, format string, args ...any) error {
	detail := err.Error()
	if d := database.DriverError(err); !strings.Contains(detail, d) {
		detail += "; the driver's error: " + d // what err's text told in its own words
	}
	if database.Unavailable(err) {
		return &TransientError{Key: "database.url", Reason: fmt.Sprintf(format, args...), Detail: detail}
	}
	if database.TLSMismatch(err) {
		format += " (the server does not speak TLS: libsql:// and https:// connect with TLS; use http:// for a server without it)"
	}
	key := "database.url"
	if database.AuthRefused(err) {
		key = "database.auth_token"
	}
	return &StartError{Err: &config.Error{Key: key, Reason: fmt.Sprintf(format, args...)}, Detail: detail}
}

// TransientError is a start that failed on a condition that can pass by
// itself: a database server that is not up yet or does not answer, a
// write lock a backup held past busy_timeout. The configuration is not
// wrong, so it is no *StartError: it exits ExitFailure (1), which a
// service manager restarts (deploy/appview.service prevents a restart
// only after exit 2). Its line names the key and says so.
type TransientError struct {
	// Key is the configuration key of what was unavailable, e.g. "database.url".
	Key string
	// Reason says what failed.
	Reason string
	// Detail is the whole error behind it, for a debug line.
	Detail string
}

func (e *TransientError) Error() string {
	return e.Key + ": unavailable for now, transient (exit 1: try again; a service manager restarts serve): " + e.Reason
}

// noAnswer replaces the bare "context deadline exceeded" of an open or
// migration that ran out of its time (within) with what timed out.
// On a file database the likely cause is another process holding its
// write lock (the wait in SQLite's busy handler is what ran out), on a
// server one that accepts connections and does not answer.
func noAnswer(err error, doing string, within time.Duration, url string) error {
	if !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if loc, perr := database.ParseURL(url); perr == nil && !loc.Remote() {
		return fmt.Errorf("the database gave no answer within %s while %s it (another process holding its write lock: a backup, an sqlite3 shell, an instance migrating it?)", within, doing)
	}
	return fmt.Errorf("the database gave no answer within %s while %s it (a server that accepts connections but is stopped or paused?)", within, doing)
}

// OpenExisting opens the configured database for a read-only command
// (`leases`, `webhooks list`): it neither migrates it, so it takes no write
// lock and works while an instance holds one, nor creates it, so a
// mistyped path is refused with "no database at PATH" instead of printing
// an empty table. A failure names database.url like serve's: exit 2 for
// an unusable database, 1 for one unavailable for now (*TransientError).
func OpenExisting(ctx context.Context, cfg config.Config) (*database.DB, error) {
	ctx, cancel := context.WithTimeout(ctx, OpenTimeout)
	defer cancel()
	db, err := database.Open(ctx, database.Options{
		URL: cfg.Database.URL, AuthToken: cfg.Database.AuthToken, BusyTimeout: cfg.Database.BusyTimeout, MustExist: true, ReadOnly: true,
	})
	if errors.Is(err, database.ErrNoDatabase) {
		return nil, Refuse("database.url", "%v", err)
	}
	if err != nil {
		return nil, refuseDatabase(err, "cannot open %s: %s", cfg.Database.URL, database.Plain(noAnswer(err, "opening", OpenTimeout, cfg.Database.URL)))
	}
	return db, nil
}

// RequireTable refuses database.url (exit 2, an unusable database) when
// db has no table named table: a database that no instance has migrated
// yet, or a mistaken database.url, rather than an empty result. Failing to
// read the schema is a runtime failure (exit 1).
func RequireTable(ctx context.Context, db *database.DB, table string) error {
	var tables []string
	err := database.Bounded(ctx, func() error {
		var err error
		tables, err = database.UserTables(ctx, db)
		return err
	})
	if err != nil {
		return err
	}
	where := db.Path
	if db.Remote {
		where = "the database server"
	}
	switch {
	case database.Foreign(tables): // another program's may have a table of that name
		return Refuse("database.url", "%s is %v: it has tables but no schema_migrations (another program's database?)", where, database.ErrForeignDatabase)
	case !slices.Contains(tables, table):
		return Refuse("database.url", "no %s table in %s: has appview serve run against it?", table, where)
	}
	return nil
}
