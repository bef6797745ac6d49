package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
)

// Position is the stored resume position (jetstream_cursor, migration 7):
// the highest contiguous processed position, and the host it belongs to.
//
// Every batch is applied in stream order in one transaction with its
// position, so the position of a committed batch's last event is
// contiguous: every event before it on that host was applied.
type Position struct {
	// Host is jetstream.HostOf of the endpoint the position was read from;
	// "" for a position stored before this version (time only).
	Host string
	// Seq is Host's sequence number of the last processed event, 0 when
	// Host sends none (a Jetstream v1 server): then TimeUS is the position.
	Seq int64
	// TimeUS is Host's own time of the last processed event (SPEC §8
	// jetstream_cursor.time_us), in Unix microseconds.
	TimeUS int64
	// SharedUS is a time every host agrees on for the last processed
	// batch (see sharedTime), in Unix microseconds; 0 when unknown.
	SharedUS int64
	// CheckSeq and CheckUS are the last event Host delivered at or below
	// Seq that decoded: its sequence number and its time as read (Unix
	// µs); 0 when unknown. A resume by seq starts at CheckSeq and expects
	// the host to replay that event first (jetstream.ClientOptions.
	// SeqTimeFor); the frames after it up to Seq did not decode, and are
	// skipped again.
	CheckSeq, CheckUS int64
}

// LoadPosition returns the stored position; ok is false when none is stored.
func LoadPosition(ctx context.Context, db *database.DB) (p Position, ok bool, err error) {
	err = db.QueryRowContext(ctx, `SELECT `+database.Text("host")+`, seq, time_us, shared_us, check_seq, check_us FROM jetstream_cursor WHERE id = 1`).
		Scan(&p.Host, &p.Seq, &p.TimeUS, &p.SharedUS, &p.CheckSeq, &p.CheckUS)
	if errors.Is(err, sql.ErrNoRows) {
		return Position{}, false, nil
	}
	if err != nil {
		return Position{}, false, fmt.Errorf("load jetstream position: %w", err)
	}
	return p, true, nil
}

// anchorPositionSQL stores the position of a consumer that found none:
// ?1 the time it began (Unix µs, this host's clock), ?2 its fence. An empty
// host with shared_us set makes later connections and successors resume
// by time from there less jetstream.rewind on a v2 endpoint (see
// resumeAt; on a legacy endpoint an anchor alone means no cursor). time_us stays 0:
// it is the time of the last processed event (SPEC §8), and there is none
// yet. A row already there (another holder's, stored since the read) is
// kept.
const anchorPositionSQL = `INSERT INTO jetstream_cursor (id, time_us, updated_at, fence, host, seq, shared_us)
VALUES (1, 0, ` + database.NowMS + `, ?2, '', 0, ?1)
ON CONFLICT (id) DO NOTHING`

// anchor returns the stored position, storing one first when there is
// none: the time the consumer begins at (now), under the pipeline's
// custody.
//
// Without it a consumer that starts on an empty database reads from the
// live tail and has no position until its first batch commits, so a
// holder killed before then (or a reconnect before then) hands its
// successor nothing: that one starts at a later live tail and the events
// in between are lost for good. With it, where the first holder began is
// durable at once, and nothing after that is skipped by a handover.
//
// anchored reports that this call stored the position (the caller began
// it): that incarnation reads the live tail until its first event, as a
// consumer with no position always did; everyone after it resumes from
// the anchor.
//
// Errors: reading or storing the position (fence.ErrSuperseded when
// custody was lost meanwhile).
func (pl *pipeline) anchor(ctx context.Context, now time.Time) (p Position, anchored bool, err error) {
	p, ok, err := LoadPosition(ctx, pl.db)
	if err != nil || ok {
		return p, false, err
	}
	var n int64
	if err := pl.write(ctx, func(tx *sql.Tx) error {
		r, err := tx.ExecContext(ctx, anchorPositionSQL, now.UnixMicro(), pl.custody.Fence)
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	}); err != nil {
		return Position{}, false, fmt.Errorf("store the starting jetstream position: %w", err)
	}
	p, _, err = LoadPosition(ctx, pl.db)
	return p, n == 1, err
}

// batchPosition is what one batch moves the position to.
type batchPosition struct {
	host string
	// seq is the batch's highest sequence number (Batch.MaxSeq), 0 on a
	// server without them; checkSeq and checkUS the batch's last event at
	// or below seq that decoded, its seq and time_us as read (0: none).
	seq, checkSeq, checkUS int64
	// last and newest are batchCursor's figures (time_us), last raised
	// to reorderWindow below reached.
	last, newest int64
	// reached is the newest time_us of the stream up to and including
	// this batch (positionOf's high, or newest).
	reached int64
	// shared is the batch's shared time (sharedTime), 0 when unknown.
	shared int64
}

// savePositionSQL stores a batch's position. ?1 last time_us (0: keep),
// ?2 reached time_us (batchPosition.reached), ?3 fence, ?4 cursorLead in µs, ?5 host, ?6 seq,
// ?7 shared time (0: keep), ?9 and ?10 the check event's seq and time_us
// (0: keep the stored one on the same host, none on another).
//
// It moves the position only forward within one position space: on the
// same host, to a higher sequence number (seq space) or a newer time
// (time space: once the stream has reached the stored time_us, each
// batch after it moves the position to its own last event, as one batch
// would, even one a little older than the stored one; a rewound replay
// that has not reached it yet never moves it back); on
// another host unconditionally, since the consumer is now reading there
// (and resumed there by time, behind the old position). A stored time_us
// beyond cursorLead of the database's clock (written before the guards)
// is overwritten by the next batch. The shared time follows the batch's
// (sharedTime) except that on the same host it never moves back by more
// than sharedOutlier (?8, µs): see acceptShared.
const savePositionSQL = `INSERT INTO jetstream_cursor (id, time_us, updated_at, fence, host, seq, shared_us, check_seq, check_us)
VALUES (1, MIN(?1, ` + database.NowUS + ` + ?4), ` + database.NowMS + `, ?3, ?5, ?6, ?7, ?9, ?10)
ON CONFLICT (id) DO UPDATE SET
  time_us    = CASE WHEN ?1 > 0 THEN excluded.time_us ELSE jetstream_cursor.time_us END,
  updated_at = excluded.updated_at,
  fence      = excluded.fence,
  host       = excluded.host,
  seq        = excluded.seq,
  check_seq  = CASE WHEN ?9 > 0 THEN ?9 WHEN jetstream_cursor.host <> excluded.host THEN 0 ELSE jetstream_cursor.check_seq END,
  check_us   = CASE WHEN ?9 > 0 THEN ?10 WHEN jetstream_cursor.host <> excluded.host THEN 0 ELSE jetstream_cursor.check_us END,
  shared_us  = CASE WHEN ?7 > 0 AND (jetstream_cursor.host <> excluded.host OR ?7 >= jetstream_cursor.shared_us - ?8)
                    THEN ?7 ELSE jetstream_cursor.shared_us END
WHERE jetstream_cursor.host <> excluded.host
   OR (?6 > 0 AND ?6 > jetstream_cursor.seq)
   OR (?6 = 0 AND (?2 >= jetstream_cursor.time_us OR jetstream_cursor.time_us > ` + database.NowUS + ` + ?4))`

func savePositionTx(ctx context.Context, tx *sql.Tx, p batchPosition, fence int64) error {
	if p.seq == 0 && p.last == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, savePositionSQL, p.last, p.reached, fence, cursorLead.Microseconds(), p.host, p.seq, p.shared, sharedOutlier.Microseconds(), p.checkSeq, p.checkUS); err != nil {
		return fmt.Errorf("save jetstream position: %w", err)
	}
	return nil
}

// sharedTime is a time for events that every Jetstream host agrees on,
// so a position can move from one host to another: for a commit the
// time in its rev (a TID: the PDS's clock at the commit), for identity,
// account and sync events the upstream relay's time. Each is capped at
// the event's own time_us (a PDS clock running ahead must not carry the
// position past what was witnessed). The batch's value is the minimum
// over its events, 0 when none has one. A host that lagged and caught up
// stamps old events with late time_us; their revs still carry the old
// time, which is why a switch resumes from this and not from time_us.
//
// One event cannot drag the value back: the minimum is taken over the
// events whose time is at most sharedOutlier below the batch's median,
// so a commit whose rev comes from a PDS clock hours slow (or an event
// whose time_us a misbehaving server backdated) is applied like any
// other but does not move a failover's resume point hours back, into a
// re-read of everything since or past the new host's oldest event (a
// gap and a backfill). Leaving it out loses nothing: another host stamps
// that event when it sees it, among its neighbours, not at its rev's
// time. Nor can one carry it forward: each time is capped at this
// host's clock as well.
func sharedTime(events []jetstream.Event) int64 {
	now := time.Now().UnixMicro()
	ts := make([]int64, 0, len(events))
	for i := range events {
		if t := eventSharedTime(&events[i]); t > 0 {
			ts = append(ts, min(t, now))
		}
	}
	if len(ts) == 0 {
		return 0
	}
	floor := median(ts) - sharedOutlier.Microseconds()
	var out int64
	for _, t := range ts {
		if t >= floor && (out == 0 || t < out) {
			out = t
		}
	}
	return out
}

// median returns the middle of ts (the upper one of an even count),
// leaving ts as it is. ts must not be empty.
func median(ts []int64) int64 {
	sorted := slices.Clone(ts)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}

// sharedOutlier is how far below its batch's median an event's shared
// time may lie and still count (sharedTime), and how far one batch may
// move the stored shared time back on the same host (acceptShared): twice
// the default jetstream.rewind, well beyond the spread of clocks and
// relay paths among live events (under a second in the shared capture).
const sharedOutlier = time.Minute

// acceptShared reports whether a batch read from host with shared time
// shared (0: none) replaces the stored position's shared time. On
// another host it does (the consumer now reads there); on the same host
// unless it is more than sharedOutlier below the stored one: a batch
// whose events all lie that far back (a single backdated event on the
// live tail) would otherwise undo what the batches before it
// established. savePositionSQL applies the same rule.
func acceptShared(stored Position, host string, shared int64) bool {
	return shared > 0 && (host != stored.Host || shared >= stored.SharedUS-sharedOutlier.Microseconds())
}

func eventSharedTime(ev *jetstream.Event) int64 {
	var t int64
	switch {
	case ev.Commit != nil:
		tid, err := syntax.ParseTID(ev.Commit.Rev)
		if err != nil {
			return 0
		}
		t = tid.Time().UnixMicro()
	case ev.Identity != nil:
		t = rfc3339US(ev.Identity.Time)
	case ev.Account != nil:
		t = rfc3339US(ev.Account.Time)
	case ev.Sync != nil:
		t = rfc3339US(ev.Sync.Time)
	}
	if t <= 0 {
		return 0
	}
	return min(t, ev.TimeUS)
}

func rfc3339US(s string) int64 {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0
	}
	return t.UnixMicro()
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
