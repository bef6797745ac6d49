package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/harness"
)

// The feed workers (backfill, billing, health, labeler) on real processes,
// against the fakes of internal/testsupport served from this test process.
// Their progress is in the database and in a few log lines; what the log
// does not say is polled, every feedsPoll, bounded by the step's context.
const feedsPoll = 25 * time.Millisecond

// Lease and worker names of the feed workers (docs/spec.md §4).
const (
	leaseBackfill = "backfill"
	leaseLabeler  = "labeler-subscriber"
)

// dbReader is the test process's own handle on a scenario's database.
type dbReader struct{ *database.DB }

// newDBReader opens the scenario's database from the test process and
// applies the migrations, before any instance runs, so a test can seed
// rows the workers read (crew, captains) and read back what they wrote.
func newDBReader(t *testing.T, url string) *dbReader {
	t.Helper()
	ctx := within(t, 30*time.Second)
	db, err := database.Open(ctx, database.Options{URL: url, BusyTimeout: 5 * time.Second, MaxOpenConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &dbReader{db}
}

// int runs a query returning one integer (a COUNT, a column).
func (r *dbReader) int(t *testing.T, ctx context.Context, query string, args ...any) int64 {
	t.Helper()
	var n int64
	err := database.Bounded(ctx, func() error { return r.QueryRow(query, args...).Scan(&n) })
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// exec runs a statement (seeding rows).
func (r *dbReader) exec(t *testing.T, ctx context.Context, query string, args ...any) {
	t.Helper()
	err := database.Bounded(ctx, func() error { _, err := r.Exec(query, args...); return err })
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// pollInt polls query until it returns want.
func (r *dbReader) pollInt(ctx context.Context, want int64, query string, args ...any) error {
	var got int64
	err := poll(ctx, feedsPoll, fmt.Sprintf("want %d from %s", want, query), func() (bool, error) {
		err := database.Bounded(ctx, func() error { return r.QueryRow(query, args...).Scan(&got) })
		return got == want, err
	})
	if err != nil {
		return fmt.Errorf("%w (last: %d)", err, got)
	}
	return nil
}

// poll calls cond every interval until it reports true or fails, or ctx
// ends; what names the condition in the error. An error the database may
// stop giving by itself (database.Unavailable: busy, no answer, a libSQL
// server's stream interrupted or expired, as sqld 0.24 does under load)
// is one more try, as it is for the appview; the last one is named if ctx
// ends first.
func poll(ctx context.Context, interval time.Duration, what string, cond func() (bool, error)) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		ok, err := cond()
		switch {
		case err != nil && !database.Unavailable(err):
			return fmt.Errorf("%s: %w", what, err)
		case err == nil && ok:
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil && ctx.Err() != err {
				return fmt.Errorf("%s: %w (the last read: %v)", what, ctx.Err(), err)
			}
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// adminJSON GETs path on an instance's admin endpoint and decodes the JSON.
func adminJSON(ctx context.Context, i *harness.Instance, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+i.AdminAddr()+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s on %s: HTTP %d", path, i.ID, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// feedSpec is an instance with only the workers a feeds scenario names
// besides the defaults (the consumer, redialling a Jetstream that does
// not answer, and the hourly cleanup), every outbound endpoint on this
// host.
func feedSpec(id, db string, set map[string]any) harness.Spec {
	return harness.Spec{ID: id, DatabaseURL: db, Set: set}
}

// other returns the instance of pair that is not i.
func other(pair []*harness.Instance, i *harness.Instance) *harness.Instance {
	if pair[0] == i {
		return pair[1]
	}
	return pair[0]
}

// holdsAfter waits for n lease.renewed events of lease on i after index
// from: the instance kept custody (and its worker) that long.
func holdsAfter(ctx context.Context, i *harness.Instance, lease string, from, n int) error {
	for range n {
		e, err := i.Log.WaitFrom(ctx, from, harness.Is(harness.LeaseRenewed, lease))
		if err != nil {
			return fmt.Errorf("%s did not keep renewing %s: %w", i.ID, lease, err)
		}
		from = e.Seq + 1
	}
	return nil
}
