package leasestore

import (
	"context"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/database"
)

// UnleasedMark is the lease_contenders name under which an instance that
// runs with leases off (leases.enabled false: every worker unfenced, on
// the understanding that it is the only instance) records itself: its
// instance_id and process nonce, seen_at refreshed every renew interval
// (MarkUnleased), the record deleted at its stop (UnmarkUnleased). No
// lease has this name (lease names are worker names, and this one is not
// a valid one), so no holder nudges it and no contender count includes
// it. Instances read it at start (UnleasedOthers): a leased instance
// beside a live unleased one would run its workers, fenced, next to that
// one's unfenced copies of the same workers, and a second unleased
// instance would run every worker twice.
const UnleasedMark = "(unleased)"

// MarkUnleased records this process as running with leases off, or
// refreshes its record (seen_at = now on the database clock). It returns
// the database's error.
func (s *Store) MarkUnleased(ctx context.Context, instance string) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO lease_contenders (name, instance, nudge_url, seen_at, nonce, healthy)
VALUES (?1, ?2, '', `+database.NowMS+`, ?3, 1)
ON CONFLICT (name, instance) DO UPDATE SET nudge_url = '', seen_at = excluded.seen_at, nonce = excluded.nonce`,
		UnleasedMark, instance, s.nonce)
	if err != nil {
		return fmt.Errorf("record instance %q as running with leases off: %w", instance, err)
	}
	return nil
}

// UnmarkUnleased deletes this process's UnleasedMark record (a record of
// another process start under the same instance_id is left alone). It
// returns the database's error.
func (s *Store) UnmarkUnleased(ctx context.Context, instance string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM lease_contenders WHERE name = ?1 AND instance = ?2 AND nonce = ?3`,
		UnleasedMark, instance, s.nonce)
	if err != nil {
		return fmt.Errorf("delete the leases-off record of instance %q: %w", instance, err)
	}
	return nil
}

// UnleasedInstance is a live UnleasedMark record: an instance running
// with leases off, and how long ago (database clock) it last refreshed
// its record.
type UnleasedInstance struct {
	Instance string
	Age      time.Duration
}

// unleasedOthersSQL reads the UnleasedMark records of instance_ids other
// than ?2 refreshed within the last ?3 ms, the freshest first.
var unleasedOthersSQL = `SELECT ` + database.Text("instance") + `, ` + database.NowMS + ` - seen_at FROM lease_contenders
WHERE name = ?1 AND instance <> ?2 AND seen_at > ` + database.NowMS + ` - ?3
ORDER BY seen_at DESC, instance`

// UnleasedOthers returns the instances other than instance that run with
// leases off on db now: an UnleasedMark record refreshed within window
// (a live instance refreshes it every renew interval, under half a TTL; a
// crashed one's record ages past window and stops counting). A record of
// instance itself is not counted: it is this instance's own earlier run
// (restarted after a crash: its record is younger than window), or a
// second process under one instance_id, which the lease table's nonces
// already tell apart. The read is bounded by ctx (the driver ignores it);
// it returns the database's error.
func UnleasedOthers(ctx context.Context, db Querier, instance string, window time.Duration) ([]UnleasedInstance, error) {
	var out []UnleasedInstance
	err := database.Bounded(ctx, func() error {
		rows, err := db.QueryContext(ctx, unleasedOthersSQL, UnleasedMark, instance, window.Milliseconds())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				u     UnleasedInstance
				ageMS int64
			)
			if err := rows.Scan(&u.Instance, &ageMS); err != nil {
				return err
			}
			u.Age = time.Duration(max(ageMS, 0)) * time.Millisecond
			out = append(out, u)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("look for instances running with leases off: %w", err)
	}
	return out, nil
}
