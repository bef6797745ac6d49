package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atcr-io/appview/config"
	"github.com/atcr-io/appview/database"
)

// openTimeout bounds opening and migrating the database at start.
const openTimeout = 20 * time.Second

// openDatabase opens and migrates the configured database. Any failure is
// a start error naming database.url: the instance refuses to start.
func openDatabase(ctx context.Context, cfg config.Config) (*database.DB, error) {
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	db, err := database.Open(ctx, database.Options{
		URL: cfg.Database.URL, AuthToken: cfg.Database.AuthToken, BusyTimeout: cfg.Database.BusyTimeout,
	})
	if err != nil {
		return nil, refuse("database.url", "cannot open %s: %v", cfg.Database.URL, err)
	}
	err = database.Bounded(ctx, func() error { _, err := db.Migrate(ctx); return err })
	if err != nil {
		db.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s", openTimeout)
		}
		return nil, refuse("database.url", "cannot migrate (is it writable?) %s: %v", cfg.Database.URL, err)
	}
	return db, nil
}

// openExisting opens the configured database for a read-only command
// (`leases`, `webhooks list`): it neither migrates it, so it takes no write
// lock and works while an instance holds one, nor creates it, so a
// mistyped path fails with "no database at PATH" (exit 1) instead of
// printing an empty table. Other failures refuse database.url like serve.
func openExisting(ctx context.Context, cfg config.Config) (*database.DB, error) {
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	db, err := database.Open(ctx, database.Options{
		URL: cfg.Database.URL, AuthToken: cfg.Database.AuthToken, BusyTimeout: cfg.Database.BusyTimeout, MustExist: true,
	})
	if errors.Is(err, database.ErrNoDatabase) {
		return nil, err
	}
	if err != nil {
		return nil, refuse("database.url", "cannot open %s: %v", cfg.Database.URL, err)
	}
	return db, nil
}

// requireTable fails (exit 1) when db has no table named table: a database
// that no instance has migrated yet, or a mistaken database.url, rather
// than an empty result.
func requireTable(ctx context.Context, db *database.DB, table string) error {
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
		return fmt.Errorf("no %s table in %s: has appview serve run against it?", table, where)
	}
	return nil
}
