package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
)

// The tests' shorthands for a batch from an unnamed host, and the stored
// time_us alone.

// commitEach is commitEachAt for a batch from an unnamed host.
func commitEach(ctx context.Context, db *sql.DB, c fence.Custody, p *processor.Processor, enqueue enqueueFunc,
	events []jetstream.Event, skip skipFunc) (committed, error) {
	return commitEachAt(ctx, db, c, p, enqueue, "", events, 0, 0, skip)
}

// commitBatch is commitBatchAt for a batch from an unnamed host, its
// position the events' own.
func commitBatch(ctx context.Context, db *sql.DB, c fence.Custody, p *processor.Processor, enqueue enqueueFunc,
	events []jetstream.Event) (committed, error) {
	return commitBatchAt(ctx, db, c, p, enqueue, "", events, 0, 0)
}

// LoadCursor returns the stored cursor (Jetstream time_us of the last fully
// processed event); ok is false when none is stored yet.
func LoadCursor(ctx context.Context, db *sql.DB) (timeUS int64, ok bool, err error) {
	err = db.QueryRowContext(ctx, `SELECT time_us FROM jetstream_cursor WHERE id = 1`).Scan(&timeUS)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("load jetstream cursor: %w", err)
	}
	return timeUS, true, nil
}
