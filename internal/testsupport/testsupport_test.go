package testsupport_test

import (
	"sync/atomic"
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

func TestOpenDBIsAMigratedFileWithBusyTimeoutSet(t *testing.T) {
	db := testsupport.OpenDB(t)
	if db.Remote || db.Path == "" {
		t.Fatalf("not a file database: remote %v, path %q", db.Remote, db.Path)
	}
	var ms int64
	if err := db.QueryRow(`PRAGMA busy_timeout`).Scan(&ms); err != nil || ms != testsupport.BusyTimeout.Milliseconds() {
		t.Fatalf("busy_timeout = %d (%v), want %d", ms, err, testsupport.BusyTimeout.Milliseconds())
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'leases'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("leases table: %d (%v): not migrated", n, err)
	}
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	testsupport.Eventually(t, "the third call", func() bool { return calls.Add(1) >= 3 })
	if got := calls.Load(); got != 3 {
		t.Fatalf("cond called %d times, want 3 (no call after it held)", got)
	}
}
