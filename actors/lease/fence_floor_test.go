package lease

import (
	"context"
	"database/sql"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

// Fence must never go backwards, even if a row is deleted.
func TestTheFenceNeverGoesBackEvenIfTheRowIsDeleted(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := NewStore(db, longTTL)
	c := mustAcquire(t, s, "x", "a")
	if err := s.Release(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	c = mustAcquire(t, s, "x", "b")
	if err := s.Release(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`DELETE FROM leases WHERE name = 'x'`); err != nil {
		t.Logf("delete refused: %v", err)
		return
	}
	c2 := mustAcquire(t, s, "x", "c")
	if c2.Fence <= c.Fence {
		t.Fatalf("fence went backwards after the row was deleted: %d then %d", c.Fence, c2.Fence)
	}
}

func TestAFenceAtMaxInt64IsRefusedNotTurnedIntoAReal(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := NewStore(db, longTTL)
	c := mustAcquire(t, s, "x", "a")
	if err := s.Release(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE leases SET fence = ?1 WHERE name = 'x'`, int64(math.MaxInt64)); err != nil {
		t.Fatal(err)
	}
	g, err := s.Acquire(context.Background(), "x", "b")
	if err == nil && g.Granted && g.Fence <= 0 {
		t.Fatalf("fence wrapped: %d", g.Fence)
	}
	var typ string
	var raw any
	if err := db.QueryRow(`SELECT typeof(fence), fence FROM leases WHERE name='x'`).Scan(&typ, &raw); err != nil {
		t.Fatal(err)
	}
	if typ != "integer" {
		t.Fatalf("acquire at fence MaxInt64 (answer %+v, %v) left fence a %s (%v): the row, and fence.List, are unreadable", g, err, typ, raw)
	}
	rows, lerr := fence.List(context.Background(), db)
	if lerr != nil || len(rows) != 1 || rows[0].Holder != "a" {
		t.Fatalf("after acquire at MaxInt64 (answer %+v, %v): list %+v, %v; want the row untouched", g, err, rows, lerr)
	}
	if err == nil {
		t.Fatalf("acquire at fence MaxInt64 answered %+v with no error", g)
	}
	// Asked again, by a store that has now seen that fence: refused again,
	// not answered as a grant expired a moment ago (retried at once).
	if g, err := s.Acquire(context.Background(), "x", "b"); err == nil {
		t.Fatalf("second acquire at fence MaxInt64 answered %+v with no error", g)
	}
}

func readRowHolder(t *testing.T, s *Store) string {
	rows, err := fence.List(context.Background(), s.db)
	if err != nil {
		return "list error: " + err.Error()
	}
	var b strings.Builder
	for _, r := range rows {
		b.WriteString(r.Holder)
	}
	return b.String()
}

func TestOddNamesAndHoldersRoundTrip(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := NewStore(db, longTTL)
	names := []string{"", " ", "a'b", `a"b`, strings.Repeat("n", 100000), "ünï", "1234", "2024-01-01", "NULL", "a\nb"}
	for _, n := range names {
		for _, h := range []string{"", " ", strings.Repeat("h", 50000), "12", "2024-06-01T12:00:00Z", "0x10"} {
			g, err := s.Acquire(context.Background(), n, h)
			if err != nil {
				t.Fatalf("acquire %q/%q: %v", trunc(n), trunc(h), err)
			}
			if !g.Granted {
				t.Fatalf("acquire %q/%q not granted: %+v", trunc(n), trunc(h), g)
			}
			c := fence.Custody{Lease: n, Holder: h, Fence: g.Fence}
			if err := s.Renew(context.Background(), c); err != nil {
				t.Fatalf("renew %q/%q: %v", trunc(n), trunc(h), err)
			}
			if err := fence.Fenced(context.Background(), db, c, func(*sql.Tx) error { return nil }); err != nil {
				t.Fatalf("fenced %q/%q: %v", trunc(n), trunc(h), err)
			}
			if err := s.Release(context.Background(), c); err != nil {
				t.Fatalf("release %q/%q: %v", trunc(n), trunc(h), err)
			}
		}
	}
	rows, err := fence.List(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range rows {
		got[r.Name] = true
	}
	for _, n := range names {
		if !got[n] {
			t.Errorf("name %q not listed exactly", trunc(n))
		}
	}
}

func trunc(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}

var _ = time.Second
