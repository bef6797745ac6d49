package leasestore_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/leasestore"
	"github.com/atcr-io/appview/internal/testsupport"
)

// A holder hands its grant to a contender that stands by: the row carries
// the contender, the next fence and the contender's TTL; the contender's
// read finds it its own, and it renews and releases it as a grant of its
// own acquire; the former holder matches nothing any more.
func TestTransferHandsTheGrantToARecordedContender(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	ctx := context.Background()
	a, b := leasestore.NewStore(db, time.Minute), leasestore.NewStore(db, 2*time.Minute)
	g, err := a.Acquire(ctx, "cleanup", "a")
	if err != nil || !g.Granted {
		t.Fatal(g, err)
	}
	register(t, db, "cleanup", "b", b.Nonce(), "http://127.0.0.1:1/lease/nudge")
	old := fence.Custody{Lease: "cleanup", Holder: "a", Fence: g.Fence}
	next, err := a.Transfer(ctx, old, leasestore.Successor{Instance: "b", Nonce: b.Nonce(), TTL: 2 * time.Minute}, time.Minute)
	if err != nil || next != g.Fence+1 {
		t.Fatalf("Transfer = %d, %v; want fence %d", next, err, g.Fence+1)
	}
	v, err := b.Watch(ctx, "cleanup", "b")
	if err != nil || v.Free || !v.Ours || v.Fence != next || v.Age < 0 || v.Age > 5*time.Second ||
		v.TimeLeft <= time.Minute+50*time.Second || v.TimeLeft > 2*time.Minute {
		t.Fatalf("the successor's Watch = %+v, %v; want its own grant at fence %d, young, about 2 min left", v, err, next)
	}
	if v, err := a.Watch(ctx, "cleanup", "a"); err != nil || v.Ours || v.Free {
		t.Fatalf("the former holder's Watch = %+v, %v; want held, not its own", v, err)
	}
	for name, err := range map[string]error{
		"renew":   a.Renew(ctx, old),
		"release": a.Release(ctx, old),
		"transfer": func() error {
			_, err := a.Transfer(ctx, old, leasestore.Successor{Instance: "b", Nonce: b.Nonce(), TTL: time.Minute}, time.Minute)
			return err
		}(),
	} {
		if err == nil {
			t.Errorf("the former holder's %s after the handover succeeded", name)
		}
	}
	got := fence.Custody{Lease: "cleanup", Holder: "b", Fence: next}
	if err := b.Renew(ctx, got); err != nil {
		t.Fatalf("the successor's renewal: %v", err)
	}
	if err := b.Release(ctx, got); err != nil {
		t.Fatalf("the successor's release (its nonce recorded with the grant): %v", err)
	}
}

// Transfer changes nothing, and says so, unless the grant is the caller's
// own and held and the successor is a contender recorded with that nonce
// lately; a refusal leaves the grant to be released as before.
func TestTransferRefusesWhatIsNotTheHoldersToGive(t *testing.T) {
	ctx := context.Background()
	const window = time.Minute
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, db *sql.DB, a *leasestore.Store, c *fence.Custody, to *leasestore.Successor)
	}{
		{"no contender record", func(t *testing.T, db *sql.DB, a *leasestore.Store, c *fence.Custody, to *leasestore.Successor) {
			mustExec(t, db, `DELETE FROM lease_contenders`)
		}},
		{"another nonce recorded", func(t *testing.T, db *sql.DB, a *leasestore.Store, c *fence.Custody, to *leasestore.Successor) {
			to.Nonce = "0123456789abcdef"
		}},
		{"a record not seen lately", func(t *testing.T, db *sql.DB, a *leasestore.Store, c *fence.Custody, to *leasestore.Successor) {
			mustExec(t, db, `UPDATE lease_contenders SET seen_at = seen_at - 120000`)
		}},
		{"a record for another lease", func(t *testing.T, db *sql.DB, a *leasestore.Store, c *fence.Custody, to *leasestore.Successor) {
			mustExec(t, db, `UPDATE lease_contenders SET name = 'backfill'`)
		}},
		{"released", func(t *testing.T, db *sql.DB, a *leasestore.Store, c *fence.Custody, to *leasestore.Successor) {
			if err := a.Release(ctx, *c); err != nil {
				t.Fatal(err)
			}
		}},
		{"run out", func(t *testing.T, db *sql.DB, a *leasestore.Store, c *fence.Custody, to *leasestore.Successor) {
			mustExec(t, db, `UPDATE leases SET expires_at = expires_at - 120000`)
		}},
		{"another fence", func(t *testing.T, db *sql.DB, a *leasestore.Store, c *fence.Custody, to *leasestore.Successor) {
			c.Fence++
		}},
		{"another holder", func(t *testing.T, db *sql.DB, a *leasestore.Store, c *fence.Custody, to *leasestore.Successor) {
			c.Holder = "x"
		}},
		{"no TTL", func(t *testing.T, db *sql.DB, a *leasestore.Store, c *fence.Custody, to *leasestore.Successor) {
			to.TTL = 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := testsupport.OpenDB(t).DB
			a, b := leasestore.NewStore(db, time.Minute), leasestore.NewStore(db, time.Minute)
			g, err := a.Acquire(ctx, "cleanup", "a")
			if err != nil || !g.Granted {
				t.Fatal(g, err)
			}
			register(t, db, "cleanup", "b", b.Nonce(), "http://127.0.0.1:1/lease/nudge")
			c := fence.Custody{Lease: "cleanup", Holder: "a", Fence: g.Fence}
			to := leasestore.Successor{Instance: "b", Nonce: b.Nonce(), TTL: time.Minute}
			tc.setup(t, db, a, &c, &to)
			var before string
			_ = db.QueryRow(`SELECT holder || ' ' || fence || ' ' || expires_at FROM leases`).Scan(&before)
			if next, err := a.Transfer(ctx, c, to, window); !errors.Is(err, leasestore.ErrNotTransferred) {
				t.Fatalf("Transfer = %d, %v; want ErrNotTransferred", next, err)
			}
			var after string
			_ = db.QueryRow(`SELECT holder || ' ' || fence || ' ' || expires_at FROM leases`).Scan(&after)
			if after != before {
				t.Fatalf("a refused Transfer changed the row: %q -> %q", before, after)
			}
		})
	}
	// Another process with the holder's instance_id cannot hand the
	// holder's grant over: the grant carries the holder's nonce.
	t.Run("another process of the instance", func(t *testing.T) {
		db := testsupport.OpenDB(t).DB
		a, twin, b := leasestore.NewStore(db, time.Minute), leasestore.NewStore(db, time.Minute), leasestore.NewStore(db, time.Minute)
		g, err := a.Acquire(ctx, "cleanup", "a")
		if err != nil || !g.Granted {
			t.Fatal(g, err)
		}
		register(t, db, "cleanup", "b", b.Nonce(), "http://127.0.0.1:1/lease/nudge")
		c := fence.Custody{Lease: "cleanup", Holder: "a", Fence: g.Fence}
		if _, err := twin.Transfer(ctx, c, leasestore.Successor{Instance: "b", Nonce: b.Nonce(), TTL: time.Minute}, window); !errors.Is(err, leasestore.ErrNotTransferred) {
			t.Fatalf("Transfer by a twin = %v; want ErrNotTransferred", err)
		}
	})
}

// The handed-over fence follows the acquire's rule: one above the highest
// the name ever had (lease_fence_floor), not the row's fence + 1.
func TestTransferKeepsTheFenceAboveItsFloor(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	ctx := context.Background()
	a, b := leasestore.NewStore(db, time.Minute), leasestore.NewStore(db, time.Minute)
	g, err := a.Acquire(ctx, "cleanup", "a")
	if err != nil || !g.Granted {
		t.Fatal(g, err)
	}
	mustExec(t, db, `UPDATE lease_fence_floor SET fence = 41 WHERE name = 'cleanup'`)
	register(t, db, "cleanup", "b", b.Nonce(), "http://127.0.0.1:1/lease/nudge")
	next, err := a.Transfer(ctx, fence.Custody{Lease: "cleanup", Holder: "a", Fence: g.Fence},
		leasestore.Successor{Instance: "b", Nonce: b.Nonce(), TTL: time.Minute}, time.Minute)
	if err != nil || next != 42 {
		t.Fatalf("Transfer = %d, %v; want fence 42", next, err)
	}
}

func mustExec(t *testing.T, db *sql.DB, query string) {
	t.Helper()
	if _, err := db.Exec(query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// Announce returns, as successors, the contenders whose answers say they
// watch the row (200 with their instance, nonce and TTL); a 202, and an
// answer that is not a well-formed successor, offer nothing (the lease is
// then released as before).
func TestAnnounceReturnsTheContendersThatWatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   []leasestore.Successor
	}{
		{"watching", http.StatusOK, `{"instance":"c","nonce":"0123456789abcdef","ttl_ms":15000}`,
			[]leasestore.Successor{{Instance: "c", Nonce: "0123456789abcdef", TTL: 15 * time.Second}}},
		{"not watching", http.StatusAccepted, ``, nil},
		{"not JSON", http.StatusOK, `watching`, nil},
		{"no instance", http.StatusOK, `{"nonce":"0123456789abcdef","ttl_ms":15000}`, nil},
		{"a nonce not of 16 hex digits", http.StatusOK, `{"instance":"c","nonce":"xyz","ttl_ms":15000}`, nil},
		{"no TTL", http.StatusOK, `{"instance":"c","nonce":"0123456789abcdef"}`, nil},
		{"a TTL over leases.ttl's ceiling", http.StatusOK, `{"instance":"c","nonce":"0123456789abcdef","ttl_ms":3600001}`, nil},
		{"a TTL at the ceiling", http.StatusOK, `{"instance":"c","nonce":"0123456789abcdef","ttl_ms":3600000}`,
			[]leasestore.Successor{{Instance: "c", Nonce: "0123456789abcdef", TTL: time.Hour}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := testsupport.OpenDB(t).DB
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}))
			t.Cleanup(srv.Close)
			register(t, db, "cleanup", "c", "0123456789abcdef", srv.URL+leasestore.NudgePath)
			h := preparedHolder(t, db, "cleanup")
			if !h.Announces("cleanup") {
				t.Fatal("Announces = false with a contender known")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			got := h.Announce(ctx, "cleanup")
			h.Wait()
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Announce = %+v; want %+v", got, tc.want)
			}
		})
	}
}
