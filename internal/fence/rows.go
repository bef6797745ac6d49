package fence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/database"
)

// Row is one row of the leases table (docs/spec.md §4) as seen at Now.
type Row struct {
	Name       string `json:"name"`
	Holder     string `json:"holder"`
	Fence      int64  `json:"fence"`
	AcquiredAt int64  `json:"acquired_at"` // Unix ms
	RenewedAt  int64  `json:"renewed_at"`  // Unix ms
	ExpiresAt  int64  `json:"expires_at"`  // Unix ms
	// Now is the database clock when the row was read, Unix ms.
	Now int64 `json:"now"`
}

// Row states shown by `appview leases` (docs/spec.md §2).
const (
	StateHeld     = "held"
	StateExpired  = "expired"
	StateReleased = "released"
)

// State is held (unexpired), released (expired in place by a clean release,
// which sets renewed_at = expires_at) or expired (ran out its TTL).
func (r Row) State() string {
	switch {
	case r.ExpiresAt > r.Now:
		return StateHeld
	case r.ExpiresAt == r.RenewedAt:
		return StateReleased
	default:
		return StateExpired
	}
}

// TimeLeft is how long the grant has left (0 when not held).
func (r Row) TimeLeft() time.Duration {
	if r.ExpiresAt <= r.Now {
		return 0
	}
	return time.Duration(r.ExpiresAt-r.Now) * time.Millisecond
}

// Listed is a row as `appview leases --json` and GET /debug/leases show it
// (docs/spec.md §2): the row, its state and how long its grant has left.
type Listed struct {
	Row
	State      string `json:"state"`
	TimeLeftMS int64  `json:"time_left_ms"` // 0 when not held
}

// Listed returns r with its state and time left.
func (r Row) Listed() Listed {
	return Listed{Row: r, State: r.State(), TimeLeftMS: r.TimeLeft().Milliseconds()}
}

// listSQL reads every lease row at one instant of the database clock,
// name and holder through database.Text (an instance_id may look like a
// date, and must be reported exactly as stored).
var listSQL = `SELECT ` + database.Text("name") + `, ` + database.Text("holder") + `, fence, acquired_at, renewed_at, expires_at, ` +
	database.NowMS + ` FROM leases ORDER BY name`

// List returns every lease row, read at one instant of the database clock.
func List(ctx context.Context, db database.Querier) ([]Row, error) {
	rows, err := db.QueryContext(ctx, listSQL)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.Name, &r.Holder, &r.Fence, &r.AcquiredAt, &r.RenewedAt, &r.ExpiresAt, &r.Now); err != nil {
			return nil, fmt.Errorf("list leases: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// ListBounded is List that returns ctx.Err() when ctx ends first (the
// driver ignores contexts).
func ListBounded(ctx context.Context, db database.Querier) ([]Row, error) {
	var rows []Row
	err := database.Bounded(ctx, func() (err error) {
		rows, err = List(ctx, db)
		return err
	})
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	return rows, err
}
