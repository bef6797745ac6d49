package lease_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

// BenchmarkRenewFloor prices, on one file connection, the parts a
// renewal statement is made of, to show where the batched renewal's cost
// floor lies at a few leases (renew_cost_ratio_5 in appview bench;
// docs/performance.md):
//
//   - bare: one autocommit single-row UPDATE, as appview bench's baseline;
//   - bare-nomatch: the same statement matching no row, so writing and
//     committing nothing: what any statement costs through go-libsql;
//   - bare-in-tx: the UPDATE inside a transaction of 1,000, so without its
//     own transaction;
//   - batched-N and batched-N-nomatch: the store's batched statement
//     (renewAllSQL) for N grants, renewing them or (under another holder)
//     none.
//
// bare-nomatch is most of bare: a statement's own cost, paid once by a
// batched renewal and once a lease by the bare UPDATEs, is what the
// batching saves, and the per-grant remainder is what it cannot.
func BenchmarkRenewFloor(b *testing.B) {
	ctx := context.Background()
	db := testsupport.OpenDBAt(b, filepath.Join(b.TempDir(), "appview.db"))
	store := lease.NewStore(db, ttl)
	var cs []fence.Custody
	for i := range 5 {
		cs = append(cs, acquire(b, store, fmt.Sprintf("l%d", i), "h"))
	}
	const bare = `UPDATE leases SET renewed_at = ?1, expires_at = ?2 WHERE name = ?3`
	exec := func(b *testing.B, q string, args ...any) {
		for b.Loop() {
			if _, err := db.ExecContext(ctx, q, args...); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("bare", func(b *testing.B) { exec(b, bare, int64(1), int64(2), "l0") })
	b.Run("bare-nomatch", func(b *testing.B) { exec(b, bare, int64(1), int64(2), "none") })
	b.Run("bare-in-tx", func(b *testing.B) {
		tx, err := db.BeginTx(ctx, nil)
		for i := 0; err == nil && b.Loop(); i++ {
			if _, err = tx.ExecContext(ctx, bare, int64(1), int64(2), "l0"); err == nil && i%1000 == 999 {
				if err = tx.Commit(); err == nil {
					tx, err = db.BeginTx(ctx, nil)
				}
			}
		}
		if err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	})
	for _, n := range []int{1, 5} {
		list := "{"
		for i, c := range cs[:n] {
			if i > 0 {
				list += ","
			}
			list += fmt.Sprintf("%q:%d", c.Lease, c.Fence)
		}
		list += "}"
		b.Run(fmt.Sprintf("batched-%d", n), func(b *testing.B) {
			exec(b, lease.RenewAllSQL, ttl.Milliseconds(), list, "h")
		})
		b.Run(fmt.Sprintf("batched-%d-nomatch", n), func(b *testing.B) {
			exec(b, lease.RenewAllSQL, ttl.Milliseconds(), list, "someone-else")
		})
	}
}
