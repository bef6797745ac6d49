package main

import (
	"context"
	"time"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/database"
)

// readOnlyTimeout bounds one read-only command's queries.
const readOnlyTimeout = 10 * time.Second

// readOnly is the skeleton of the commands that only read (`leases`,
// `backfill status`): open the existing database (open must neither
// migrate nor create it, cli.OpenExisting), refuse one without table (a
// database no `appview serve` has run against), and run read within
// readOnlyTimeout.
func readOnly(ctx context.Context, open func(context.Context) (*database.DB, error), table string,
	read func(ctx context.Context, db *database.DB) error) error {
	db, err := open(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, readOnlyTimeout)
	defer cancel()
	if err := cli.RequireTable(ctx, db, table); err != nil {
		return err
	}
	return read(ctx, db)
}
