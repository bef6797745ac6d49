package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/webhooks"
)

// LeaseName is the lease the consumer runs under (docs/spec.md §4).
const LeaseName = "jetstream-consumer"

// enqueueFunc records webhook deliveries inside the batch transaction
// (webhooks.EnqueueTx; a fake in tests).
type enqueueFunc func(ctx context.Context, tx *sql.Tx, pushes []webhooks.Push) (int, error)

// committed is what one committed batch did.
type committed struct {
	res processor.Result
	// enqueued is the number of webhook deliveries newly recorded.
	enqueued int
	// skipped counts events whose own transaction could not commit (see
	// commitEach); the cursor moved past them.
	skipped int
}

// add merges the effects of a later commit into out.
func (out *committed) add(more committed) {
	out.res.HoldStats = append(out.res.HoldStats, more.res.HoldStats...)
	out.res.NewManifests = append(out.res.NewManifests, more.res.NewManifests...)
	out.enqueued += more.enqueued
	out.skipped += more.skipped
}

// isolable reports whether a failed commit is about the events, so that
// retrying them one by one can get past it: not lost custody, not the end
// of ctx, not the database itself failing (locked, I/O, ...), which would
// fail every retry too and must not cost us events.
func isolable(ctx context.Context, err error) bool {
	return ctx.Err() == nil && !errors.Is(err, fence.ErrSuperseded) && !processor.DatabaseFailure(err)
}

// skipFunc is told about an event commitEach skipped and why.
type skipFunc func(ev *jetstream.Event, err error)

// commitEach is the fallback for a batch whose single commit failed with
// an isolable error (one outside the processor's per-event savepoints: the
// repository_stats refresh, the webhook enqueue, the commit itself). It
// commits the events one by one, each with its deliveries and the cursor
// in its own fenced transaction (commitBatch of one), so one bad row cannot
// stall the stream. An event whose own commit still fails is reported to
// skip and the cursor is moved past it in a fenced transaction of its own.
//
// It returns an error, with the events before it committed, when custody
// is lost (wrapping fence.ErrSuperseded), ctx ends, an event fails with a
// processor.DatabaseFailure, or the cursor cannot be moved past a skipped
// event: the database itself is then broken and the worker must fail.
func commitEach(ctx context.Context, db *sql.DB, c fence.Custody, p *processor.Processor, enqueue enqueueFunc,
	events []jetstream.Event, skip skipFunc) (committed, error) {
	var out committed
	for i := range events {
		one, err := commitBatch(ctx, db, c, p, enqueue, events[i:i+1])
		if err == nil {
			out.add(one)
			continue
		}
		if !isolable(ctx, err) {
			return out, err
		}
		ev := &events[i]
		skip(ev, err)
		last, _ := batchCursor(events[i : i+1])
		if last == 0 {
			out.skipped++
			continue // stamped ahead of the clock: it does not move the cursor
		}
		err = fence.Fenced(ctx, db, c, func(tx *sql.Tx) error {
			return saveCursorTx(ctx, tx, last, last, c.Fence)
		})
		if err != nil {
			return out, fmt.Errorf("move the cursor past skipped event time_us=%d: %w", ev.TimeUS, err)
		}
		out.skipped++
	}
	return out, nil
}

// commitBatch applies events, enqueues their webhook deliveries and
// advances the cursor (see batchCursor), in one transaction that commits
// only under c. Errors wrap fence.ErrSuperseded when custody is lost.
func commitBatch(ctx context.Context, db *sql.DB, c fence.Custody, p *processor.Processor, enqueue enqueueFunc,
	events []jetstream.Event) (committed, error) {
	var out committed
	// Handle lookups are network requests: made before the fenced
	// transaction takes the write lock.
	ctx = p.PrepareBatch(ctx, db, events)
	err := fence.Fenced(ctx, db, c, func(tx *sql.Tx) error {
		res, err := p.ApplyTx(ctx, tx, c, events)
		if err != nil {
			return err
		}
		if len(res.NewManifests) > 0 {
			pushes := make([]webhooks.Push, len(res.NewManifests))
			for i, m := range res.NewManifests {
				pushes[i] = webhooks.Push{
					OwnerDID: m.OwnerDID, Repository: m.Repository, Digest: m.Digest, MediaType: m.MediaType,
					HoldDID: m.HoldDID, HoldEndpoint: m.HoldEndpoint, PushedAt: m.PushedAt, EventKey: m.EventKey(),
				}
			}
			n, err := enqueue(ctx, tx, pushes)
			if err != nil {
				return fmt.Errorf("enqueue webhook deliveries: %w", err)
			}
			out.enqueued = n
		}
		if last, newest := batchCursor(events); last > 0 {
			if err := saveCursorTx(ctx, tx, last, newest, c.Fence); err != nil {
				return err
			}
		}
		out.res = res
		return nil
	})
	if err != nil {
		return committed{}, err
	}
	return out, nil
}

// batchCursor returns the time_us of the batch's last event in stream
// order (the cursor: docs/spec.md §8 "last fully processed event") and the largest
// time_us in the batch. Jetstream's live tail is out of time_us order by a
// few milliseconds, so the last event may be a little older than the
// newest; the cursor is then that event's time_us, as Jetstream's own
// clients record it, but never more than reorderWindow below the newest:
// one event stamped far in the past (a time_us in milliseconds, 1970 as
// microseconds) must not carry the cursor back with it.
//
// An event stamped more than cursorLead ahead of this host's clock is
// applied but moves neither figure: a cursor is only ever a time the
// stream has reached. Were it to move there, a restart would ask
// Jetstream for a cursor ahead of every event still to come, and get
// nothing until then (a backlog skipped; on a live stream, a live tail
// that skips the restart's gap). Both are 0 when no event counts.
func batchCursor(events []jetstream.Event) (last, newest int64) {
	limit := time.Now().Add(cursorLead).UnixMicro()
	for i := range events {
		if t := events[i].TimeUS; t <= limit {
			last, newest = t, max(newest, t)
		}
	}
	if window := reorderWindow.Microseconds(); newest-last > window {
		last = newest - window
	}
	return last, newest
}

// saveCursorSQL stores the last event's time_us (?1), but only when the
// batch reached past the stored cursor (?2 is the batch's newest time_us):
// a rewound replay of events already processed never moves the cursor
// back, so a crash loop cannot walk the resume point backwards one rewind
// at a time. batchCursor leaves out events stamped ahead of the clock;
// as a second guard the stored value is never more than cursorLead ahead
// of the database's clock (?4 is cursorLead in µs), and a stored cursor
// already beyond that (written before these guards) is overwritten by the
// next batch, whatever its times.
const saveCursorSQL = `INSERT INTO jetstream_cursor (id, time_us, updated_at, fence) VALUES (1, MIN(?1, ` + database.NowUS + ` + ?4), ` + database.NowMS + `, ?3)
ON CONFLICT (id) DO UPDATE SET time_us = excluded.time_us, updated_at = excluded.updated_at, fence = excluded.fence
WHERE ?2 > jetstream_cursor.time_us OR jetstream_cursor.time_us > ` + database.NowUS + ` + ?4`

// cursorLead is how far ahead of this host's clock an event may be
// stamped and still move the cursor, and how far ahead a stored or
// resumed cursor may be (see batchCursor, saveCursorSQL and
// consumer.resumeAt): room for the Jetstream server's clock to run a
// little ahead of ours. A host clock slower than that only stops the
// cursor until the clock catches up, which costs an idempotent replay.
const cursorLead = time.Minute

func saveCursorTx(ctx context.Context, tx *sql.Tx, last, newest, fence int64) error {
	if _, err := tx.ExecContext(ctx, saveCursorSQL, last, newest, fence, cursorLead.Microseconds()); err != nil {
		return fmt.Errorf("save jetstream cursor: %w", err)
	}
	return nil
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
