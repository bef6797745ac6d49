package lease

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

func writeProbe(tx *sql.Tx, fence int64) error {
	_, err := tx.Exec(`INSERT INTO probe_writes (fence) VALUES (?1)`, fence)
	return err
}

func probeWrites(t testing.TB, db *database.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM probe_writes`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestFencedWriteUnderTheCurrentCustodyCommits(t *testing.T) {
	db := testsupport.OpenDB(t)
	createProbeTable(t, db)
	c := mustAcquire(t, NewStore(db, longTTL), "jetstream-consumer", "instance-a")
	before := rowBytes(t, db, "jetstream-consumer")
	for range 3 {
		if err := fence.Fenced(context.Background(), db, c, func(tx *sql.Tx) error { return writeProbe(tx, c.Fence) }); err != nil {
			t.Fatal(err)
		}
	}
	if n := probeWrites(t, db); n != 3 {
		t.Fatalf("%d writes landed, want 3", n)
	}
	if after := rowBytes(t, db, "jetstream-consumer"); after != before {
		t.Fatalf("a fenced write changed the lease row:\nbefore %s\nafter  %s", before, after)
	}
}

func TestFencedWriteUnderAnyCustodyNoLongerCurrentLandsNothing(t *testing.T) {
	cases := []struct {
		name string
		// lose turns the custody c (just granted on s) into one that is no
		// longer current, and returns the custody to write under.
		lose func(t *testing.T, db *database.DB, s *Store, c fence.Custody) fence.Custody
	}{
		{"stale fence after a takeover", func(t *testing.T, db *database.DB, s *Store, c fence.Custody) fence.Custody {
			expireNow(t, db, c.Lease)
			mustAcquire(t, s, c.Lease, "instance-b")
			return c
		}},
		{"expired on the database clock", func(t *testing.T, db *database.DB, s *Store, c fence.Custody) fence.Custody {
			expireNow(t, db, c.Lease)
			return c
		}},
		{"released", func(t *testing.T, db *database.DB, s *Store, c fence.Custody) fence.Custody {
			if err := s.Release(context.Background(), c); err != nil {
				t.Fatal(err)
			}
			return c
		}},
		{"another holder with the same fence", func(t *testing.T, db *database.DB, s *Store, c fence.Custody) fence.Custody {
			c.Holder = "instance-b"
			return c
		}},
		{"a fence never granted", func(t *testing.T, db *database.DB, s *Store, c fence.Custody) fence.Custody {
			c.Fence++
			return c
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			db := testsupport.OpenDB(t)
			createProbeTable(t, db)
			s := NewStore(db, longTTL)
			c := tc.lose(t, db, s, mustAcquire(t, s, "cleanup", "instance-a"))
			before := rowBytes(t, db, "cleanup")
			calls := 0
			err := fence.Fenced(context.Background(), db, c, func(tx *sql.Tx) error {
				calls++
				return writeProbe(tx, c.Fence)
			})
			if !errors.Is(err, fence.ErrSuperseded) {
				t.Fatalf("got %v, want an error wrapping fence.ErrSuperseded", err)
			}
			if calls != 0 || probeWrites(t, db) != 0 {
				t.Fatalf("callback ran %d times, %d writes landed", calls, probeWrites(t, db))
			}
			if after := rowBytes(t, db, "cleanup"); after != before {
				t.Fatalf("a refused fenced write changed the lease row:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

func TestUnfencedCustodyWritesUnconditionally(t *testing.T) {
	db := testsupport.OpenDB(t)
	createProbeTable(t, db)
	// No lease row at all: fence 0 means leases are off for this worker.
	c := fence.Custody{Lease: "health", Holder: "instance-a"}
	if err := fence.Fenced(context.Background(), db, c, func(tx *sql.Tx) error { return writeProbe(tx, 0) }); err != nil {
		t.Fatal(err)
	}
	if n := probeWrites(t, db); n != 1 {
		t.Fatalf("%d writes landed, want 1", n)
	}
	if got := rowBytes(t, db, "health"); got != "<no row>" {
		t.Fatalf("an unfenced write touched the lease table: %s", got)
	}
}

func TestFencedWriteRollsBackWhenTheContextEnds(t *testing.T) {
	db := testsupport.OpenDB(t)
	createProbeTable(t, db)
	c := mustAcquire(t, NewStore(db, longTTL), "cleanup", "instance-a")
	for _, custody := range []fence.Custody{c, {Lease: "cleanup", Holder: "instance-a"}} {
		ctx, cancel := context.WithCancel(context.Background())
		err := fence.Fenced(ctx, db, custody, func(tx *sql.Tx) error {
			if err := writeProbe(tx, custody.Fence); err != nil {
				return err
			}
			cancel() // the worker is told to stop mid-write
			return nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("fence %d: got %v, want context.Canceled", custody.Fence, err)
		}
		if n := probeWrites(t, db); n != 0 {
			t.Fatalf("fence %d: %d writes landed after the context ended", custody.Fence, n)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls := 0
	if err := fence.Fenced(ctx, db, c, func(*sql.Tx) error { calls++; return nil }); !errors.Is(err, context.Canceled) || calls != 0 {
		t.Fatalf("an ended context: got %v after %d calls", err, calls)
	}
}

func TestFencedWriteCallbackErrorRollsBackEverything(t *testing.T) {
	db := testsupport.OpenDB(t)
	createProbeTable(t, db)
	c := mustAcquire(t, NewStore(db, longTTL), "cleanup", "instance-a")
	boom := errors.New("boom")
	err := fence.Fenced(context.Background(), db, c, func(tx *sql.Tx) error {
		if err := writeProbe(tx, c.Fence); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want the callback's error", err)
	}
	if n := probeWrites(t, db); n != 0 {
		t.Fatalf("%d writes landed from a failed callback", n)
	}
}

// The guard statement takes the write lock: a takeover attempted from
// another process while a fenced transaction is open waits for its commit,
// so it can never slip in between the fence check and the commit.
func TestTakeoverCannotCommitInsideAFencedTransaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	db, other := testsupport.OpenDBAt(t, path), testsupport.OpenDBAt(t, path)
	createProbeTable(t, db)
	c := mustAcquire(t, NewStore(db, longTTL), "cleanup", "instance-a")
	inside, proceed := make(chan struct{}), make(chan struct{})
	fenced := make(chan error, 1)
	go func() {
		fenced <- fence.Fenced(context.Background(), db, c, func(tx *sql.Tx) error {
			close(inside)
			<-proceed
			return writeProbe(tx, c.Fence)
		})
	}()
	<-inside
	stolen := make(chan error, 1)
	go func() {
		_, err := other.Exec(`UPDATE leases SET holder = 'instance-b', fence = fence + 1, expires_at = ` +
			database.NowMS + ` + 60000 WHERE name = 'cleanup'`)
		stolen <- err
	}()
	// A negative check: if the guard did not hold the lock, the steal would
	// finish within a few ms. 300 ms of silence is the evidence.
	select {
	case err := <-stolen:
		t.Fatalf("a takeover committed inside the fenced transaction (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(proceed)
	if err := <-fenced; err != nil {
		t.Fatalf("fenced write: %v", err)
	}
	if err := <-stolen; err != nil {
		t.Fatalf("takeover after the commit: %v", err)
	}
	if n := probeWrites(t, db); n != 1 {
		t.Fatalf("%d writes landed, want 1", n)
	}
	// And after the takeover, the old custody writes nothing.
	if err := fence.Fenced(context.Background(), db, c, func(tx *sql.Tx) error { return writeProbe(tx, c.Fence) }); !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("after the takeover: got %v, want fence.ErrSuperseded", err)
	}
}
