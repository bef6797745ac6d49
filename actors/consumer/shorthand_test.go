package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/rs/zerolog"
)

// The tests' shorthands: a pipeline without a commit budget, a batch from
// an unnamed host, and the stored time_us alone.

// testPipeline is the pipeline of a consumer holding c, without a commit
// budget (each batch is one transaction).
func testPipeline(db *database.DB, c fence.Custody, p *processor.Processor, enqueue enqueueFunc) *pipeline {
	return newPipeline(Options{DB: db, Custody: c, Processor: p, enqueue: enqueue}, zerolog.Nop())
}

// commitBatch commits events from an unnamed host in one transaction
// (pipeline.prefix), its position the events' own.
func commitBatch(ctx context.Context, db *database.DB, c fence.Custody, p *processor.Processor, enqueue enqueueFunc,
	events []jetstream.Event) (committed, error) {
	return testPipeline(db, c, p, enqueue).prefix(ctx, part{events: events})
}

// commitEach commits events from an unnamed host one by one
// (pipeline.each), telling skip about every event it skips.
func commitEach(ctx context.Context, pl *pipeline, events []jetstream.Event, skip skipFunc) (committed, error) {
	pl.skipped = skip
	return pl.each(ctx, part{events: events})
}

// LoadCursor returns the stored cursor (Jetstream time_us of the last fully
// processed event); ok is false when none is stored yet.
func LoadCursor(ctx context.Context, db *database.DB) (timeUS int64, ok bool, err error) {
	err = db.QueryRowContext(ctx, `SELECT time_us FROM jetstream_cursor WHERE id = 1`).Scan(&timeUS)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("load jetstream cursor: %w", err)
	}
	return timeUS, true, nil
}
