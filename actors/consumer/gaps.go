package consumer

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/logval"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
)

// cursorTooOld is told (on the client's Run goroutine) that host url
// refused cursor as older than its lookback, whose oldest event is floor:
// the events in between are gone from that host. The client resumes from
// floor. Here the gap is recorded (jetstream_gaps) and, in the same fenced
// transaction, a backfill run is requested: an unfinished backfill_runs
// row that the backfill worker resumes at its next run (the next
// backfill.interval tick, or the next grant of its lease with interval 0),
// re-reading every io.atcr.* record the gap may have hidden.
func (c *consumer) cursorTooOld(url string, cursor, floor int64) {
	c.log.Error().Str("url", logval.RedactURL(url)).Int64("cursor", cursor).Int64("floor", floor).Int64("gap_events", floor-cursor).
		Msg("Jetstream gap: events between the stored position and the host's oldest event are lost; resuming from the oldest and requesting a backfill run")
	c.recordGap(url, cursor, floor, nil)
}

// outdatedCursor is told (on the connection's reader goroutine) that host
// url clamped the time cursor cursorUS to its oldest event, the first one
// after the advisory being at firstUS (seq firstSeq): the events between
// are gone from that host, as with cursorTooOld, but measured in time.
// The gap is recorded with its times (from_seq 0: no seq was sent) and a
// backfill run requested, in one fenced transaction.
func (c *consumer) outdatedCursor(url string, cursorUS, firstUS, firstSeq int64) {
	c.log.Error().Str("url", logval.RedactURL(url)).Int64("cursor_us", cursorUS).Int64("first_us", firstUS).
		Dur("gap", time.Duration(firstUS-cursorUS)*time.Microsecond).
		Msg("Jetstream gap: the host no longer has events as old as the time cursor (OutdatedCursor); resuming from its oldest and requesting a backfill run")
	c.recordGap(url, 0, firstSeq, &[2]int64{cursorUS, firstUS})
}

// recordGap records a gap of host url, seqs fromSeq to toSeq and, when
// times is not nil, times[0] to times[1] (Unix µs), requests a backfill
// run (for repositories new here) and, with re-reads enabled, queues a
// re-read of every repository held here (for deletes the gap hid), in one
// fenced transaction; it logs a failure.
func (c *consumer) recordGap(url string, fromSeq, toSeq int64, times *[2]int64) {
	c.o.Metrics.gap()
	var queued int64
	var fromUS, toUS any
	if times != nil {
		fromUS, toUS = times[0], times[1]
	}
	err := c.pipe.write(context.Background(), func(tx *sql.Tx) error {
		if _, err := tx.Exec(`INSERT INTO jetstream_gaps (host, from_seq, to_seq, detected_at, fence, from_time_us, to_time_us)
VALUES (?1, ?2, ?3, `+database.NowMS+`, ?4, ?5, ?6)`,
			jetstream.HostOf(url), fromSeq, toSeq, c.o.Custody.Fence, fromUS, toUS); err != nil {
			return fmt.Errorf("record gap: %w", err)
		}
		if _, err := tx.Exec(requestBackfillSQL, c.o.Custody.Fence, reasonGap); err != nil {
			return fmt.Errorf("request backfill run: %w", err)
		}
		if c.o.Resync == nil {
			return nil
		}
		r, err := tx.Exec(requestGapResyncsSQL, reasonGap)
		if err == nil {
			queued, err = r.RowsAffected()
		}
		if err != nil {
			return fmt.Errorf("queue re-reads: %w", err)
		}
		return nil
	})
	if err != nil {
		c.log.Error().Err(err).Msg("Jetstream gap not recorded; no backfill requested")
		return
	}
	if c.o.Resync != nil {
		c.log.Warn().Int64("repositories", queued).Msg("re-reads queued after a Jetstream gap: every repository held here, from its PDS")
		c.o.Resync.Kick()
	}
}

// requestGapResyncsSQL queues a re-read (reason ?1) of every repository
// the database holds a record of (a users row counts only with a profile:
// the first #identity or #account event of any account on the network
// makes one); one already queued keeps its place. A
// backfill run only adds what it lists, with no rev: a record deleted, or
// deleted and created again, while the events were lost would stay as it
// was. A re-read lists the repository at its rev and removes what it no
// longer holds (resync.go).
const requestGapResyncsSQL = `INSERT INTO repo_resyncs (did, reason, requested_at, next_at)
SELECT did, ?1, ` + database.NowMS + `, ` + database.NowMS + ` FROM (
  SELECT did FROM users WHERE profile_created_at IS NOT NULL UNION SELECT did FROM manifests UNION SELECT did FROM tags
  UNION SELECT did FROM stars UNION SELECT did FROM repo_pages UNION SELECT hold_did FROM hold_captains
  UNION SELECT hold_did FROM hold_crew UNION SELECT hold_did FROM repository_hold_stats
) WHERE true
ON CONFLICT (did) DO NOTHING`

// requestBackfillSQL adds an unfinished backfill run unless one is
// already pending: the backfill worker resumes the latest unfinished run
// before anything else (actors/backfill claimRun).
const requestBackfillSQL = `INSERT INTO backfill_runs (started_at, fence, holder, updated_at)
SELECT ` + database.NowMS + `, ?1, ?2, ` + database.NowMS + `
WHERE NOT EXISTS (SELECT 1 FROM backfill_runs WHERE completed_at IS NULL)`
