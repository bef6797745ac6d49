package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/webhooks"
)

// pipeline is the one step a batch takes from the Jetstream client to the
// database, and every write of one grant of custody goes through its
// write. commit
//
//  1. prepares: the handles the events need are verified before the
//     write lock is taken (processor.PrepareBatch: network requests);
//  2. in ONE transaction fenced by the custody (write), in stream order:
//     orders (each commit is screened against its repository's newest
//     rev: revScreen), applies (one processor session: records, per-hold
//     stats, the aggregates), queues the re-reads #sync events and
//     lifecycle events (#account, #identity: processor.Result.Rereads) ask for,
//     enqueues the webhook deliveries of the manifests stored for the
//     first time, and writes the position, last (positionOf);
//  3. once that committed, counts the processor's outcomes;
//
// and returns what committed. A transaction that fails for a reason of
// its own events is retried event by event (each), so one bad row cannot
// stall the stream.
type pipeline struct {
	db      *database.DB
	custody fence.Custody
	proc    *processor.Processor
	// enqueue records webhook deliveries inside the transaction
	// (webhooks.EnqueueTx; a fake in tests).
	enqueue enqueueFunc
	// budget bounds how long one transaction applies events
	// (jetstream.commit_budget; 0: a whole batch in one).
	budget time.Duration
	// skipped is told about an event each had to skip (the processor's
	// ReportSkipped, under processor.ReasonDatabase).
	skipped skipFunc
	// log is the consumer's sampled logger.
	log zerolog.Logger
	// firstEvents bounds the re-reads queued for first events
	// (processor.RereadFirst) waiting at once; 0: firstEventQueueMax.
	firstEvents int
}

// enqueueFunc records webhook deliveries inside the batch transaction
// (webhooks.EnqueueTx; a fake in tests).
type enqueueFunc func(ctx context.Context, tx *sql.Tx, pushes []webhooks.Push) (int, error)

// skipFunc is told about an event each skipped and why.
type skipFunc func(ev *jetstream.Event, err error)

// newPipeline is the pipeline of one grant of custody, from the
// consumer's options.
func newPipeline(o Options, log zerolog.Logger) *pipeline {
	pl := &pipeline{db: o.DB, custody: o.Custody, proc: o.Processor, enqueue: o.enqueue, budget: o.Jetstream.CommitBudget, log: log}
	if pl.enqueue == nil {
		pl.enqueue = webhooks.EnqueueTx
	}
	pl.skipped = func(ev *jetstream.Event, err error) {
		pl.proc.ReportSkipped(ev, processor.ReasonDatabase, err)
	}
	return pl
}

// write runs fn in a transaction that commits only while the pipeline's
// custody is the lease's current one: the consumer actor's one call of
// fence.Fenced (the re-reader has its own, Resyncer.write). Errors wrap
// fence.ErrSuperseded when custody is lost.
func (pl *pipeline) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return fence.Fenced(ctx, pl.db, pl.custody, fn)
}

// part is what one commit is given: the rest of one jetstream.Batch.
type part struct {
	// host is jetstream.HostOf the batch's URL.
	host   string
	events []jetstream.Event
	// maxSeq is the batch's Batch.MaxSeq: the last event carries it, so
	// frames that did not decode after it are passed too.
	maxSeq int64
	// high is the largest time_us already committed from host earlier on
	// the same stream (0: none), see positionOf.
	high int64
}

// committed is what one commit did.
type committed struct {
	// n is how many of the part's events committed (events[:n]): at least
	// one when there were any.
	n int
	// at is when the last transaction of the commit returned.
	at time.Time
	// pos is the position the commit saved.
	pos batchPosition
	// res carries the HoldStats and NewManifests of what committed (the
	// counts are the processor's metrics).
	res processor.Result
	// enqueued is the number of webhook deliveries newly recorded.
	enqueued int
	// skipped counts events whose own transaction could not commit (see
	// each); the position moved past them.
	skipped int
	// stale counts commits skipped as older than their repository's rev.
	stale int
	// syncs counts #sync events queued for a re-read.
	syncs int
	// rereads counts the re-reads lifecycle events asked for that were
	// queued, shed those not queued for the bound on first events
	// (requestRereads).
	rereads, shed int
	// future counts commits dropped for a rev from the future, the last
	// of them named in lastFuture ("did rev").
	future     int
	lastFuture string
}

// add merges the effects of a later commit into out.
func (out *committed) add(more committed) {
	out.res.HoldStats = append(out.res.HoldStats, more.res.HoldStats...)
	out.res.NewManifests = append(out.res.NewManifests, more.res.NewManifests...)
	out.enqueued += more.enqueued
	out.skipped += more.skipped
	out.stale += more.stale
	out.syncs += more.syncs
	out.rereads += more.rereads
	out.shed += more.shed
	out.future += more.future
	if more.lastFuture != "" {
		out.lastFuture = more.lastFuture
	}
}

// commit commits a prefix of p's events in one transaction (prefix: as
// many as fit in the budget), or, when that transaction fails for a
// reason of its events (isolable), all of them one by one (each). The
// caller commits events[n:] in the next call, exactly as if Jetstream had
// delivered them as a batch of their own. On an error nothing more than
// what each committed before it is durable.
func (pl *pipeline) commit(ctx context.Context, p part) (committed, error) {
	out, err := pl.prefix(ctx, p)
	if err == nil || !isolable(ctx, err) {
		out.at = time.Now()
		return out, err
	}
	pl.log.Warn().Err(logval.Error(err)).Int("events", len(p.events)).Msg("batch did not commit; retrying it event by event")
	out, err = pl.each(ctx, p)
	out.n = len(p.events)
	out.pos = positionOf(p.host, p.events, p.maxSeq, p.high)
	out.at = time.Now()
	return out, err
}

// isolable reports whether a failed commit is about the events, so that
// retrying them one by one can get past it: not lost custody, not the end
// of ctx, not the database itself failing (locked, I/O, ...), which would
// fail every retry too and must not cost us events.
func isolable(ctx context.Context, err error) bool {
	return ctx.Err() == nil && !errors.Is(err, fence.ErrSuperseded) && !processor.DatabaseFailure(err)
}

// lockChunk is how many events prefix applies between two looks at its
// budget: the write lock is held at most the budget plus the time of one
// chunk. Smaller chunks bound it tighter but cost a processor savepoint
// each (the rev and tombstone look-ups, the users rows and the aggregate
// refresh are once per transaction: revScreen, TxSession).
const lockChunk = 25

// prefix commits as many of p's events as fit in the budget: it applies
// them in stream order, lockChunk at a time, and once the transaction has
// been applying them for the budget or longer it stops at the end of the
// chunk and commits that prefix alone, with the prefix's deliveries,
// revs, re-reads and position (positionOf the prefix; p.maxSeq only when
// the prefix is all of p, since it may name frames after the prefix's
// last event). The position stays contiguous: every event up to it is
// applied. This bounds how long one transaction holds SQLite's write lock:
// a lease renewal queued behind it waits at most about the
// budget (docs/lease.md). Budget 0 applies all of p. On an error nothing
// is committed.
func (pl *pipeline) prefix(ctx context.Context, p part) (committed, error) {
	// Handle lookups are network requests: made before the fenced
	// transaction takes the write lock.
	ctx = pl.proc.PrepareBatch(ctx, pl.db, p.events)
	// The first attempt applies the events without savepoints; if one of
	// them fails after it wrote, the transaction is rolled back and the
	// batch applied again with each event isolated (processor.Redo). The
	// outcomes are counted once the transaction committed.
	var (
		out     committed
		session *processor.TxSession
	)
	err := processor.Redo(func(bare bool) error {
		return pl.write(ctx, func(tx *sql.Tx) (err error) {
			out, session, err = pl.inTx(ctx, tx, p, bare)
			return err
		})
	})
	if err != nil {
		return committed{}, err
	}
	session.Committed()
	return out, nil
}

// inTx is prefix's transaction, with the processor session begun bare
// (processor.BeginBareTx) or not; it returns the session, whose outcomes
// are counted once the transaction committed.
func (pl *pipeline) inTx(ctx context.Context, tx *sql.Tx, p part, bare bool) (out committed, session *processor.TxSession, err error) {
	start := time.Now()
	events := p.events
	// Order: the stored revs are read once for the whole batch; the
	// screen keeps each chunk's revs in memory, so the next chunk is
	// judged as it would have been within one screen, and they are stored
	// once, for the prefix that commits.
	revs, err := newRevScreen(ctx, tx, events)
	if err != nil {
		return out, nil, err
	}
	// Apply: one processor session for the transaction, so tombstones are
	// read once for the batch and the aggregates recomputed once, for the
	// prefix that commits.
	if bare {
		session = pl.proc.BeginBareTx(ctx, tx, pl.custody)
	} else {
		session = pl.proc.BeginTx(ctx, tx, pl.custody)
	}
	if err := session.Preload(events); err != nil {
		return out, nil, err
	}
	var (
		syncs   []string
		rereads []processor.Reread
	)
	for out.n < len(events) {
		chunk := events[out.n:]
		if pl.budget > 0 {
			chunk = chunk[:min(lockChunk, len(chunk))]
		}
		apply, s, stale := revs.screen(chunk)
		res, err := session.Apply(apply)
		if err != nil {
			return out, nil, err
		}
		syncs = append(syncs, s...)
		rereads = append(rereads, res.Rereads...)
		out.stale += stale
		out.res.HoldStats = append(out.res.HoldStats, res.HoldStats...)
		out.res.NewManifests = append(out.res.NewManifests, res.NewManifests...)
		out.n += len(chunk)
		if pl.budget > 0 && time.Since(start) >= pl.budget {
			break
		}
	}
	if err := session.Finish(); err != nil {
		return out, nil, err
	}
	if err := revs.record(ctx, tx); err != nil {
		return out, nil, err
	}
	out.future, out.lastFuture = revs.future, revs.lastFuture
	if err := requestResyncs(ctx, tx, syncs, reasonSync); err != nil {
		return out, nil, err
	}
	out.syncs = len(syncs)
	if out.rereads, out.shed, err = requestRereads(ctx, tx, rereads, pl.firstEvents); err != nil {
		return out, nil, err
	}
	if out.enqueued, err = pl.deliveries(ctx, tx, out.res.NewManifests); err != nil {
		return out, nil, err
	}
	// Position, last: the prefix's.
	out.pos = positionOf(p.host, events[:out.n], prefixSeq(events, out.n, p.maxSeq), p.high)
	if err := savePositionTx(ctx, tx, out.pos, pl.custody.Fence); err != nil {
		return out, nil, err
	}
	return out, session, nil
}

// deliveries enqueues a webhook delivery per subscriber for every manifest
// stored for the first time (idempotent by event key), and returns how many
// were newly recorded.
func (pl *pipeline) deliveries(ctx context.Context, tx *sql.Tx, manifests []processor.NewManifest) (int, error) {
	if len(manifests) == 0 {
		return 0, nil
	}
	pushes := make([]webhooks.Push, len(manifests))
	for i, m := range manifests {
		pushes[i] = webhooks.Push{
			OwnerDID: m.OwnerDID, Repository: m.Repository, Digest: m.Digest, MediaType: m.MediaType,
			HoldDID: m.HoldDID, HoldEndpoint: m.HoldEndpoint, PushedAt: m.PushedAt, EventKey: m.EventKey(),
		}
	}
	n, err := pl.enqueue(ctx, tx, pushes)
	if err != nil {
		return 0, fmt.Errorf("enqueue webhook deliveries: %w", err)
	}
	return n, nil
}

// each is the fallback for a part whose single commit failed with an
// isolable error (one outside the processor's per-event savepoints: the
// repository_stats refresh, the webhook enqueue, the commit itself). It
// commits the events one by one, each with its deliveries and the
// position in its own fenced transaction (prefix of one), so one bad row
// cannot stall the stream. An event whose own commit still fails is
// reported to skipped and the position is moved past it in a fenced
// transaction of its own. The last event carries p.maxSeq, so frames
// skipped after it are passed too.
//
// It returns an error, with the events before it committed, when custody
// is lost (wrapping fence.ErrSuperseded), ctx ends, an event fails with a
// processor.DatabaseFailure, or the position cannot be moved past a
// skipped event: the database itself is then broken and the worker must
// fail.
func (pl *pipeline) each(ctx context.Context, p part) (committed, error) {
	var out committed
	high := p.high
	for i := range p.events {
		one := part{host: p.host, events: p.events[i : i+1], high: high}
		if i == len(p.events)-1 {
			one.maxSeq = max(one.events[0].Seq, p.maxSeq)
		} else {
			one.maxSeq = one.events[0].Seq
		}
		done, err := pl.prefix(ctx, one)
		if _, newest := batchCursor(one.events); newest > high {
			high = newest
		}
		if err == nil {
			out.add(done)
			continue
		}
		if !isolable(ctx, err) {
			return out, err
		}
		ev := &p.events[i]
		pl.skipped(ev, err)
		pos := positionOf(p.host, one.events, one.maxSeq, high)
		if pos.last == 0 && pos.seq == 0 {
			out.skipped++
			continue // stamped ahead of the clock: it does not move the position
		}
		err = pl.write(ctx, func(tx *sql.Tx) error {
			return savePositionTx(ctx, tx, pos, pl.custody.Fence)
		})
		if err != nil {
			return out, fmt.Errorf("move the position past skipped event time_us=%d seq=%d: %w", ev.TimeUS, ev.Seq, err)
		}
		out.skipped++
	}
	return out, nil
}
