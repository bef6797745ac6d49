package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/fence"

	"github.com/atcr-io/appview/internal/database"
)

// benchStore opens a migrated file database on one connection, closed when
// b ends, and a lease store (TTL 1 h) over it.
func benchStore(b *testing.B) (*database.DB, *lease.Store) {
	db, err := database.Open(context.Background(), database.Options{URL: "file:" + filepath.Join(b.TempDir(), "a.db"), BusyTimeout: 5 * time.Second, MaxOpenConns: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return db, lease.NewStore(db, time.Hour)
}

// BenchmarkRenewStatements prices the parts of a renewal one at a time on
// one connection: what lease.Store.Renew adds over a bare UPDATE.
func BenchmarkRenewStatements(b *testing.B) {
	ctx := context.Background()
	db, store := benchStore(b)
	const n = 100
	var cs []fence.Custody
	for i := range n {
		name := fmt.Sprintf("l%03d", i)
		g, err := store.Acquire(ctx, name, "h")
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, fence.Custody{Lease: name, Holder: "h", Fence: g.Fence})
	}
	exec := func(b *testing.B, q string, args func(c fence.Custody) []any) {
		for i := 0; b.Loop(); i++ {
			c := cs[i%n]
			if _, err := db.ExecContext(ctx, q, args(c)...); err != nil {
				b.Fatal(err)
			}
		}
	}
	now := func() int64 { return time.Now().UnixMilli() }
	b.Run("store", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if err := store.Renew(ctx, cs[i%n]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare", func(b *testing.B) {
		exec(b, bareRenewSQL, func(c fence.Custody) []any { return []any{now(), now() + 3600000, c.Lease} })
	})
	b.Run("bare+match", func(b *testing.B) {
		exec(b, `UPDATE leases SET renewed_at = ?4, expires_at = ?5 WHERE name = ?1 AND holder = ?2 AND fence = ?3`,
			func(c fence.Custody) []any { return []any{c.Lease, c.Holder, c.Fence, now(), now() + 3600000} })
	})
	b.Run("bare+dbclock", func(b *testing.B) {
		exec(b, `UPDATE leases SET renewed_at = `+database.NowMS+`, expires_at = `+database.NowMS+` + ?2 WHERE name = ?1`,
			func(c fence.Custody) []any { return []any{c.Lease, int64(3600000)} })
	})
	b.Run("store-shape-prepared", func(b *testing.B) {
		stmt, err := db.PrepareContext(ctx, `UPDATE leases SET renewed_at = `+database.NowMS+`, expires_at = `+database.NowMS+` + ?
WHERE name = ? AND holder = ? AND fence = ?`)
		if err != nil {
			b.Fatal(err)
		}
		defer stmt.Close()
		for i := 0; b.Loop(); i++ {
			c := cs[i%n]
			if _, err := stmt.ExecContext(ctx, int64(3600000), c.Lease, c.Holder, c.Fence); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare-prepared", func(b *testing.B) {
		stmt, err := db.PrepareContext(ctx, `UPDATE leases SET renewed_at = ?, expires_at = ? WHERE name = ?`)
		if err != nil {
			b.Fatal(err)
		}
		defer stmt.Close()
		for i := 0; b.Loop(); i++ {
			c := cs[i%n]
			if _, err := stmt.ExecContext(ctx, now(), now()+3600000, c.Lease); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRenewConcurrent prices the same parts with three connection
// pools (three instances) renewing at once on one file database, which is
// where renew_cost_ratio is measured.
func BenchmarkRenewConcurrent(b *testing.B) {
	ctx := context.Background()
	path := "file:" + filepath.Join(b.TempDir(), "a.db")
	var dbs []*database.DB
	for k := range 3 {
		db, err := database.Open(ctx, database.Options{URL: path, BusyTimeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		if k == 0 {
			if _, err := db.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
		}
		dbs = append(dbs, db)
	}
	const perInstance = 300
	grants := make([][]fence.Custody, 3)
	for k, db := range dbs {
		store := lease.NewStore(db, time.Hour)
		for j := range perInstance {
			name := fmt.Sprintf("l%d-%03d", k, j)
			g, err := store.Acquire(ctx, name, "h")
			if err != nil {
				b.Fatal(err)
			}
			grants[k] = append(grants[k], fence.Custody{Lease: name, Holder: "h", Fence: g.Fence})
		}
	}
	now := func() int64 { return time.Now().UnixMilli() }
	variants := []struct {
		name string
		q    string
		args func(c fence.Custody) []any
	}{
		{"store-sql", `UPDATE leases SET renewed_at = ` + database.NowMS + `, expires_at = ` + database.NowMS + ` + ?4
WHERE name = ?1 AND holder = ?2 AND fence = ?3`, func(c fence.Custody) []any { return []any{c.Lease, c.Holder, c.Fence, int64(3600000)} }},
		{"bare", bareRenewSQL, func(c fence.Custody) []any { return []any{now(), now() + 3600000, c.Lease} }},
		{"bare+match", `UPDATE leases SET renewed_at = ?4, expires_at = ?5 WHERE name = ?1 AND holder = ?2 AND fence = ?3`,
			func(c fence.Custody) []any { return []any{c.Lease, c.Holder, c.Fence, now(), now() + 3600000} }},
		{"bare+dbclock", `UPDATE leases SET renewed_at = ` + database.NowMS + `, expires_at = ` + database.NowMS + ` + ?2 WHERE name = ?1`,
			func(c fence.Custody) []any { return []any{c.Lease, int64(3600000)} }},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			for b.Loop() {
				done := make(chan error, 3)
				for k, db := range dbs {
					go func() {
						for _, c := range grants[k] {
							if _, err := db.ExecContext(ctx, v.q, v.args(c)...); err != nil {
								done <- err
								return
							}
						}
						done <- nil
					}()
				}
				for range dbs {
					if err := <-done; err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkRenewAll prices the batched renewal on one connection, per
// statement, for a few batch sizes, next to the bare single-row UPDATEs it
// replaces.
func BenchmarkRenewAll(b *testing.B) {
	ctx := context.Background()
	db, store := benchStore(b)
	var cs []fence.Custody
	for i := range 1000 {
		name := fmt.Sprintf("l%04d", i)
		g, err := store.Acquire(ctx, name, "h")
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, fence.Custody{Lease: name, Holder: "h", Fence: g.Fence})
	}
	for _, n := range []int{1, 5, 100, 1000} {
		b.Run(fmt.Sprintf("batched-%d", n), func(b *testing.B) {
			for b.Loop() {
				for _, err := range store.RenewAll(ctx, cs[:n]) {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run(fmt.Sprintf("bare-%d", n), func(b *testing.B) {
			for b.Loop() {
				for _, c := range cs[:n] {
					now := time.Now().UnixMilli()
					if _, err := db.ExecContext(ctx, bareRenewSQL, now, now+3600000, c.Lease); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
