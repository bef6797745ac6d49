package processor

import (
	"encoding/json"
	"fmt"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/database"
)

type statsRecord struct {
	recordType
	OwnerDID   *string `json:"ownerDid"`
	Repository *string `json:"repository"`
	PullCount  *int64  `json:"pullCount"`
	PushCount  *int64  `json:"pushCount"`
	UpdatedAt  *string `json:"updatedAt"`
	LastPull   *string `json:"lastPull"`
	LastPush   *string `json:"lastPush"`
}

func decodeStats(raw json.RawMessage) (*HoldStat, error) {
	var r statsRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionStats, r.Type)
	c.required("ownerDid", r.OwnerDID != nil)
	c.required("repository", r.Repository != nil)
	c.required("pullCount", r.PullCount != nil)
	c.required("pushCount", r.PushCount != nil)
	c.required("updatedAt", r.UpdatedAt != nil)
	c.nonEmpty("repository", r.Repository)
	if c.err != nil {
		return nil, c.err
	}
	c.did("ownerDid", *r.OwnerDID)
	c.maxLen("repository", *r.Repository, maxPageRepositoryLen)
	c.repository("repository", *r.Repository)
	c.count("pullCount", *r.PullCount)
	c.count("pushCount", *r.PushCount)
	s := &HoldStat{
		OwnerDID:   *r.OwnerDID,
		Repository: *r.Repository,
		PullCount:  *r.PullCount,
		PushCount:  *r.PushCount,
		UpdatedAt:  c.datetime("updatedAt", r.UpdatedAt),
	}
	if r.LastPull != nil {
		v := c.datetime("lastPull", r.LastPull)
		s.LastPull = &v
	}
	if r.LastPush != nil {
		v := c.datetime("lastPush", r.LastPush)
		s.LastPush = &v
	}
	return s, c.err
}

// putStats writes one hold's absolute counts. Newer-wins is decided by the
// record's version (the hold repo's rev) in SQL, so no cache (warm or cold)
// can regress a row; the record's updatedAt is data only (two updates in
// one millisecond are still ordered).
func (a *applier) putStats(o *op) (bool, error) {
	s := o.stats
	n, err := a.exec(`INSERT INTO repository_hold_stats (did, repository, hold_did, rkey, pull_count, push_count,
  last_pull, last_push, updated_at, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
ON CONFLICT (did, repository, hold_did) DO UPDATE SET rkey = excluded.rkey, pull_count = excluded.pull_count,
  push_count = excluded.push_count, last_pull = excluded.last_pull, last_push = excluded.last_push,
  updated_at = excluded.updated_at, source_us = excluded.source_us, version = excluded.version
WHERE excluded.version > repository_hold_stats.version`,
		s.OwnerDID, s.Repository, s.HoldDID, s.RKey, s.PullCount, s.PushCount, s.LastPull, s.LastPush, s.UpdatedAt, s.SourceUS, s.Version)
	if err != nil {
		return false, fmt.Errorf("upsert hold stats: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	a.pendingStats = append(a.pendingStats, *s)
	a.pendingTouched = append(a.pendingTouched, repoKey{s.OwnerDID, s.Repository})
	return true, nil
}

// newerHoldStatsSQL: see newerVersionSQL.
const newerHoldStatsSQL = `SELECT 1 FROM repository_hold_stats WHERE hold_did = ?1 AND rkey = ?2 AND version > ?3 LIMIT 1`

// dropMovedHoldStats removes the counts an older version of o's record
// stored for another repository (see dropMoved): the StatsCache and the
// old repository's aggregate lose this hold's numbers, as on a delete of
// the record.
func (a *applier) dropMovedHoldStats(o *op) error {
	s := o.stats
	var old HoldStat
	found, err := a.queryRow(`DELETE FROM repository_hold_stats WHERE hold_did = ?1 AND rkey = ?2 AND version < ?3
  AND NOT (did = ?4 AND repository = ?5)
RETURNING `+database.Text("did")+`, `+database.Text("repository")+`, pull_count, push_count, last_pull, last_push, updated_at`,
		[]any{o.did, o.rkey, o.version, s.OwnerDID, s.Repository},
		&old.OwnerDID, &old.Repository, &old.PullCount, &old.PushCount, &old.LastPull, &old.LastPush, &old.UpdatedAt)
	if err != nil || !found {
		return err
	}
	old.HoldDID, old.RKey, old.SourceUS, old.Version, old.Deleted = o.did, o.rkey, o.ev.TimeUS, o.version, true
	a.pendingStats = append(a.pendingStats, old)
	a.pendingTouched = append(a.pendingTouched, repoKey{old.OwnerDID, old.Repository})
	return nil
}

// deleteHoldStats removes the counts o's record stored (see
// deleteRecord): the StatsCache and the repository's aggregate lose this
// hold's numbers.
func (a *applier) deleteHoldStats(o *op) (int64, error) {
	var s HoldStat
	found, err := a.queryRow(`SELECT `+database.Text("did")+`, `+database.Text("repository")+`, pull_count, push_count, last_pull, last_push, updated_at
FROM repository_hold_stats WHERE hold_did = ?1 AND rkey = ?2 AND version <= ?3`,
		[]any{o.did, o.rkey, o.version}, &s.OwnerDID, &s.Repository, &s.PullCount, &s.PushCount, &s.LastPull, &s.LastPush, &s.UpdatedAt)
	if err != nil || !found {
		return 0, err
	}
	n, err := a.exec(`DELETE FROM repository_hold_stats WHERE did = ?1 AND repository = ?2 AND hold_did = ?3`,
		s.OwnerDID, s.Repository, o.did)
	s.HoldDID, s.RKey, s.SourceUS, s.Version, s.Deleted = o.did, o.rkey, o.ev.TimeUS, o.version, true
	a.pendingStats = append(a.pendingStats, s)
	a.pendingTouched = append(a.pendingTouched, repoKey{s.OwnerDID, s.Repository})
	return n, err
}
