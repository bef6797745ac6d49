package processor

import (
	"encoding/json"
	"fmt"
	"sort"

	"github.com/atcr-io/appview/internal/database"
)

// refreshTouched recomputes the aggregate of every touched repository, a
// chunk of repositories per statement (database.Chunks).
func (a *applier) refreshTouched() error {
	keys := sortedKeys(a.touched)
	return database.Chunks(len(keys), 3, 1, func(lo, hi int) error {
		tuples := make([][3]any, hi-lo)
		for i, k := range keys[lo:hi] {
			tuples[i] = [3]any{k.did, k.repository, a.touched[k]}
		}
		list, err := json.Marshal(tuples)
		if err == nil {
			_, err = a.tx.ExecContext(a.ctx, refreshManySQL, string(list), a.fence)
		}
		if err != nil {
			return fmt.Errorf("refresh repository_stats: %w", err)
		}
		return nil
	})
}

// refreshManySQL recomputes the aggregate (docs/spec.md §8
// repository_stats: sums over holds, saturating with SaturatingSumSQL;
// the latest last_pull and last_push; the star count) of the repositories
// in ?1, a JSON array of [did, repository, updated_at (ms)] tuples, with
// ?2 the fence. One parameter for any number of repositories, so the
// statement stays compiled (see readTombstonesSQL).
var refreshManySQL = `WITH k AS (SELECT j.value ->> 0 AS did, j.value ->> 1 AS repository, j.value ->> 2 AS at
  FROM json_each(?1) AS j)
INSERT INTO repository_stats (did, repository, pull_count, push_count, last_pull, last_push, star_count, fence, updated_at)
SELECT k.did, k.repository, ` + SaturatingSumSQL("h.pull_count") + `, ` + SaturatingSumSQL("h.push_count") + `,
  MAX(h.last_pull), MAX(h.last_push),
  ` + StarCountSQL("k") + `, ?2, k.at
FROM k LEFT JOIN repository_hold_stats AS h ON h.did = k.did AND h.repository = k.repository
WHERE true
GROUP BY k.did, k.repository
` + refreshConflict

// refreshConflict writes a recomputed row when its values changed or its
// updated_at is newer.
const refreshConflict = `ON CONFLICT (did, repository) DO UPDATE SET pull_count = excluded.pull_count, push_count = excluded.push_count,
  last_pull = excluded.last_pull, last_push = excluded.last_push, star_count = excluded.star_count,
  fence = excluded.fence, updated_at = excluded.updated_at
WHERE excluded.updated_at > repository_stats.updated_at
   OR (repository_stats.pull_count, repository_stats.push_count, repository_stats.last_pull, repository_stats.last_push,
       repository_stats.star_count)
   IS NOT (excluded.pull_count, excluded.push_count, excluded.last_pull, excluded.last_push, excluded.star_count)`

// StarCountSQL is the SQL expression counting the stars of the
// repository (did, repository) of the row alias k: stars of inactive
// accounts (users.active 0: deactivated, taken down, deleted) do not
// count. Nothing of an inactive account is visible (docs/interop.md), and
// the backfill, which skips inactive repos, never stores their stars: the
// live and the backfilled index agree. An account that becomes active
// again counts again (account touches what it starred).
func StarCountSQL(k string) string {
	return `(SELECT COUNT(*) FROM stars s WHERE s.owner_did = ` + k + `.did AND s.repository = ` + k + `.repository
    AND NOT EXISTS (SELECT 1 FROM users u WHERE u.did = s.did AND u.active = 0))`
}

// SaturatingSumSQL is the SQL aggregate summing an INTEGER count column
// over a group, capped at MaxSafeInteger, 0 for no rows. SQLite's SUM
// fails the whole statement with "integer overflow" past int64, which
// would make one repository's aggregate (and so every batch touching it)
// fail forever; TOTAL sums in float64 and never fails. For non-negative
// counts every partial sum below 2^53 is exact in float64, and once a sum
// reaches 2^53 it stays there or above, so the capped result is exactly
// min(sum, MaxSafeInteger).
func SaturatingSumSQL(column string) string {
	return fmt.Sprintf("CAST(MIN(TOTAL(%s), %d) AS INTEGER)", column, int64(MaxSafeInteger))
}

// repoKey names one repository: its owner's DID and its name.
type repoKey struct{ did, repository string }

func sortedKeys(m map[repoKey]int64) []repoKey {
	out := make([]repoKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].did != out[j].did {
			return out[i].did < out[j].did
		}
		return out[i].repository < out[j].repository
	})
	return out
}
