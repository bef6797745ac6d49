package backfill

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/database"
)

// Repo states in backfill_repos.
const (
	repoRunning = "running"
	repoDone    = "done"
	repoFailed  = "failed"
	// repoInactive is only a metrics outcome: an inactive repository is
	// checkpointed as done.
	repoInactive = "inactive"
)

const (
	unfinishedRunSQL = `SELECT id FROM backfill_runs WHERE completed_at IS NULL ORDER BY id DESC LIMIT 1`

	resumeRunSQL = `UPDATE backfill_runs SET fence = ?2, holder = ?3, updated_at = ` + database.NowMS + ` WHERE id = ?1`

	lastCompletedSQL = `SELECT completed_at, ` + database.NowMS + ` FROM backfill_runs
WHERE completed_at IS NOT NULL ORDER BY completed_at DESC LIMIT 1`

	newRunSQL = `INSERT INTO backfill_runs (started_at, fence, holder, updated_at)
SELECT n, ?1, ?2, n FROM (SELECT ` + database.NowMS + ` AS n) RETURNING id`

	completeRunSQL = `UPDATE backfill_runs SET completed_at = ` + database.NowMS + `, fence = ?2, updated_at = ` + database.NowMS + `
WHERE id = ?1 AND completed_at IS NULL`

	runTotalsSQL = `SELECT repos_done, repos_failed, records, failed_attempts FROM backfill_runs WHERE id = ?1`

	saveCollectionSQL = `INSERT INTO backfill_collections (run_id, collection, relay, relay_cursor, done, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ` + database.NowMS + `)
ON CONFLICT (run_id, collection) DO UPDATE SET
  relay        = excluded.relay,
  relay_cursor = excluded.relay_cursor,
  done         = excluded.done,
  updated_at   = excluded.updated_at`

	saveRepoPageSQL = `INSERT INTO backfill_repos (run_id, collection, did, state, record_cursor, records, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ` + database.NowMS + `)
ON CONFLICT (run_id, collection, did) DO UPDATE SET
  state         = excluded.state,
  record_cursor = excluded.record_cursor,
  records       = backfill_repos.records + excluded.records,
  updated_at    = excluded.updated_at`

	failRepoSQL = `INSERT INTO backfill_repos (run_id, collection, did, state, error, updated_at)
VALUES (?1, ?2, ?3, 'failed', ?4, ` + database.NowMS + `)
ON CONFLICT (run_id, collection, did) DO UPDATE SET
  state      = 'failed',
  error      = excluded.error,
  updated_at = excluded.updated_at`

	// noteIncompleteSQL notes the repositories of a JSON array of [did,
	// reason] pairs as ones this index may hold incompletely
	// (repo_incomplete): the consumer re-reads such a repository when an
	// #account event makes its account active, or an #identity event
	// comes for it (actors/consumer, lifecycle.go). A note already there
	// keeps its reason.
	noteIncompleteSQL = `INSERT INTO repo_incomplete (did, reason, noted_at)
SELECT j.value ->> 0, j.value ->> 1, ` + database.NowMS + ` FROM json_each(?1) AS j WHERE true
ON CONFLICT (did) DO NOTHING`

	countRunSQL = `UPDATE backfill_runs SET
  records      = records + ?2,
  repos_done   = repos_done + ?3,
  repos_failed = repos_failed + ?4,
  updated_at   = ` + database.NowMS + `
WHERE id = ?1`
)

// The checkpoint reads. A cursor is opaque text from a relay or PDS (for
// io.atcr.repo.page, listRecords pages by rkey: the repository name), so it
// is read through database.Text to reach the next request byte for byte.
var (
	collectionSQL = `SELECT ` + database.Text("relay") + `, ` + database.Text("relay_cursor") + `, done
FROM backfill_collections WHERE run_id = ?1 AND collection = ?2`

	repoStatesSQL = `SELECT ` + database.Text("did") + `, ` + database.Text("state") + `, ` + database.Text("record_cursor") + `
FROM backfill_repos WHERE run_id = ?1 AND collection = ?2`
)

// Why the backfill notes a repository in repo_incomplete.
const (
	incompleteInactive = "backfill-inactive"
	incompleteFailed   = "backfill-failed"
)

// noteIncomplete notes dids in repo_incomplete with reason, in tx.
func noteIncomplete(ctx context.Context, tx *sql.Tx, reason string, dids ...string) error {
	if len(dids) == 0 {
		return nil
	}
	pairs := make([][2]string, len(dids))
	for i, d := range dids {
		pairs[i] = [2]string{d, reason}
	}
	list, err := json.Marshal(pairs)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, noteIncompleteSQL, string(list)); err != nil {
		return fmt.Errorf("note %d repositories incomplete: %w", len(dids), err)
	}
	return nil
}

// claim is the outcome of the first write of a Run.
type claim struct {
	runID   int64
	resumed bool
	// skip is true when a run completed less than rerun_after ago.
	skip bool
	// lastCompletedAgo is how long ago the last run completed (when skip).
	lastCompletedAgo time.Duration
}

// claimRun, inside a fenced transaction, resumes the latest unfinished run
// (stamping it with this custody), or skips when rerunAfter > 0 and a run
// completed less than rerunAfter ago, or starts a new run.
func claimRun(ctx context.Context, tx *sql.Tx, fence int64, holder string, rerunAfter time.Duration) (claim, error) {
	var id int64
	err := tx.QueryRowContext(ctx, unfinishedRunSQL).Scan(&id)
	switch {
	case err == nil:
		if _, err := tx.ExecContext(ctx, resumeRunSQL, id, fence, holder); err != nil {
			return claim{}, fmt.Errorf("resume backfill run %d: %w", id, err)
		}
		return claim{runID: id, resumed: true}, nil
	case !errors.Is(err, sql.ErrNoRows):
		return claim{}, fmt.Errorf("find unfinished backfill run: %w", err)
	}
	if rerunAfter > 0 {
		var completedAt, now int64
		err := tx.QueryRowContext(ctx, lastCompletedSQL).Scan(&completedAt, &now)
		switch {
		case err == nil:
			if ago := time.Duration(now-completedAt) * time.Millisecond; ago < rerunAfter {
				return claim{skip: true, lastCompletedAgo: ago}, nil
			}
		case !errors.Is(err, sql.ErrNoRows):
			return claim{}, fmt.Errorf("find last completed backfill run: %w", err)
		}
	}
	if err := tx.QueryRowContext(ctx, newRunSQL, fence, holder).Scan(&id); err != nil {
		return claim{}, fmt.Errorf("start backfill run: %w", err)
	}
	return claim{runID: id}, nil
}

// collectionState is the checkpoint of one collection in one run.
type collectionState struct {
	relay, cursor string
}

// repoState is the checkpoint of one (collection, DID) in one run.
type repoState struct {
	state, cursor string
}
