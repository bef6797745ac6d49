package backfill

import (
	"context"
	"database/sql"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"
)

// A run that keeps failing (no relay answers, the database refuses a
// write) is attempted again and again: under interval 0 by Once, after a
// growing delay, else at every tick. Each failed attempt is recorded on
// its run (failed_attempts, last_error, last_error_at), so every instance,
// /debug/backfill and `appview backfill status` show the run as failing
// and why (Progress.State), and it is logged once per change: a warning
// when this process sees the latest run fail after it had not, debug
// lines for the attempts that fail after it, and the info line of the
// completed run, which carries its failed_attempts, when it recovers.

const recordFailureSQL = `UPDATE backfill_runs SET failed_attempts = failed_attempts + 1, last_error = ?2,
  last_error_at = ` + database.NowMS + ` WHERE id = ?1 RETURNING failed_attempts`

// failed records, under custody c, that an attempt at run id (0: none was
// claimed) ended with err, and logs it: at warn the first time since this
// process last saw a run complete or be skipped, else at debug. A failure
// to record is logged with it; nothing is returned.
func (b *Backfiller) failed(ctx context.Context, c fence.Custody, id int64, err error, log zerolog.Logger) {
	var attempts int64
	var recErr error
	if id > 0 {
		recErr = fence.Fenced(ctx, b.o.DB, c, func(tx *sql.Tx) error {
			return tx.QueryRowContext(ctx, recordFailureSQL, id, logval.Err(err)).Scan(&attempts)
		})
	}
	ev := log.Debug()
	msg := "backfill run still failing"
	if !b.failing.Swap(true) {
		ev = log.Warn()
		msg = "backfill run failing; it is attempted again later, and this is said again only when a run completes"
	}
	ev = ev.Err(logval.Error(err)).Int64("failed_attempts", attempts)
	if recErr != nil {
		ev = ev.AnErr("record_error", logval.Error(recErr))
	}
	ev.Msg(msg)
}

// recovered notes that the latest run completed or was skipped: the next
// failure is a change again.
func (b *Backfiller) recovered() { b.failing.Store(false) }
