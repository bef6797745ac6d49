package lease

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

// recordingConnector wraps the libSQL connector and records every argument
// bound into a statement, so a test can prove that no Go-side clock reading
// reaches the database.
type recordingConnector struct {
	inner driver.Connector
	mu    sync.Mutex
	args  []recordedArg
}

type recordedArg struct {
	query string
	value driver.Value
}

func (c *recordingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: conn, rec: c}, nil
}

func (c *recordingConnector) Driver() driver.Driver { return c.inner.Driver() }

func (c *recordingConnector) record(query string, args []driver.NamedValue) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range args {
		c.args = append(c.args, recordedArg{query: query, value: a.Value})
	}
}

func (c *recordingConnector) recorded() []recordedArg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]recordedArg(nil), c.args...)
}

type recordingConn struct {
	driver.Conn
	rec *recordingConnector
}

func (c *recordingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.rec.record(q, args)
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *recordingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.rec.record(q, args)
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *recordingConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return nil, fmt.Errorf("recording connection: prepared statements are not recorded: %s", q)
}

func (c *recordingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

// openRecording opens the database file at path through a recording
// connector (one connection, so no busy handling is needed).
func openRecording(t *testing.T, path string) (*database.DB, *recordingConnector) {
	t.Helper()
	probe, err := sql.Open("libsql", "file::memory:")
	if err != nil {
		t.Fatal(err)
	}
	drv := probe.Driver()
	probe.Close()
	inner, err := drv.(driver.DriverContext).OpenConnector("file:" + path)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingConnector{inner: inner}
	db := sql.OpenDB(rec)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() {
		db.Close()
		if c, ok := inner.(interface{ Close() error }); ok {
			c.Close()
		}
	})
	return database.Wrap(db), rec
}

// looksLikeNow reports whether v could be a reading of the local clock in
// any unit a lease statement might use (s, ms, µs, ns, or a time.Time).
func looksLikeNow(v driver.Value) bool {
	now := time.Now()
	near := func(x, ref int64, unit time.Duration) bool {
		d := x - ref
		if d < 0 {
			d = -d
		}
		return time.Duration(d)*unit < 24*time.Hour
	}
	switch x := v.(type) {
	case time.Time:
		return true
	case int64:
		return near(x, now.Unix(), time.Second) || near(x, now.UnixMilli(), time.Millisecond) ||
			near(x, now.UnixMicro(), time.Microsecond) || near(x, now.UnixNano(), time.Nanosecond)
	case string:
		return len(x) >= 10 && x[:4] == now.Format("2006")
	}
	return false
}

// An instance whose local clock runs 10 s ahead would, if it judged expiry
// itself, think a grant with 5-10 s left had already run out. The store
// never binds a local clock reading into a statement: every "now" is the
// database's (database.NowMS). So skew cannot make it take over.
func TestAStoreNeverJudgesExpiryByItsLocalClock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	admin := testsupport.OpenDBAt(t, path)
	recDB, rec := openRecording(t, path)
	s := NewStore(recDB, 15*time.Second)
	ctx := context.Background()

	// Held by another instance for 10 s more on the database's clock.
	if _, err := admin.Exec(`INSERT INTO leases (name, holder, fence, acquired_at, renewed_at, expires_at)
SELECT 'jetstream-consumer', 'instance-a', 7, n - 5000, n - 5000, n + 10000 FROM (SELECT ` + database.NowMS + ` AS n)`); err != nil {
		t.Fatal(err)
	}
	before := rowBytes(t, admin, "jetstream-consumer")
	g, err := s.Acquire(ctx, "jetstream-consumer", "instance-ahead")
	if err != nil {
		t.Fatal(err)
	}
	if g.Granted {
		t.Fatal("took over a lease with 10 s left on the database's clock")
	}
	if g.Holder != "instance-a" || g.Fence != 7 || g.TimeLeft <= 9*time.Second || g.TimeLeft > 10*time.Second {
		t.Fatalf("contended grant %+v, want holder instance-a fence 7 with (9s,10s] left on the database's clock", g)
	}
	if after := rowBytes(t, admin, "jetstream-consumer"); after != before {
		t.Fatalf("a refused acquire changed the row:\nbefore %s\nafter  %s", before, after)
	}

	// Exercise every statement that compares or writes time.
	c := mustAcquire(t, s, "cleanup", "instance-ahead")
	if err := s.Renew(ctx, c); err != nil {
		t.Fatal(err)
	}
	createProbeTable(t, admin)
	if err := fence.Fenced(ctx, recDB, c, func(tx *sql.Tx) error { return writeProbe(tx, c.Fence) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := fence.List(ctx, recDB); err != nil {
		t.Fatal(err)
	}

	args := rec.recorded()
	if len(args) == 0 {
		t.Fatal("the recording connector saw no arguments: the test is not observing the store")
	}
	sawTTL := false
	for _, a := range args {
		sawTTL = sawTTL || a.value == int64(15000)
		if looksLikeNow(a.value) {
			t.Errorf("a local clock reading %v (%T) was bound into:\n%s", a.value, a.value, a.query)
		}
	}
	if !sawTTL {
		t.Fatalf("the TTL (15000 ms) was never bound: the recorder missed the store's statements: %v", args)
	}
	// The row's times are the database's, written by NowMS.
	r := readRow(t, admin, "cleanup")
	if r.AcquiredAt > r.Now || r.Now-r.AcquiredAt > time.Minute.Milliseconds() {
		t.Fatalf("acquired_at %d is not a recent database time (now %d)", r.AcquiredAt, r.Now)
	}
}

// The recorder would catch a Go time if one were bound: check the check.
func TestLocalClockDetectorRecognisesEveryUnit(t *testing.T) {
	now := time.Now().Add(10 * time.Second)
	for _, v := range []driver.Value{now, now.Unix(), now.UnixMilli(), now.UnixMicro(), now.UnixNano(), now.Format(time.RFC3339)} {
		if !looksLikeNow(v) {
			t.Errorf("%v (%T) not recognised as a clock reading", v, v)
		}
	}
	for _, v := range []driver.Value{int64(15000), int64(7), "instance-a", "cleanup", errors.New("x").Error()} {
		if looksLikeNow(v) {
			t.Errorf("%v (%T) taken for a clock reading", v, v)
		}
	}
}
