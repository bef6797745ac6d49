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
	"database/sql"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/leasestore"
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

// leaseStores holds one lease store per test database and TTL: a store is
// one process start (its nonce, see leasestore.Store.Nonce), and a grant is
// released only by the process start that took it.
var leaseStores sync.Map

type storeKey struct {
	db  *sql.DB
	ttl time.Duration
}

// LeaseStore returns the test's lease store for db and ttl, the same one
// on every call, so a test that acquires and later releases (a handover)
// does both as one process.
func LeaseStore(db *sql.DB, ttl time.Duration) *leasestore.Store {
	s, _ := leaseStores.LoadOrStore(storeKey{db, ttl}, leasestore.NewStore(db, ttl))
	return s.(*leasestore.Store)
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
