// Package testsupport is the one package of test fixtures (the
// multi-process harness, internal/harness, is the other test support):
//
//   - a test database (a migrated file database, busy_timeout set, closed
//     when the test ends: lease tests need real files, never :memory:) and
//     a sqld server for tests over the network (sqld_doc.go);
//   - Eventually, which polls for a condition instead of sleeping a fixed
//     time, and an actor system that shuts down with the test;
//   - goleak with the project's standing exceptions (leakcheck.go);
//   - fake AT Protocol peers: relay, PDS, PLC, holds, labeler
//     (fakepeer_doc.go);
//   - the AT Protocol syntax test vectors (syntaxvectors.go) and a lossless
//     dump of query results (dbdump.go).
//
// Only tests and cmd/appview-dev import it; cmd/appview's deps test keeps
// it out of the shipped binary.
package testsupport

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// BusyTimeout is the busy_timeout of every test connection: long enough
// that two writers in one test (a holder and a contender) wait for each
// other instead of failing with SQLITE_BUSY.
const BusyTimeout = 5 * time.Second

// OpenDB opens a new migrated database file in t.TempDir().
func OpenDB(t testing.TB) *database.DB {
	t.Helper()
	return OpenDBAt(t, filepath.Join(t.TempDir(), "appview.db"))
}

// OpenDBAt opens (creating it if needed) and migrates the database file at
// path; it is closed when the test ends.
func OpenDBAt(t testing.TB, path string) *database.DB {
	t.Helper()
	db := OpenUnmigrated(t, path)
	if _, err := db.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate %s: %v", path, err)
	}
	return db
}

// OpenUnmigrated opens (creating it if needed) the database file at path
// without migrating it, for tests of the migrations and of what runs
// before them; it is closed when the test ends.
func OpenUnmigrated(t testing.TB, path string) *database.DB {
	t.Helper()
	db, err := database.Open(context.Background(), database.Options{URL: "file:" + path, BusyTimeout: BusyTimeout})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// WaitBudget is how long Eventually waits: generous, because a loaded CI
// machine under -race is slow; a test that passes waits only as long as
// its condition takes.
const WaitBudget = 60 * time.Second

// PollInterval is how often Eventually checks its condition.
const PollInterval = 5 * time.Millisecond

// Eventually polls cond every PollInterval until it is true, and fails the
// test naming what it waited for after WaitBudget.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitBudget)
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", WaitBudget, what)
		}
		<-tick.C
	}
}

// NewActorSystem returns an actor system whose own logs are discarded,
// shut down when the test ends (Shutdown does not stop actors: a test
// stops what it spawned).
func NewActorSystem(t testing.TB) *actor.ActorSystem {
	t.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	t.Cleanup(sys.Shutdown)
	return sys
}

// Custody grants lease name to holder for ttl in db and returns the
// custody, as a LeaseActor's acquire would have: the row of docs/spec.md
// §4 with the next fence (one above the row's), granted now on the
// database's clock. It fails the test when another grant of the name is
// live. Fenced writes under the custody commit until it expires or is
// released (Release) or another Custody takes the lease.
func Custody(t testing.TB, db *database.DB, name, holder string, ttl time.Duration) fence.Custody {
	t.Helper()
	var f int64
	granted, err := database.QueryReturning(context.Background(), db, `INSERT INTO leases (name, holder, fence, acquired_at, renewed_at, expires_at)
SELECT ?1, ?2, COALESCE((SELECT fence FROM lease_fence_floor WHERE name = ?1), 0) + 1, n, n, n + ?3
FROM (SELECT `+database.NowMS+` AS n) WHERE true
ON CONFLICT(name) DO UPDATE SET holder = excluded.holder, fence = leases.fence + 1,
  acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at
WHERE leases.expires_at <= excluded.acquired_at
RETURNING fence`, []any{name, holder, ttl.Milliseconds()}, &f)
	switch {
	case err != nil:
		t.Fatalf("grant lease %q to %q: %v", name, holder, err)
	case !granted:
		t.Fatalf("grant lease %q to %q: another grant of it is live", name, holder)
	}
	return fence.Custody{Lease: name, Holder: holder, Fence: f}
}

// Release expires c's grant in place, as a holder's release does, so the
// next Custody of the name takes it at once.
func Release(t testing.TB, db *database.DB, c fence.Custody) {
	t.Helper()
	res, err := db.Exec(`UPDATE leases SET renewed_at = `+database.NowMS+`, expires_at = `+database.NowMS+`
WHERE name = ?1 AND holder = ?2 AND fence = ?3`, c.Lease, c.Holder, c.Fence)
	if err != nil {
		t.Fatalf("release %s: %v", c, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("release %s: the lease no longer carries that grant", c)
	}
}

// LockedBuffer is an io.Writer that other goroutines may write (a logger,
// a child process's stderr) while the test reads it with String. The zero
// value is ready to use.
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p; it never fails.
func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
