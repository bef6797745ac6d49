package system

import (
	"context"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/database"
)

// UnleasedGrace is added to twice an unleased instance's refresh interval
// before its record counts as overdue (UnleasedInstance.Live): a refresh
// late by a busy database or a paused process is not a dead instance.
const UnleasedGrace = time.Second

// UnleasedInstance is a row of unleased_instances: a process start running
// with leases off (leases.enabled false), which records itself while it
// runs (Store.MarkUnleased).
type UnleasedInstance struct {
	Instance string
	Nonce    string
	// StartedAt and SeenAt are Unix ms on the database clock: its first
	// record and its last refresh.
	StartedAt, SeenAt int64
	// Age is how long ago it last refreshed (database clock, at the read).
	Age time.Duration
	// Every is its refresh interval.
	Every time.Duration
}

// Overdue is how long after the read its next refresh is overdue: at most
// 2 × Every + UnleasedGrace after the last one. Zero or less means it is
// overdue now: the process is gone (crashed, killed) or cannot write.
func (u UnleasedInstance) Overdue() time.Duration {
	return 2*u.Every + UnleasedGrace - u.Age
}

// Live reports whether the record's refreshes are not overdue.
func (u UnleasedInstance) Live() bool { return u.Overdue() > 0 }

// String is "INSTANCE (seen 1.2s ago)".
func (u UnleasedInstance) String() string {
	return fmt.Sprintf("%s (seen %s ago)", u.Instance, u.Age.Round(time.Millisecond))
}

// MarkUnleased records this process start (its nonce: lease.Store.Nonce) as running with leases off, or
// refreshes its record (seen_at = now on the database clock; started_at
// kept from the first), with every, its refresh interval. It also deletes
// the records of other process starts that are overdue (crashed ones). It
// returns the database's error.
func MarkUnleased(ctx context.Context, db *database.DB, instance, nonce string, every time.Duration) error {
	_, err := db.ExecContext(ctx, `INSERT INTO unleased_instances (instance, nonce, started_at, seen_at, every_ms)
VALUES (?1, ?2, `+database.NowMS+`, `+database.NowMS+`, ?3)
ON CONFLICT (instance, nonce) DO UPDATE SET seen_at = excluded.seen_at, every_ms = excluded.every_ms`,
		instance, nonce, every.Milliseconds())
	if err != nil {
		return fmt.Errorf("record instance %q as running with leases off: %w", instance, err)
	}
	_, err = db.ExecContext(ctx, `DELETE FROM unleased_instances
WHERE nonce <> ?1 AND seen_at < `+database.NowMS+` - 2 * every_ms - ?2`, nonce, UnleasedGrace.Milliseconds())
	if err != nil {
		return fmt.Errorf("delete the overdue leases-off records: %w", err)
	}
	return nil
}

// UnmarkUnleased deletes this process's record (a record of another
// process start, under the same instance_id or not, is left alone). It
// returns the database's error.
func UnmarkUnleased(ctx context.Context, db *database.DB, instance, nonce string) error {
	_, err := db.ExecContext(ctx, `DELETE FROM unleased_instances WHERE instance = ?1 AND nonce = ?2`, instance, nonce)
	if err != nil {
		return fmt.Errorf("delete the leases-off record of instance %q: %w", instance, err)
	}
	return nil
}

// listUnleasedSQL reads every record with its age on the database clock,
// the earliest start first.
var listUnleasedSQL = `SELECT ` + database.Text("instance") + `, ` + database.Text("nonce") + `, started_at, seen_at, ` +
	database.NowMS + ` - seen_at, every_ms FROM unleased_instances ORDER BY started_at, nonce`

// ListUnleased returns every unleased_instances record, live or overdue,
// the earliest start first (then by nonce). The read is bounded by ctx
// (the driver ignores it); it returns the database's error.
func ListUnleased(ctx context.Context, db database.Querier) ([]UnleasedInstance, error) {
	var out []UnleasedInstance
	err := database.Bounded(ctx, func() error {
		rows, err := db.QueryContext(ctx, listUnleasedSQL)
		if err != nil {
			return err
		}
		defer rows.Close()
		var list []UnleasedInstance
		for rows.Next() {
			var (
				u            UnleasedInstance
				ageMS, every int64
			)
			if err := rows.Scan(&u.Instance, &u.Nonce, &u.StartedAt, &u.SeenAt, &ageMS, &every); err != nil {
				return err
			}
			u.Age = time.Duration(max(ageMS, 0)) * time.Millisecond
			u.Every = time.Duration(max(every, 0)) * time.Millisecond
			list = append(list, u)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		out = list
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the instances running with leases off: %w", err)
	}
	return out, nil
}

// UnleasedBefore reports whether a started before b and so keeps running
// when the two find each other: the earlier start, then the smaller
// nonce (two starts in one millisecond), an order both sides compute
// alike.
func UnleasedBefore(a, b UnleasedInstance) bool {
	if a.StartedAt != b.StartedAt {
		return a.StartedAt < b.StartedAt
	}
	return a.Nonce < b.Nonce
}
