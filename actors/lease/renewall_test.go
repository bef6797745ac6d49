package lease_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

const ttl = time.Minute

func acquire(t testing.TB, s *lease.Store, name, holder string) fence.Custody {
	t.Helper()
	g, err := s.Acquire(context.Background(), name, holder)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Granted {
		t.Fatalf("%s not granted %q: %+v", holder, name, g)
	}
	return fence.Custody{Lease: name, Holder: holder, Fence: g.Fence}
}

type times struct{ renewed, expires int64 }

func rowTimes(t *testing.T, db *database.DB, name string) times {
	t.Helper()
	var r times
	if err := db.QueryRow(`SELECT renewed_at, expires_at FROM leases WHERE name = ?1`, name).Scan(&r.renewed, &r.expires); err != nil {
		t.Fatal(err)
	}
	return r
}

// backdate moves a grant's renewal a minute into the past, so that a
// renewal visibly moves it forward (the database clock has 1 ms resolution).
func backdate(t *testing.T, db *database.DB, name string) {
	t.Helper()
	if _, err := db.Exec(`UPDATE leases SET renewed_at = renewed_at - 60000, expires_at = expires_at - 60000 WHERE name = ?1`, name); err != nil {
		t.Fatal(err)
	}
}

func TestRenewAllGivesEachGrantItsOwnOutcome(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	dbA, dbB := testsupport.OpenDBAt(t, path), testsupport.OpenDBAt(t, path)
	a, b := lease.NewStore(dbA, ttl), lease.NewStore(dbB, ttl)
	ctx := context.Background()
	var cs []fence.Custody
	for i := range 40 {
		cs = append(cs, acquire(t, a, fmt.Sprintf("lease-%02d", i), "a"))
	}
	for _, c := range cs {
		backdate(t, dbA, c.Lease)
	}
	// lease-03 is taken over by b (its grant ran out first).
	if _, err := dbA.Exec(`UPDATE leases SET expires_at = renewed_at WHERE name = 'lease-03'`); err != nil {
		t.Fatal(err)
	}
	if _, err := dbA.Exec(`UPDATE leases SET renewed_at = renewed_at - 1 WHERE name = 'lease-03'`); err != nil {
		t.Fatal(err)
	}
	taken := acquire(t, b, "lease-03", "b")
	// lease-07 is released: never revived.
	if err := a.Release(ctx, cs[7]); err != nil {
		t.Fatal(err)
	}
	released := rowTimes(t, dbA, "lease-07")
	// lease-11 is asked with another holder, lease-12 with an old fence.
	cs[11].Holder = "not-a"
	cs[12].Fence--
	// lease-20 is listed twice.
	cs = append(cs, cs[20])
	before := rowTimes(t, dbA, "lease-00")

	errs := a.RenewAll(ctx, cs)
	if len(errs) != len(cs) {
		t.Fatalf("%d outcomes for %d grants", len(errs), len(cs))
	}
	superseded := map[string]bool{"lease-03": true, "lease-07": true, "lease-11": true, "lease-12": true}
	for i, c := range cs {
		if superseded[c.Lease] {
			if !errors.Is(errs[i], fence.ErrSuperseded) {
				t.Errorf("%s: %v, want ErrSuperseded", c.Lease, errs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Errorf("%s: %v, want renewed", c.Lease, errs[i])
		}
		if got := rowTimes(t, dbA, c.Lease); got.renewed <= before.renewed || got.expires-got.renewed != ttl.Milliseconds() {
			t.Errorf("%s not renewed on the database clock: %+v (before %+v)", c.Lease, got, before)
		}
	}
	if got := rowTimes(t, dbA, "lease-07"); got != released {
		t.Errorf("released lease-07 revived: %+v, was %+v", got, released)
	}
	rows, err := fence.List(ctx, dbA)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Name == "lease-03" && (r.Holder != "b" || r.Fence != taken.Fence) {
			t.Errorf("lease-03 = %+v; b's grant (fence %d) must stand", r, taken.Fence)
		}
	}
	if err := a.Healthy(); err != nil {
		t.Errorf("supersessions counted against the write health: %v", err)
	}
}

func TestRenewAllRunsCheckOnceAndFailsEveryGrantWithIt(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := lease.NewStore(db, ttl)
	cs := []fence.Custody{acquire(t, s, "x", "a"), acquire(t, s, "y", "a")}
	var checks atomic.Int32
	bad := errors.New("database file replaced")
	s.SetCheck(func() error { checks.Add(1); return bad })
	for i, err := range s.RenewAll(context.Background(), cs) {
		if !errors.Is(err, bad) {
			t.Errorf("%s: %v, want the check's error", cs[i].Lease, err)
		}
	}
	if n := checks.Load(); n != 1 {
		t.Errorf("Check ran %d times for one batch, want 1", n)
	}
}

// TestRenewAllLooksEveryGrantUpByItsKey keeps the batched renewal from
// scanning the leases table: with thousands of leases a scan per
// statement (or per listed grant) would cost more than the single-row
// updates it replaces.
func TestRenewAllLooksEveryGrantUpByItsKey(t *testing.T) {
	db := testsupport.OpenDB(t)
	list := `{"l0":1,"l1":1,"l2":1}`
	for _, c := range []struct {
		query string
		args  []any
	}{
		{lease.RenewAllSQL, []any{int64(1000), list, "h"}},
		{lease.RenewedSQL, []any{list, "h"}},
	} {
		rows, err := db.Query("EXPLAIN QUERY PLAN "+c.query, c.args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		text := strings.Join(plan, "\n")
		if !strings.Contains(text, "SEARCH leases USING INDEX sqlite_autoindex_leases_1 (name=?)") || strings.Contains(text, "SCAN leases") {
			t.Fatalf("query plan does not look grants up by name:\n%s", text)
		}
		t.Logf("plan:\n%s", text)
	}
}

// More grants than one statement carries (and, listed as three variables
// a grant, more than SQLite's 32,766 variables), one of them twice: every
// one renewed, each told so.
func TestRenewAllRenewsMoreGrantsThanOneStatementCarries(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := lease.NewStore(db, ttl)
	const n = 11000
	if _, err := db.Exec(`WITH RECURSIVE k(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM k WHERE i + 1 < ?1)
INSERT INTO leases (name, holder, fence, acquired_at, renewed_at, expires_at)
SELECT printf('bulk-%05d', i), 'h', 1, `+database.NowMS+` - 60000, `+database.NowMS+` - 60000, `+database.NowMS+` FROM k`, n); err != nil {
		t.Fatal(err)
	}
	cs := make([]fence.Custody, n)
	for i := range cs {
		cs[i] = fence.Custody{Lease: fmt.Sprintf("bulk-%05d", i), Holder: "h", Fence: 1}
	}
	cs = append(cs, cs[5])
	for i, err := range s.RenewAll(context.Background(), cs) {
		if err != nil {
			t.Fatalf("%s: %v", cs[i].Lease, err)
		}
	}
	var stale int
	if err := db.QueryRow(`SELECT count(*) FROM leases WHERE expires_at - renewed_at <> ?1`, ttl.Milliseconds()).Scan(&stale); err != nil {
		t.Fatal(err)
	}
	if stale != 0 {
		t.Fatalf("%d of %d grants not renewed", stale, n)
	}
}

// blockingCheck makes the first statement of a Renewer wait in Check
// until release is closed, and counts the statements.
type blockingCheck struct {
	calls   atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func newBlockingCheck() *blockingCheck {
	return &blockingCheck{entered: make(chan struct{}), release: make(chan struct{})}
}

func (b *blockingCheck) check() error {
	if b.calls.Add(1) == 1 {
		close(b.entered)
		<-b.release
	}
	return nil
}

func TestRenewerPutsRenewalsAskedDuringAStatementIntoTheNextOne(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := lease.NewStore(db, ttl)
	var cs []fence.Custody
	for i := range 30 {
		cs = append(cs, acquire(t, s, fmt.Sprintf("l%02d", i), "a"))
	}
	bc := newBlockingCheck()
	s.SetCheck(bc.check)
	r := lease.NewRenewer(s)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	ctx := context.Background()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); errs[0] = r.Renew(ctx, cs[0]) }()
	<-bc.entered // the first renewal's statement is in flight
	for i := 1; i < len(cs); i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = r.Renew(ctx, cs[i]) }()
	}
	testsupport.Eventually(t, "every other renewal queued", func() bool { return r.Queued() == len(cs)-1 })
	close(bc.release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s: %v", cs[i].Lease, err)
		}
	}
	if n := bc.calls.Load(); n != 2 {
		t.Errorf("%d statements for a lone renewal and %d asked during it; want 2", n, len(cs)-1)
	}
}

func TestRenewerReportsASupersededLeaseToItsCallerOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	dbA, dbB := testsupport.OpenDBAt(t, path), testsupport.OpenDBAt(t, path)
	a, b := lease.NewStore(dbA, ttl), lease.NewStore(dbB, ttl)
	var cs []fence.Custody
	for i := range 10 {
		cs = append(cs, acquire(t, a, fmt.Sprintf("l%d", i), "a"))
	}
	if _, err := dbB.Exec(`UPDATE leases SET expires_at = renewed_at - 1 WHERE name = 'l4'`); err != nil {
		t.Fatal(err)
	}
	acquire(t, b, "l4", "b")
	bc := newBlockingCheck()
	a.SetCheck(bc.check)
	r := lease.NewRenewer(a)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	// A first renewal holds the statement, so the ten share the next one.
	wg.Add(1)
	go func() { defer wg.Done(); _ = r.Renew(context.Background(), cs[0]) }()
	<-bc.entered
	for i := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = r.Renew(context.Background(), cs[i]) }()
	}
	testsupport.Eventually(t, "the ten renewals queued", func() bool { return r.Queued() == len(cs) })
	close(bc.release)
	wg.Wait()
	for i, err := range errs {
		if want := i == 4; errors.Is(err, fence.ErrSuperseded) != want || (!want && err != nil) {
			t.Errorf("%s: %v (superseded expected: %v)", cs[i].Lease, err, want)
		}
	}
}

func TestRenewerConcurrentWithAnotherInstancesAcquires(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	dbA, dbB := testsupport.OpenDBAt(t, path), testsupport.OpenDBAt(t, path)
	a, b := lease.NewStore(dbA, ttl), lease.NewStore(dbB, ttl)
	r := lease.NewRenewer(a)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	const leases = 20
	var cs []fence.Custody
	for i := range leases {
		cs = append(cs, acquire(t, a, fmt.Sprintf("l%02d", i), "a"))
	}
	ctx := context.Background()
	// a renews all its leases, each from its own goroutine as LeaseActors
	// do, while b takes every other lease as soon as it is free.
	var lost [leases]atomic.Bool
	var wg sync.WaitGroup
	var failures atomic.Int32
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 30 {
				err := r.Renew(ctx, c)
				switch {
				case errors.Is(err, fence.ErrSuperseded):
					lost[i].Store(true)
					return
				case err != nil:
					t.Errorf("%s: %v", c.Lease, err)
					failures.Add(1)
					return
				case lost[i].Load():
					t.Errorf("%s renewed after it was lost", c.Lease)
				}
			}
		}()
	}
	taken := map[string]int64{}
	for i := 0; i < leases; i += 2 {
		name := cs[i].Lease
		if _, err := dbB.Exec(`UPDATE leases SET expires_at = renewed_at - 1 WHERE name = ?1`, name); err != nil {
			t.Fatal(err)
		}
		g, err := b.Acquire(ctx, name, "b")
		if err != nil {
			t.Fatal(err)
		}
		if g.Granted {
			taken[name] = g.Fence
		}
	}
	wg.Wait()
	rows, err := fence.List(ctx, dbA)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range rows {
		f, ok := taken[row.Name]
		switch {
		case ok && (row.Holder != "b" || row.Fence != f):
			t.Errorf("%s = %+v: a renewal overwrote b's grant (fence %d)", row.Name, row, f)
		case !ok && row.Holder != "a":
			t.Errorf("%s = %+v, want a's", row.Name, row)
		}
	}
	if len(taken) == 0 {
		t.Fatal("b took no lease: the test proved nothing")
	}
}

func TestRenewerClose(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := lease.NewStore(db, ttl)
	c0, c1 := acquire(t, s, "first", "a"), acquire(t, s, "queued", "a")
	bc := newBlockingCheck()
	s.SetCheck(bc.check)
	r := lease.NewRenewer(s)
	first, queued := make(chan error, 1), make(chan error, 1)
	go func() { first <- r.Renew(context.Background(), c0) }()
	<-bc.entered
	go func() { queued <- r.Renew(context.Background(), c1) }()
	testsupport.Eventually(t, "a renewal queued", func() bool { return r.Queued() == 1 })

	// A caller that gives up returns at once, the statement still running.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Renew(gone, c1); !errors.Is(err, context.Canceled) {
		t.Errorf("renew with an ended context: %v", err)
	}

	short, cancelShort := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancelShort()
	if err := r.Close(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close with a statement in flight returned %v; want it to give up at its context", err)
	}
	if err := <-queued; !errors.Is(err, lease.ErrRenewerClosed) {
		t.Errorf("queued renewal at Close: %v", err)
	}
	if err := r.Renew(context.Background(), c0); !errors.Is(err, lease.ErrRenewerClosed) {
		t.Errorf("renewal after Close: %v", err)
	}
	close(bc.release)
	if err := <-first; err != nil {
		t.Errorf("the renewal in flight at Close: %v", err)
	}
	if err := r.Close(context.Background()); err != nil {
		t.Errorf("Close after the statement answered: %v", err)
	}
}

// Grants of two holders listed interleaved in one call (one statement
// per holder), and one name listed with its current and an old fence:
// every outcome lands where its grant was listed.
func TestRenewAllRenewsSeveralHoldersGrantsEachInItsPlace(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := lease.NewStore(db, ttl)
	var cs []fence.Custody
	for i := range 6 {
		holder := []string{"a", "b"}[i%2]
		cs = append(cs, acquire(t, s, fmt.Sprintf("mixed-%d", i), holder))
	}
	for _, c := range cs {
		backdate(t, db, c.Lease)
	}
	old := cs[4]
	old.Fence--
	cs = append(cs, old)
	errs := s.RenewAll(context.Background(), cs)
	for i, c := range cs {
		if i == len(cs)-1 {
			if !errors.Is(errs[i], fence.ErrSuperseded) {
				t.Errorf("%s under its old fence %d: %v, want ErrSuperseded", c.Lease, c.Fence, errs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Errorf("%s (%s): %v, want renewed", c.Lease, c.Holder, errs[i])
		}
		if got := rowTimes(t, db, c.Lease); got.expires-got.renewed != ttl.Milliseconds() || got.renewed < time.Now().Add(-time.Minute/2).UnixMilli() {
			t.Errorf("%s (%s) not renewed: %+v", c.Lease, c.Holder, got)
		}
	}
}

// Lease names and holders are operator text: quotes, backslashes,
// non-ASCII and date-like names renew like any other, and the outcome
// read back (one grant superseded) matches them exactly.
func TestRenewAllWithUnusualNames(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := lease.NewStore(db, ttl)
	names := []string{`we"ird\name`, "ünïcode-lease", "2026-01-01 00:00:00", "tab\there", "plain"}
	var cs []fence.Custody
	for _, n := range names {
		cs = append(cs, acquire(t, s, n, `holder "x"`))
	}
	if _, err := db.Exec(`UPDATE leases SET fence = fence + 1 WHERE name = 'plain'`); err != nil {
		t.Fatal(err)
	}
	for i, err := range s.RenewAll(context.Background(), cs) {
		if superseded := cs[i].Lease == "plain"; superseded != errors.Is(err, fence.ErrSuperseded) || (!superseded && err != nil) {
			t.Errorf("%q: %v", cs[i].Lease, err)
		}
	}
}

// One process's lease writes take turns: on a database whose connections
// give up at once on a locked database (busy_timeout 0), acquires,
// renewals and releases of sixteen leases run concurrently from one
// Store and none of them meets the lock (SQLITE_BUSY). Without the turns
// two of them on two connections collide, and with the usual busy
// timeout the loser sleeps a millisecond or more in SQLite's busy handler.
func TestOneProcesssLeaseWritesTakeTurnsAndNeverMeetTheLock(t *testing.T) {
	db, err := database.Open(context.Background(), database.Options{URL: "file:" + filepath.Join(t.TempDir(), "turns.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := lease.NewStore(db, ttl)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16*30)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("lease-%d", i)
			for range 10 {
				g, err := s.Acquire(ctx, name, "me")
				if err != nil || !g.Granted {
					errs <- fmt.Errorf("acquire %s: %+v %v", name, g, err)
					return
				}
				c := fence.Custody{Lease: name, Holder: "me", Fence: g.Fence}
				if err := s.Renew(ctx, c); err != nil {
					errs <- err
				}
				if err := s.RenewAll(ctx, []fence.Custody{c})[0]; err != nil {
					errs <- err
				}
				if err := s.Release(ctx, c); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A lease write waiting for its turn gives up when its context ends.
func TestALeaseWriteWaitingForItsTurnEndsWithItsContext(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := lease.NewStore(db, ttl)
	release := lease.HoldTurn(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if g, err := s.Acquire(ctx, "x", "me"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire while another write has the turn: %+v %v, want context.DeadlineExceeded", g, err)
	}
	release()
	if g, err := s.Acquire(context.Background(), "x", "me"); err != nil || !g.Granted {
		t.Fatalf("acquire once the turn is free: %+v %v", g, err)
	}
}
