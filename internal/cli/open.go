package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
)

// OpenTimeout bounds opening and migrating the database at start.
const OpenTimeout = 20 * time.Second

// OpenDatabase opens and migrates the configured database. Any failure is
// a start error naming database.url: the instance refuses to start.
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
		return nil, Refuse("database.url", "cannot open %s: %v", cfg.Database.URL, noAnswer(err, "opening", within))
	}
	err = database.Bounded(ctx, func() error { _, err := db.Migrate(ctx); return err })
	if err != nil {
		db.Close()
		return nil, Refuse("database.url", "cannot migrate (is it writable?) %s: %v", cfg.Database.URL, noAnswer(err, "migrating", within))
	}
	return db, nil
}

// noAnswer replaces the bare "context deadline exceeded" of an open or
// migration that ran out of its time (within) with what timed out.
func noAnswer(err error, doing string, within time.Duration) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("the database gave no answer within %s while %s it (a server that accepts connections but is stopped or paused?)", within, doing)
	}
	return err
}

// OpenExisting opens the configured database for a read-only command
// (`leases`, `webhooks list`): it neither migrates it, so it takes no write
// lock and works while an instance holds one, nor creates it, so a
// mistyped path is refused with "no database at PATH" instead of printing
// an empty table. Every failure refuses database.url like serve (exit 2:
// an unusable database, nothing ran).
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
		return nil, Refuse("database.url", "cannot open %s: %v", cfg.Database.URL, noAnswer(err, "opening", OpenTimeout))
	}
	return db, nil
}

// RequireTable refuses database.url (exit 2, an unusable database) when
// db has no table named table: a database that no instance has migrated
// yet, or a mistaken database.url, rather than an empty result. Failing to
// read the schema is a runtime failure (exit 1).
func RequireTable(ctx context.Context, db *database.DB, table string) error {
	var n int
	err := database.Bounded(ctx, func() error {
		return db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1`, table).Scan(&n)
	})
	if err != nil {
		return fmt.Errorf("read the schema: %w", err)
	}
	if n == 0 {
		where := db.Path
		if db.Remote {
			where = "the database server"
		}
		return Refuse("database.url", "no %s table in %s: has appview serve run against it?", table, where)
	}
	return nil
}
