package main

import (
	"context"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
)

// busyTimeout is the busy_timeout of the recording database: nothing else
// writes it, so it only has to be non-zero.
const busyTimeout = 5 * time.Second

// RecordProcessor applies events through processor.Apply, batch events at
// a time (the last batch may be shorter), into a new migrated file
// database at path, and returns every row image the processor wrote, one
// Capture batch per processor batch. The custody is unfenced (Fence 0):
// the fence check is the ingest path's cost, not a row of its result.
// Errors are the database's or the processor's, with the batch's index.
func RecordProcessor(ctx context.Context, path string, events []jetstream.Event, batch int) (*Capture, error) {
	if batch <= 0 {
		return nil, fmt.Errorf("rowcapture: batch size %d: must be positive", batch)
	}
	db, err := database.Open(ctx, database.Options{URL: "file:" + path, BusyTimeout: busyTimeout})
	if err != nil {
		return nil, fmt.Errorf("rowcapture: %w", err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("rowcapture: %w", err)
	}
	rec, err := Install(ctx, db.DB)
	if err != nil {
		return nil, err
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	for i := 0; i < len(events); i += batch {
		if _, err := p.Apply(ctx, db, fence.Custody{Lease: "rowcapture"}, events[i:min(i+batch, len(events))]); err != nil {
			return nil, fmt.Errorf("rowcapture: apply batch %d: %w", i/batch, err)
		}
		if err := rec.Cut(ctx); err != nil {
			return nil, err
		}
	}
	return rec.Capture(), nil
}
