package backfill

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/atcr-io/appview/internal/logval"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
)

// savePage applies one page of records and checkpoints the DID's cursor
// (and, on its last page, marks it done) in one fenced transaction.
//
// A page whose transaction fails for a reason of its records (isolable)
// would fail every resumed run at the same page, so it is applied again
// record by record (savePageByRecord) rather than stalling the backfill.
func (r *run) savePage(ctx context.Context, col, did string, page recordsPage, last bool) error {
	events, invalid := r.events(col, did, page.Records)
	cp := pageCheckpoint{col: col, did: did, state: repoRunning, cursor: page.Cursor, records: len(events)}
	if last {
		cp.state, cp.doneRepos = repoDone, 1
	}
	var applied Applied
	if pr, ok := r.b.o.Applier.(Preparer); ok && len(events) > 0 {
		ctx = pr.Prepare(ctx, events)
	}
	err := r.write(ctx, "page", func(tx *sql.Tx) error {
		var err error
		if len(events) > 0 {
			if applied, err = r.b.o.Applier.ApplyTx(ctx, tx, r.custody, events); err != nil {
				return fmt.Errorf("apply %d %s records of %s: %w", len(events), col, did, err)
			}
		}
		return r.checkpoint(ctx, tx, cp)
	})
	if err != nil && len(events) > 0 && isolable(ctx, err) {
		r.b.skipLog.Warn().Err(logval.Error(err)).Str("did", logval.String(did)).Str("collection", col).Int("records", len(events)).
			Msg("backfill page did not commit; applying its records one by one")
		applied, err = r.savePageByRecord(ctx, cp, events)
	}
	if err != nil {
		return err
	}
	m := r.b.o.Metrics
	m.Records.WithLabelValues(col, "applied").Add(float64(applied.Applied))
	m.Records.WithLabelValues(col, "skipped").Add(float64(applied.Skipped))
	if invalid > 0 {
		m.Records.WithLabelValues(col, "invalid").Add(float64(invalid))
		m.Errors.WithLabelValues(classInvalid).Add(float64(invalid))
	}
	return nil
}

// pageCheckpoint is what a committed page records for its DID and run.
type pageCheckpoint struct {
	col, did, state, cursor string
	// records is how many records of the page were handed to the applier;
	// doneRepos is 1 on the DID's last page.
	records, doneRepos int
}

func (r *run) checkpoint(ctx context.Context, tx *sql.Tx, cp pageCheckpoint) error {
	if _, err := tx.ExecContext(ctx, saveRepoPageSQL, r.id, cp.col, cp.did, cp.state, cp.cursor, cp.records); err != nil {
		return fmt.Errorf("checkpoint %s of %s: %w", cp.col, cp.did, err)
	}
	if _, err := tx.ExecContext(ctx, countRunSQL, r.id, cp.records, cp.doneRepos, 0); err != nil {
		return fmt.Errorf("count backfill run %d: %w", r.id, err)
	}
	return nil
}

// isolable reports whether a failed page is about its records, so applying
// them one by one can get past it: not the end of custody or ctx, not a
// failure of the database itself (processor.DatabaseFailure), which would
// fail every record too and must not cost us records.
func isolable(ctx context.Context, err error) bool {
	return !fatal(ctx, err) && !processor.DatabaseFailure(err)
}

// savePageByRecord applies a page whose single transaction failed one
// record at a time, each in its own fenced transaction. A record whose own
// transaction still fails is skipped: logged (sampled) and counted as a
// skipped record and a db_error. The checkpoint then commits alone, so the
// run moves past the page. It returns an error when custody or ctx ends,
// the database itself fails, or the checkpoint cannot be written.
func (r *run) savePageByRecord(ctx context.Context, cp pageCheckpoint, events []jetstream.Event) (Applied, error) {
	var total Applied
	for i := range events {
		var one Applied
		err := r.write(ctx, "record", func(tx *sql.Tx) error {
			var err error
			one, err = r.b.o.Applier.ApplyTx(ctx, tx, r.custody, events[i:i+1])
			return err
		})
		if err == nil {
			total.Applied += one.Applied
			total.Skipped += one.Skipped
			continue
		}
		if !isolable(ctx, err) {
			return total, fmt.Errorf("apply %s record %s of %s: %w", cp.col, events[i].Commit.RKey, cp.did, err)
		}
		total.Skipped++
		r.b.o.Metrics.Errors.WithLabelValues(classDatabase).Inc()
		r.b.skipLog.Error().Err(logval.Error(err)).Str("did", logval.String(cp.did)).Str("collection", cp.col).Str("rkey", logval.String(events[i].Commit.RKey)).
			Msg("backfill record skipped: the database refused it")
	}
	err := r.write(ctx, "page", func(tx *sql.Tx) error { return r.checkpoint(ctx, tx, cp) })
	return total, err
}
