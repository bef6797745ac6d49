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
