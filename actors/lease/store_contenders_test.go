package lease_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"

	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

type nudgeTarget struct {
	srv    *httptest.Server
	nudges atomic.Int32
	// last is the last nudge's "lease" parameter and Authorization.
	last   atomic.Value
	conns  atomic.Int32
	closed atomic.Int32
}

func newNudgeTarget(t *testing.T) *nudgeTarget {
	t.Helper()
	n := &nudgeTarget{}
	n.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.last.Store([2]string{r.URL.Query().Get("lease"), r.Header.Get("Authorization")})
		n.nudges.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	n.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			n.conns.Add(1)
		case http.StateClosed:
			n.closed.Add(1)
		}
	}
	n.srv.Start()
	t.Cleanup(n.srv.Close)
	return n
}

func (n *nudgeTarget) url() string { return n.srv.URL + "/lease/nudge" }

// register records instance as a contender of lease with nudge URL u.
func register(t *testing.T, db *database.DB, name, instance, nonce, u string) {
	t.Helper()
	c := &lease.Contenders{DB: db, Instance: instance, Nonce: nonce, URL: u, TTL: time.Minute}
	c.Register(name, true)
	c.Wait()
	testsupport.Eventually(t, instance+" recorded", func() bool {
		var n int
		_ = db.QueryRow(`SELECT count(*) FROM lease_contenders WHERE name = ?1 AND instance = ?2`, name, instance).Scan(&n)
		return n == 1
	})
}

// holder is a process that holds leases: its store's releases nudge
// through its Contenders, as system.New wires them.
type holder struct {
	store *lease.Store
	c     *lease.Contenders
}

func newHolder(db *database.DB) *holder {
	s := lease.NewStore(db, time.Minute)
	c := &lease.Contenders{DB: db, Instance: "holder", Nonce: s.Nonce(), URL: "http://127.0.0.1:1/lease/nudge", TTL: time.Minute}
	s.Released = c.Nudge
	return &holder{store: s, c: c}
}

// release acquires lease name and releases it, then waits for the nudges.
func (h *holder) release(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	g, err := h.store.Acquire(ctx, name, "holder")
	if err != nil || !g.Granted {
		t.Fatalf("acquire %s: %+v, %v", name, g, err)
	}
	if err := h.store.Release(ctx, fence.Custody{Lease: name, Holder: "holder", Fence: g.Fence}); err != nil {
		t.Fatal(err)
	}
	h.c.Wait()
}

// A release nudges every recent contender of its lease, once, naming the
// lease and carrying Header (the admin token); the release statement
// reads them, so a contender recorded just before it is nudged too.
func TestNudgesNameTheLeaseAndCarryTheHeader(t *testing.T) {
	db := testsupport.OpenDB(t)
	early, late := newNudgeTarget(t), newNudgeTarget(t)
	register(t, db, "billing", "early", "n-early", early.url())
	register(t, db, "billing", "late", "n-late", late.url())
	h := newHolder(db)
	h.c.Header = http.Header{"Authorization": {"Bearer s3cret"}}
	h.release(t, "billing")
	for name, target := range map[string]*nudgeTarget{"early": early, "late": late} {
		if n := target.nudges.Load(); n != 1 {
			t.Fatalf("%s: %d nudges, want 1", name, n)
		}
		if got := target.last.Load().([2]string); got != [2]string{"billing", "Bearer s3cret"} {
			t.Errorf("%s: nudge for lease %q with Authorization %q, want billing and the bearer token", name, got[0], got[1])
		}
	}
}

// A contender not seen for three TTLs is not nudged.
func TestAStaleContenderIsNotNudged(t *testing.T) {
	db := testsupport.OpenDB(t)
	stale := newNudgeTarget(t)
	register(t, db, "cleanup", "stale", "n-stale", stale.url())
	if _, err := db.Exec(`UPDATE lease_contenders SET seen_at = seen_at - 3 * 60000 - 1000`); err != nil {
		t.Fatal(err)
	}
	newHolder(db).release(t, "cleanup")
	if n := stale.nudges.Load(); n != 0 {
		t.Fatalf("a contender last seen over 3 TTLs ago got %d nudges, want none", n)
	}
}

// A contender that refuses the admin token is named at warn level
// (handovers to it silently waited for its poll), once: a shutdown
// releasing two leases says it one time.
func TestARefusedNudgeIsLoggedAtWarnOnce(t *testing.T) {
	db := testsupport.OpenDB(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "wrong admin token", http.StatusUnauthorized)
	}))
	for _, name := range []string{"cleanup", "backfill"} {
		register(t, db, name, "c", "n-c", srv.URL+"/lease/nudge")
	}
	var log testsupport.LockedBuffer
	h := newHolder(db)
	h.c.Log = zerolog.New(&log).Level(zerolog.DebugLevel)
	for _, name := range []string{"cleanup", "backfill"} {
		h.release(t, name)
	}
	srv.Close()
	out := log.String()
	if !strings.Contains(out, "admin.token differs") || !strings.Contains(out, `"status":401`) || !strings.Contains(out, "wrong admin token") {
		t.Errorf("log %q, want a warning naming admin.token, the status and the answer", out)
	}
	if n := strings.Count(out, `"level":"warn"`); n != 1 {
		t.Errorf("%d warnings for one contender refusing two nudges, want 1 (the second at debug):\n%s", n, out)
	}
	if n := strings.Count(out, "admin.token differs"); n != 2 {
		t.Errorf("%d refusals logged in all, want 2", n)
	}
}

// A stopping instance deletes its own contender records (this process
// start's), so holders stop nudging it; another process start's records
// under the same instance_id, and other instances', stay.
func TestForgetDeletesOnlyThisProcessStartsRecords(t *testing.T) {
	db := testsupport.OpenDB(t)
	register(t, db, "cleanup", "a", "n1", "http://127.0.0.1:1/lease/nudge")
	register(t, db, "backfill", "a", "n1", "http://127.0.0.1:1/lease/nudge")
	register(t, db, "labeler", "a", "n2", "http://127.0.0.1:1/lease/nudge")
	register(t, db, "cleanup", "b", "n1", "http://127.0.0.1:2/lease/nudge")
	c := &lease.Contenders{DB: db, Instance: "a", Nonce: "n1", URL: "http://127.0.0.1:1/lease/nudge", TTL: time.Minute}
	if err := c.Forget(context.Background()); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`SELECT name || '/' || instance FROM lease_contenders ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		left = append(left, s)
	}
	if want := []string{"cleanup/b", "labeler/a"}; len(left) != 2 || left[0] != want[0] || left[1] != want[1] {
		t.Fatalf("left %q, want %q", left, want)
	}
}

// A process that has forgotten its records writes none again: a contended
// answer that reaches a stopping LeaseActor after Forget would otherwise
// leave a record holders nudge until it ages out. A record being written
// when Forget begins lands before its delete.
func TestAfterForgetRegisterWritesNothing(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := &lease.Contenders{DB: db, Instance: "a", Nonce: "n1", URL: "http://127.0.0.1:1/lease/nudge", TTL: time.Minute}
	c.Register("cleanup", true) // in flight while Forget begins
	if err := c.Forget(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.Register("backfill", true)
	c.Register("cleanup", false)
	c.Wait()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM lease_contenders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d contender records after Forget, want none", n)
	}
}

// A release nudges its own lease's contenders only.
func TestAReleaseNudgesOnlyItsLeasesContenders(t *testing.T) {
	db := testsupport.OpenDB(t)
	a, b := newNudgeTarget(t), newNudgeTarget(t)
	register(t, db, "cleanup", "a", "n-a", a.url())
	register(t, db, "backfill", "b", "n-b", b.url())
	newHolder(db).release(t, "cleanup")
	if n, m := a.nudges.Load(), b.nudges.Load(); n != 1 || m != 0 {
		t.Fatalf("cleanup's contender got %d nudges (want 1), backfill's %d (want 0)", n, m)
	}
}

// Two processes an operator gave one instance_id (a new user's run): the
// holder's release never nudged its twin, whose contender record carries
// the same instance_id, so every handover between them waited for the
// twin's poll (1.7-2.0 s). Records are told apart by the process nonce
// now: the twin is nudged, the holder's own record is not.
func TestAContenderUnderTheHoldersInstanceIDFromAnotherProcessIsNudged(t *testing.T) {
	db := testsupport.OpenDB(t)
	twin, self := newNudgeTarget(t), newNudgeTarget(t)
	h := newHolder(db)
	register(t, db, "cleanup", "holder", "n-twin", twin.url())
	register(t, db, "backfill", "holder", h.store.Nonce(), self.url())
	h.release(t, "cleanup")
	h.release(t, "backfill")
	if n, m := twin.nudges.Load(), self.nudges.Load(); n != 1 || m != 0 {
		t.Fatalf("the twin got %d nudges (want 1), the holder's own record %d (want 0)", n, m)
	}
	if ok, err := h.c.HealthyContender(context.Background(), "cleanup"); err != nil || !ok {
		t.Fatalf("HealthyContender(cleanup) = %v, %v; want the twin to count", ok, err)
	}
	if ok, err := h.c.HealthyContender(context.Background(), "backfill"); err != nil || ok {
		t.Fatalf("HealthyContender(backfill) = %v, %v; want the holder's own record not to count", ok, err)
	}
}

// A nudge is never sent on by a redirect: the contender's URL answering
// 307 to another host (a lease_contenders row pointing elsewhere) does
// not reach that host.
func TestANudgeDoesNotFollowARedirect(t *testing.T) {
	db := testsupport.OpenDB(t)
	elsewhere := newNudgeTarget(t)
	redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.url()+"?"+r.URL.RawQuery, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirecting.Close)
	register(t, db, "cleanup", "c", "n-c", redirecting.URL+"/lease/nudge")
	newHolder(db).release(t, "cleanup")
	if n := elsewhere.nudges.Load(); n != 0 {
		t.Fatalf("the redirect's target got %d nudges, want none", n)
	}
}

// Failed hears every lease write that failed, with its error: the
// system says once, at error level, that the database lost its schema
// when a libSQL server's data was wiped under the running instances
// (they had only warned, rate-limited, for ever).
func TestFailedHearsAFailedLeaseWrite(t *testing.T) {
	db := testsupport.OpenDB(t)
	s := lease.NewStore(db, time.Minute)
	var got []error
	s.Failed = func(err error) { got = append(got, err) }
	if _, err := s.Acquire(context.Background(), "cleanup", "a"); err != nil || len(got) != 0 {
		t.Fatalf("acquire: %v; Failed told %v, want nothing", err, got)
	}
	if _, err := db.Exec(`DROP TABLE leases`); err != nil {
		t.Fatal(err)
	}
	_, err := s.Acquire(context.Background(), "cleanup", "a")
	if err == nil || len(got) != 1 || !database.SchemaLost(got[0]) {
		t.Fatalf("acquire on a lost schema: %v; Failed told %v, want that error, SchemaLost", err, got)
	}
}
