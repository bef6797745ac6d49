package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/fence"

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
	// res carries the HoldStats and NewManifests of what committed (the
	// counts are the processor's metrics).
	res processor.Result
	// enqueued is the number of webhook deliveries newly recorded.
	enqueued int
	// skipped counts events whose own transaction could not commit (see
	// commitEach); the cursor moved past them.
	skipped int
	// stale counts commits skipped as older than their repository's rev.
	stale int
	// syncs counts #sync events queued for a re-read.
	syncs int
	// future counts commits dropped for a rev from the future, the last
	// of them named in lastFuture ("did rev").
	future     int
	lastFuture string
	// session is the processor session of the transaction, whose
	// outcomes are counted (Committed) once it has committed.
	session *processor.TxSession
	// pos is the position the transaction saved for the whole prefix
	// (commitPrefixTx), so the caller need not work it out again; nil
	// when commitEach saved one per event.
	pos *batchPosition
}

// add merges the effects of a later commit into out.
func (out *committed) add(more committed) {
	out.res.HoldStats = append(out.res.HoldStats, more.res.HoldStats...)
	out.res.NewManifests = append(out.res.NewManifests, more.res.NewManifests...)
	out.enqueued += more.enqueued
	out.skipped += more.skipped
	out.stale += more.stale
	out.syncs += more.syncs
	out.future += more.future
	if more.lastFuture != "" {
		out.lastFuture = more.lastFuture
	}
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

// commitEachAt is the fallback for a batch whose single commit failed with
// an isolable error (one outside the processor's per-event savepoints: the
// repository_stats refresh, the webhook enqueue, the commit itself). It
// commits the events one by one, each with its deliveries and the
// position in its own fenced transaction (commitBatchAt of one), so one
// bad row cannot stall the stream. An event whose own commit still fails
// is reported to skip and the position is moved past it in a fenced
// transaction of its own. maxSeq is the batch's Batch.MaxSeq (the last
// event carries it, so frames skipped after it are passed too); high is
// as for positionOf.
//
// It returns an error, with the events before it committed, when custody
// is lost (wrapping fence.ErrSuperseded), ctx ends, an event fails with a
// processor.DatabaseFailure, or the position cannot be moved past a
// skipped event: the database itself is then broken and the worker must
// fail.
func commitEachAt(ctx context.Context, db *sql.DB, c fence.Custody, p *processor.Processor, enqueue enqueueFunc,
	host string, events []jetstream.Event, maxSeq, high int64, skip skipFunc) (committed, error) {
	var out committed
	for i := range events {
		seq := events[i].Seq
		if i == len(events)-1 {
			seq = max(seq, maxSeq)
		}
		one, err := commitBatchAt(ctx, db, c, p, enqueue, host, events[i:i+1], seq, high)
		if _, newest := batchCursor(events[i : i+1]); newest > high {
			high = newest
		}
		if err == nil {
			out.add(one)
			continue
		}
		if !isolable(ctx, err) {
			return out, err
		}
		ev := &events[i]
		skip(ev, err)
		pos := positionOf(host, events[i:i+1], seq, high)
		if pos.last == 0 && pos.seq == 0 {
			out.skipped++
			continue // stamped ahead of the clock: it does not move the position
		}
		err = fence.Fenced(ctx, db, c, func(tx *sql.Tx) error {
			return savePositionTx(ctx, tx, pos, c.Fence)
		})
		if err != nil {
			return out, fmt.Errorf("move the position past skipped event time_us=%d seq=%d: %w", ev.TimeUS, ev.Seq, err)
		}
		out.skipped++
	}
	return out, nil
}

// positionOf is where a batch from host moves the position: maxSeq (or
// the events' highest seq), batchCursor's times and the shared time.
//
// high is the largest time_us already committed from host earlier on the
// same stream (by this incarnation; 0: none). The batch continues that
// stream, so its cursor is what it would have been had both been one
// batch: its last event's time_us, never more than reorderWindow below
// the newest time_us reached so far (pos.reached). Without it, a batch
// split between an event and the slightly older events Jetstream sent
// after it (the live tail is out of time_us order) left the position on
// the newer event for good: the later batch's own newest time_us was
// below the stored one, so it never moved the position onto the stream's
// last event.
func positionOf(host string, events []jetstream.Event, maxSeq, high int64) batchPosition {
	pos := batchPosition{host: host, seq: maxSeq, shared: sharedTime(events)}
	for i := range events {
		pos.seq = max(pos.seq, events[i].Seq)
	}
	for i := range events {
		if s := events[i].Seq; s > pos.checkSeq && s <= pos.seq {
			pos.checkSeq, pos.checkUS = s, events[i].TimeUS
		}
	}
	pos.last, pos.newest = batchCursor(events)
	pos.reached = pos.newest
	if pos.last > 0 && high > pos.newest {
		pos.reached = high
		pos.last = max(pos.last, high-reorderWindow.Microseconds())
	}
	return pos
}

// commitBatchAt applies events read from host, enqueues their webhook
// deliveries, records each repository's newest commit rev, queues a
// re-read of every repository a #sync names, and advances the position
// (positionOf), in one transaction that commits only under c. Commits
// older than their repository's recorded rev are skipped (stale); high is
// as for positionOf. Errors
// wrap fence.ErrSuperseded when custody is lost.
func commitBatchAt(ctx context.Context, db *sql.DB, c fence.Custody, p *processor.Processor, enqueue enqueueFunc,
	host string, events []jetstream.Event, maxSeq, high int64) (committed, error) {
	out, _, err := commitPrefixAt(ctx, db, c, p, enqueue, host, events, maxSeq, high, 0)
	return out, err
}

// lockChunk is how many events commitPrefixAt applies between two looks
// at its budget: the write lock is held at most the budget plus the time
// of one chunk. Smaller chunks bound it tighter but cost a processor
// savepoint each (the rev and tombstone look-ups, the users rows and the
// aggregate refresh are once per transaction: revScreen, TxSession).
const lockChunk = 25

// commitPrefixAt is commitBatchAt for as many events as fit in budget:
// it applies events in stream order, lockChunk at a time, and once the
// transaction has been applying them for budget or longer it stops at the
// end of the chunk and commits that prefix alone, with the prefix's
// deliveries, revs, re-reads and position (positionOf the prefix, with
// high as for commitBatchAt; maxSeq
// only when the prefix is the whole batch, since it may name frames after
// the prefix's last event). The position stays contiguous: every event
// up to it is applied. n is the number of events committed, at least one
// when events is not empty; the caller commits events[n:] in a next
// transaction, exactly as if Jetstream had delivered them as a batch of
// their own. This bounds how long one transaction holds SQLite's write
// lock (issue 14.5): a lease renewal queued behind it waits at most about
// budget (docs/lease.md). budget 0 applies the whole batch. On an error
// nothing is committed and n is 0.
func commitPrefixAt(ctx context.Context, db *sql.DB, c fence.Custody, p *processor.Processor, enqueue enqueueFunc,
	host string, events []jetstream.Event, maxSeq, high int64, budget time.Duration) (out committed, n int, err error) {
	// Handle lookups are network requests: made before the fenced
	// transaction takes the write lock.
	ctx = p.PrepareBatch(ctx, db, events)
	// The first attempt applies the events without savepoints; if one of
	// them fails after it wrote, the transaction is rolled back and the
	// batch applied again with each event isolated (processor.Redo). The
	// outcomes are counted once the transaction committed.
	err = processor.Redo(func(bare bool) (err error) {
		out, n, err = commitPrefixTx(ctx, db, c, p, enqueue, host, events, maxSeq, high, budget, bare)
		return err
	})
	if err != nil {
		return committed{}, 0, err
	}
	out.session.Committed()
	return out, n, nil
}

// commitPrefixTx is one attempt of commitPrefixAt: its transaction, with
// the processor session begun bare (processor.BeginBareTx) or not.
func commitPrefixTx(ctx context.Context, db *sql.DB, c fence.Custody, p *processor.Processor, enqueue enqueueFunc,
	host string, events []jetstream.Event, maxSeq, high int64, budget time.Duration, bare bool) (out committed, n int, err error) {
	err = fence.Fenced(ctx, db, c, func(tx *sql.Tx) error {
		out, n = committed{}, 0
		start := time.Now()
		var syncs []string
		// The stored revs are read once for the whole batch; the screen
		// keeps each chunk's revs in memory, so the next chunk is judged
		// as it would have been within one screen, and they are stored
		// once, for the prefix that commits.
		revs, err := newRevScreen(ctx, tx, events)
		if err != nil {
			return err
		}
		// One processor session for the transaction: tombstones are read
		// once for the batch, and the aggregates are recomputed once, for
		// the prefix that commits.
		var session *processor.TxSession
		if bare {
			session = p.BeginBareTx(ctx, tx, c)
		} else {
			session = p.BeginTx(ctx, tx, c)
		}
		out.session = session
		if err := session.Preload(events); err != nil {
			return err
		}
		for n < len(events) {
			chunk := events[n:]
			if budget > 0 {
				chunk = chunk[:min(lockChunk, len(chunk))]
			}
			apply, s, stale := revs.screen(chunk)
			res, err := session.Apply(apply)
			if err != nil {
				return err
			}
			syncs = append(syncs, s...)
			out.stale += stale
			out.res.HoldStats = append(out.res.HoldStats, res.HoldStats...)
			out.res.NewManifests = append(out.res.NewManifests, res.NewManifests...)
			n += len(chunk)
			if budget > 0 && time.Since(start) >= budget {
				break
			}
		}
		if err := session.Finish(); err != nil {
			return err
		}
		if err := revs.record(ctx, tx); err != nil {
			return err
		}
		out.future, out.lastFuture = revs.future, revs.lastFuture
		if err := requestResyncs(ctx, tx, syncs, reasonSync); err != nil {
			return err
		}
		if len(out.res.NewManifests) > 0 {
			pushes := make([]webhooks.Push, len(out.res.NewManifests))
			for i, m := range out.res.NewManifests {
				pushes[i] = webhooks.Push{
					OwnerDID: m.OwnerDID, Repository: m.Repository, Digest: m.Digest, MediaType: m.MediaType,
					HoldDID: m.HoldDID, HoldEndpoint: m.HoldEndpoint, PushedAt: m.PushedAt, EventKey: m.EventKey(),
				}
			}
			enqueued, err := enqueue(ctx, tx, pushes)
			if err != nil {
				return fmt.Errorf("enqueue webhook deliveries: %w", err)
			}
			out.enqueued = enqueued
		}
		pos := positionOf(host, events[:n], prefixSeq(events, n, maxSeq), high)
		if err := savePositionTx(ctx, tx, pos, c.Fence); err != nil {
			return err
		}
		out.pos = &pos
		out.syncs = len(syncs)
		return nil
	})
	if err != nil {
		return committed{}, 0, err
	}
	return out, n, nil
}

// prefixSeq is the maxSeq to pass positionOf for events[:n] of a batch
// whose Batch.MaxSeq is maxSeq: maxSeq for the whole batch, else 0 (the
// prefix's own highest seq).
func prefixSeq(events []jetstream.Event, n int, maxSeq int64) int64 {
	if n == len(events) {
		return maxSeq
	}
	return 0
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
//
// Nor does one event stamped far ahead of its batch: an event more than
// cursorOutlier above the batch's median time_us is applied but moves
// neither figure (a server that stamped one commit a year ahead in an
// old capture otherwise moved the stored position a year on, and a
// restart skipped everything in between). A real jump forward (the host
// itself was down for a while) carries the figures once most of a batch
// lies beyond it, one batch later at most.
func batchCursor(events []jetstream.Event) (last, newest int64) {
	limit := time.Now().Add(cursorLead).UnixMicro()
	ts := make([]int64, 0, len(events))
	for i := range events {
		if t := events[i].TimeUS; t <= limit {
			ts = append(ts, t)
		}
	}
	if len(ts) == 0 {
		return 0, 0
	}
	if len(ts) > 2 {
		limit = min(limit, median(ts)+cursorOutlier.Microseconds())
	}
	for _, t := range ts {
		if t <= limit {
			last, newest = t, max(newest, t)
		}
	}
	if window := reorderWindow.Microseconds(); newest-last > window {
		last = newest - window
	}
	return last, newest
}

// cursorOutlier is how far above its batch's median time_us an event may
// be stamped and still move the cursor (batchCursor). Below the default
// jetstream.rewind (30 s): an event at the bound moves the cursor at most
// that far ahead of the stream, and a resume by time rewinds further.
const cursorOutlier = 10 * time.Second

// cursorLead is how far ahead of this host's clock an event may be
// stamped and still move the cursor, and how far ahead a stored or
// resumed cursor may be (see batchCursor, saveCursorSQL and
// consumer.resumeAt): room for the Jetstream server's clock to run a
// little ahead of ours. A host clock slower than that only stops the
// cursor until the clock catches up, which costs an idempotent replay.
const cursorLead = time.Minute
