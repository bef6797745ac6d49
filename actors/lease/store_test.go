package lease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

const longTTL = time.Minute

// expireNow ends the grant of lease name on the database's clock, as if its
// TTL had run out (renewed_at stays, so the state reads "expired").
func expireNow(t testing.TB, db *database.DB, name string) {
	t.Helper()
	if _, err := db.Exec(`UPDATE leases SET expires_at = `+database.NowMS+` WHERE name = ?1`, name); err != nil {
		t.Fatal(err)
	}
}

func mustAcquire(t testing.TB, s *Store, name, holder string) fence.Custody {
	t.Helper()
	g, err := s.Acquire(context.Background(), name, holder)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Granted {
		t.Fatalf("%s did not get %q: held by %s (fence %d) for %s", holder, name, g.Holder, g.Fence, g.TimeLeft)
	}
	return fence.Custody{Lease: name, Holder: holder, Fence: g.Fence}
}

func TestTwoProcessesRacingForAnExpiredLeaseNeverBothWin(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	stores := []*Store{NewStore(testsupport.OpenDBAt(t, path), longTTL), NewStore(testsupport.OpenDBAt(t, path), longTTL)}
	holders := []string{"instance-a", "instance-b"}
	check := testsupport.OpenDBAt(t, path)
	ctx := context.Background()
	const races = 1000
	var lastFence int64
	wins := [2]int{}
	for i := range races {
		var (
			start  = make(chan struct{})
			wg     sync.WaitGroup
			grants [2]Grant
			errs   [2]error
		)
		for j := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				grants[j], errs[j] = stores[j].Acquire(ctx, "race", holders[j])
			}()
		}
		close(start)
		wg.Wait()
		for j, err := range errs {
			if err != nil {
				t.Fatalf("race %d: %s: %v", i, holders[j], err)
			}
		}
		if grants[0].Granted == grants[1].Granted {
			t.Fatalf("race %d: granted to both or neither: %+v", i, grants)
		}
		w, l := 0, 1
		if grants[1].Granted {
			w, l = 1, 0
		}
		wins[w]++
		if grants[w].Fence != lastFence+1 {
			t.Fatalf("race %d: granted fence %d after fence %d; every grant adds exactly 1", i, grants[w].Fence, lastFence)
		}
		if grants[l].Holder != holders[w] || grants[l].Fence != grants[w].Fence || grants[l].TimeLeft <= 0 {
			t.Fatalf("race %d: loser was told %+v, want holder %s fence %d with time left", i, grants[l], holders[w], grants[w].Fence)
		}
		c := fence.Custody{Lease: "race", Holder: holders[w], Fence: grants[w].Fence}
		before := readRow(t, check, "race")
		if err := stores[w].Renew(ctx, c); err != nil {
			t.Fatalf("race %d: winner's renewal: %v", i, err)
		}
		after := readRow(t, check, "race")
		if after.Fence != c.Fence || after.Holder != c.Holder || after.AcquiredAt != before.AcquiredAt || after.ExpiresAt < before.ExpiresAt {
			t.Fatalf("race %d: renewal changed custody: %+v -> %+v", i, before, after)
		}
		// Half the leases end by a clean release, half by running out.
		if i%2 == 0 {
			if err := stores[w].Release(ctx, c); err != nil {
				t.Fatalf("race %d: release: %v", i, err)
			}
		} else {
			expireNow(t, check, "race")
		}
		lastFence = c.Fence
	}
	if got := readRow(t, check, "race").Fence; got != races {
		t.Fatalf("fence after %d grants is %d", races, got)
	}
	t.Logf("wins: %s %d, %s %d", holders[0], wins[0], holders[1], wins[1])
}

func TestRenewAndReleaseByANonHolderAreSupersededAndChangeNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	a, b := NewStore(testsupport.OpenDBAt(t, path), longTTL), NewStore(testsupport.OpenDBAt(t, path), longTTL)
	check := testsupport.OpenDBAt(t, path)
	ctx := context.Background()
	held := mustAcquire(t, a, "cleanup", "instance-a")
	before := rowBytes(t, check, "cleanup")

	impostors := []fence.Custody{
		{Lease: "cleanup", Holder: "instance-b", Fence: held.Fence},     // another instance, right fence
		{Lease: "cleanup", Holder: "instance-a", Fence: held.Fence + 1}, // right holder, a fence not granted
		{Lease: "cleanup", Holder: "instance-a", Fence: held.Fence - 1}, // right holder, an old fence
		{Lease: "backfill", Holder: "instance-a", Fence: held.Fence},    // a lease with no row
	}
	for _, c := range impostors {
		if err := b.Renew(ctx, c); !errors.Is(err, fence.ErrSuperseded) {
			t.Errorf("renew by %+v: got %v, want fence.ErrSuperseded", c, err)
		}
		if err := b.Release(ctx, c); !errors.Is(err, fence.ErrSuperseded) {
			t.Errorf("release by %+v: got %v, want fence.ErrSuperseded", c, err)
		}
	}
	if after := rowBytes(t, check, "cleanup"); after != before {
		t.Fatalf("row changed by a non-holder:\nbefore %s\nafter  %s", before, after)
	}
	if got := rowBytes(t, check, "backfill"); got != "<no row>" {
		t.Fatalf("renew/release of a lease nobody holds created a row: %s", got)
	}
}

func TestFormerHolderCannotRenewOrReleaseAfterATakeover(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	a, b := NewStore(testsupport.OpenDBAt(t, path), longTTL), NewStore(testsupport.OpenDBAt(t, path), longTTL)
	check := testsupport.OpenDBAt(t, path)
	ctx := context.Background()
	old := mustAcquire(t, a, "jetstream-consumer", "instance-a")
	expireNow(t, check, "jetstream-consumer") // a stalled past its TTL
	cur := mustAcquire(t, b, "jetstream-consumer", "instance-b")
	if cur.Fence != old.Fence+1 {
		t.Fatalf("takeover fence %d, want %d", cur.Fence, old.Fence+1)
	}
	before := rowBytes(t, check, "jetstream-consumer")
	if err := a.Renew(ctx, old); !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("renew by the former holder: got %v, want fence.ErrSuperseded", err)
	}
	if err := a.Release(ctx, old); !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("release by the former holder: got %v, want fence.ErrSuperseded", err)
	}
	if after := rowBytes(t, check, "jetstream-consumer"); after != before {
		t.Fatalf("the former holder changed the row:\nbefore %s\nafter  %s", before, after)
	}
	// The same instance re-acquiring later gets a new fence; its old
	// custody still matches nothing.
	if err := b.Release(ctx, cur); err != nil {
		t.Fatal(err)
	}
	again := mustAcquire(t, a, "jetstream-consumer", "instance-a")
	if again.Fence != cur.Fence+1 {
		t.Fatalf("re-acquire fence %d, want %d", again.Fence, cur.Fence+1)
	}
	if err := a.Renew(ctx, old); !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("renew under a fence two grants old: got %v, want fence.ErrSuperseded", err)
	}
}

func TestReleaseExpiresTheRowInPlaceAndAContenderAcquiresAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	a, b := NewStore(testsupport.OpenDBAt(t, path), longTTL), NewStore(testsupport.OpenDBAt(t, path), longTTL)
	check := testsupport.OpenDBAt(t, path)
	ctx := context.Background()
	held := mustAcquire(t, a, "billing-tier-refresh", "instance-a")
	if g, err := b.Acquire(ctx, "billing-tier-refresh", "instance-b"); err != nil || g.Granted {
		t.Fatalf("contender got a held lease: %+v %v", g, err)
	}
	before := readRow(t, check, "billing-tier-refresh")
	if before.State() != fence.StateHeld {
		t.Fatalf("state before release: %s", before.State())
	}
	if err := a.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	after := readRow(t, check, "billing-tier-refresh")
	switch {
	case after.Holder != held.Holder || after.Fence != held.Fence:
		t.Fatalf("release changed custody: %+v", after)
	case after.AcquiredAt != before.AcquiredAt:
		t.Fatalf("release changed acquired_at: %d -> %d", before.AcquiredAt, after.AcquiredAt)
	case after.ExpiresAt > after.Now:
		t.Fatalf("released row expires at %d, after the database's now %d", after.ExpiresAt, after.Now)
	case after.RenewedAt != after.ExpiresAt:
		t.Fatalf("released row has renewed_at %d != expires_at %d", after.RenewedAt, after.ExpiresAt)
	case after.State() != fence.StateReleased:
		t.Fatalf("state after release: %s", after.State())
	}
	g, err := b.Acquire(ctx, "billing-tier-refresh", "instance-b")
	if err != nil || !g.Granted || g.Fence != held.Fence+1 {
		t.Fatalf("contender after release: %+v %v, want granted with fence %d", g, err, held.Fence+1)
	}
	// A lease that ran out reads "expired", not "released".
	expireNow(t, check, "billing-tier-refresh")
	if _, err := check.Exec(`UPDATE leases SET renewed_at = expires_at - 1 WHERE name = 'billing-tier-refresh'`); err != nil {
		t.Fatal(err)
	}
	if st := readRow(t, check, "billing-tier-refresh").State(); st != fence.StateExpired {
		t.Fatalf("state of a lease that ran out: %s", st)
	}
}

func TestReleasingAnAlreadyExpiredGrantKeepsItsExpiry(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := NewStore(db, longTTL)
	held := mustAcquire(t, s, "cleanup", "instance-a")
	if _, err := db.Exec(`UPDATE leases SET expires_at = ` + database.NowMS + ` - 5000 WHERE name = 'cleanup'`); err != nil {
		t.Fatal(err)
	}
	before := readRow(t, db, "cleanup")
	if err := s.Release(context.Background(), held); err != nil {
		t.Fatal(err)
	}
	if after := readRow(t, db, "cleanup"); after.ExpiresAt != before.ExpiresAt {
		t.Fatalf("release moved an old expiry %d to %d", before.ExpiresAt, after.ExpiresAt)
	}
}

// A released grant is never revived, and a grant another instance took
// after it ran out is never renewed by its former holder. A grant that ran
// out but that nobody took is still renewable by its holder and fence:
// nobody else has had custody in between (that would have moved the
// fence), which is how Kubernetes leases treat their own holder too.
func TestARenewalNeverRevivesAReleasedOrTakenGrant(t *testing.T) {
	for _, end := range []string{"released", "expired and taken"} {
		t.Run(end, func(t *testing.T) {
			db := testsupport.OpenDB(t)
			s := NewStore(db, longTTL)
			c := mustAcquire(t, s, "jetstream-consumer", "instance-a")
			if end == "released" {
				if err := s.Release(context.Background(), c); err != nil {
					t.Fatal(err)
				}
			} else {
				// Expired well in the past, so that no renewal in the same
				// millisecond looks like a release.
				if _, err := db.Exec(`UPDATE leases SET expires_at = `+database.NowMS+` - 1000 WHERE name = ?1`, c.Lease); err != nil {
					t.Fatal(err)
				}
				if taken := mustAcquire(t, s, c.Lease, "instance-b"); taken.Fence != c.Fence+1 {
					t.Fatalf("taken at fence %d, want %d", taken.Fence, c.Fence+1)
				}
			}
			before := rowBytes(t, db, "jetstream-consumer")
			if err := s.Renew(context.Background(), c); !errors.Is(err, fence.ErrSuperseded) {
				t.Fatalf("renewal of the %s grant: got %v, want fence.ErrSuperseded", end, err)
			}
			if after := rowBytes(t, db, "jetstream-consumer"); after != before {
				t.Fatalf("renewal changed the %s grant:\nbefore %s\nafter  %s", end, before, after)
			}
		})
	}
	t.Run("expired and untaken", func(t *testing.T) {
		db := testsupport.OpenDB(t)
		s := NewStore(db, longTTL)
		c := mustAcquire(t, s, "jetstream-consumer", "instance-a")
		if _, err := db.Exec(`UPDATE leases SET expires_at = `+database.NowMS+` - 1000 WHERE name = ?1`, c.Lease); err != nil {
			t.Fatal(err)
		}
		if err := s.Renew(context.Background(), c); err != nil {
			t.Fatalf("renewal of an expired grant nobody took: %v", err)
		}
		row := readRow(t, db, c.Lease)
		if row.Fence != c.Fence || row.Holder != c.Holder || row.State() != fence.StateHeld {
			t.Fatalf("after the renewal: %+v (%s), want holder %s fence %d held", row, row.State(), c.Holder, c.Fence)
		}
	})
}

// Healthy reports the store's latest lease write: a failure of the
// database (not a contention, not a supersession) until a write succeeds.
func TestHealthyFollowsTheLatestLeaseWrite(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := NewStore(db, longTTL)
	if err := s.Healthy(); err != nil {
		t.Fatalf("a new store: %v", err)
	}
	c := mustAcquire(t, s, "cleanup", "instance-a")
	mustAcquire(t, NewStore(db, longTTL), "backfill", "instance-b")
	if g, err := s.Acquire(context.Background(), "backfill", "instance-a"); err != nil || g.Granted {
		t.Fatalf("contended acquire: %+v, %v", g, err)
	}
	if err := s.Healthy(); err != nil {
		t.Fatalf("after a contention: %v", err)
	}
	full := errors.New("failed to execute query UPDATE leases\nerror code = 2: Error executing statement: SQLite failure: `database or disk is full`")
	s.check = func() error { return full }
	if err := s.Renew(context.Background(), c); !errors.Is(err, full) {
		t.Fatalf("renew with a failing check: %v", err)
	}
	if err := s.Healthy(); !errors.Is(err, full) {
		t.Fatalf("after a failed renewal: %v, want the failure", err)
	}
	s.check = db.CheckFile
	if err := s.Renew(context.Background(), fence.Custody{Lease: "cleanup", Holder: "instance-a", Fence: 99}); !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("renew of a stale fence: %v", err)
	}
	if err := s.Healthy(); err != nil {
		t.Fatalf("after the database answered (superseded): %v", err)
	}
}

// A worker's fenced write that the database fails counts too, and only
// the database's errors do.
func TestHealthyFollowsFencedWritesOfTheDatabase(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := NewStore(db, longTTL)
	c := mustAcquire(t, s, "cleanup", "instance-a")
	ctx := context.Background()
	if err := fence.Fenced(ctx, db, c, func(tx *sql.Tx) error { return errors.New("the hold did not answer") }); err == nil {
		t.Fatal("want the worker's error")
	}
	if err := s.Healthy(); err != nil {
		t.Fatalf("a worker's own error counted against the database: %v", err)
	}
	if err := fence.Fenced(ctx, db, c, func(tx *sql.Tx) error {
		_, err := tx.Exec(`INSERT INTO no_such_table VALUES (1)`)
		return err
	}); err == nil {
		t.Fatal("want the database's error")
	}
	if err := s.Healthy(); err == nil || !strings.Contains(err.Error(), "no such table") {
		t.Fatalf("after a fenced write the database failed: %v", err)
	}
	// Another lease's writes, and its own lease's renewals, succeeding do
	// not hide it.
	mustAcquire(t, s, "billing-tier-refresh", "instance-a")
	if err := s.Renew(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := s.Healthy(); err == nil || !strings.Contains(err.Error(), "cleanup worker") {
		t.Fatalf("after another lease's write succeeded: %v, want cleanup's failure still", err)
	}
	if err := fence.Fenced(ctx, db, c, func(tx *sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Healthy(); err != nil {
		t.Fatalf("after a fenced write that committed: %v", err)
	}
}

// A worker's failed write stops counting once this process's custody of
// its lease ends (released or lost): the lease may sit with another
// instance for good, and /readyz must not fail until it comes back. A
// write of the ended custody that finishes late does not count either;
// a failure under a later custody does.
func TestHealthyForgetsAWorkersFailureWhenItsCustodyEnds(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := NewStore(db, longTTL)
	c := mustAcquire(t, s, "cleanup", "instance-a")
	ctx := context.Background()
	broken := func(tx *sql.Tx) error {
		_, err := tx.Exec(`INSERT INTO no_such_table VALUES (1)`)
		return err
	}
	if err := fence.Fenced(ctx, db, c, broken); err == nil {
		t.Fatal("want the database's error")
	}
	if err := s.Healthy(); err == nil {
		t.Fatal("a failed worker write did not count")
	}
	fence.CustodyEnded(db, fence.Custody{Lease: c.Lease, Holder: c.Holder, Fence: c.Fence - 1})
	if err := s.Healthy(); err == nil {
		t.Fatal("the end of an earlier custody forgot the failure of a later one")
	}
	fence.CustodyEnded(db, c)
	if err := s.Healthy(); err != nil {
		t.Fatalf("after the custody ended: %v", err)
	}
	// A write of the ended custody finishing late: not counted (it fails
	// as superseded or as the database's error; either says nothing now).
	_ = fence.Fenced(ctx, db, c, broken)
	if err := s.Healthy(); err != nil {
		t.Fatalf("a late write of the ended custody counted: %v", err)
	}
	// The next custody's failures count again.
	if err := s.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	next := mustAcquire(t, s, "cleanup", "instance-a")
	if err := fence.Fenced(ctx, db, next, broken); err == nil {
		t.Fatal("want the database's error")
	}
	if err := s.Healthy(); err == nil || !strings.Contains(err.Error(), "cleanup worker") {
		t.Fatalf("a failure under the next custody: %v, want it counted", err)
	}
}

// An appview of the previous protocol claims the next fence with its
// nonce while the lease is free, then acquires under that claim. When
// this one acquires that fence first, its grant's nonce replaces the
// claim, so its release is its own and the next holder takes over at
// once (a rolling upgrade mixes both).
func TestAGrantOverAnOlderAppviewsLosingClaimIsReleasedCleanly(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := NewStore(db, longTTL)
	ctx := context.Background()
	if _, err := db.Exec(`INSERT INTO lease_holders (name, fence, nonce) VALUES ('cleanup', 1, 'older-appview')`); err != nil {
		t.Fatal(err)
	}
	held := mustAcquire(t, s, "cleanup", "instance-a")
	if held.Fence != 1 {
		t.Fatalf("granted fence %d over the claim of fence 1", held.Fence)
	}
	if err := s.Release(ctx, held); err != nil {
		t.Fatalf("release of a grant whose fence an older appview had claimed: %v", err)
	}
	if st := readRow(t, db, "cleanup").State(); st != fence.StateReleased {
		t.Fatalf("state after the release: %s", st)
	}
}

// The process's nonce of a grant is written after Acquire returns; an
// acquire by the same process beside it must still read the grant as its
// own (a grant of an attempt given up on is found this way and handed
// back), not as another process's under the same instance_id.
func TestAnAcquireBesideAGrantReadsItAsItsOwn(t *testing.T) {
	s := NewStore(testsupport.OpenDB(t), longTTL)
	ctx := context.Background()
	for i := range 30 {
		name := fmt.Sprintf("lease-%d", i)
		var gs [2]Grant
		var errs [2]error
		var wg sync.WaitGroup
		for j := range gs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				gs[j], errs[j] = s.Acquire(ctx, name, "instance-a")
			}()
		}
		wg.Wait()
		if err := errors.Join(errs[:]...); err != nil {
			t.Fatal(err)
		}
		if gs[0].Granted == gs[1].Granted {
			t.Fatalf("%s: %+v; want one grant", name, gs)
		}
		other := gs[0]
		if other.Granted {
			other = gs[1]
		}
		if !other.Own || other.Fence != 1 {
			t.Fatalf("%s: the acquire beside the grant read %+v, want fence 1 as this process's own", name, other)
		}
	}
}
