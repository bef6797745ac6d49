package backfill

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// TestProgressFollowsARunFromInterruptedToCompleted reads the progress of
// a run stopped mid-way and then completed by another holder, as every
// instance and `appview backfill status` see it.
func TestProgressFollowsARunFromInterruptedToCompleted(t *testing.T) {
	e := newEnv(t)
	p, err := ReadProgress(context.Background(), e.db)
	if err != nil || p.Run || p.ETASeconds != -1 {
		t.Fatalf("progress with no run = %+v, %v; want Run false, ETA -1", p, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewProgressCollector(e.db))
	running := func(when string, want int) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(`
# HELP appview_backfill_progress_running 1 while the latest backfill run is unfinished and an instance holds the backfill lease (or, run with leases disabled, while it is unfinished), else 0.
# TYPE appview_backfill_progress_running gauge
appview_backfill_progress_running %d
`, want)), "appview_backfill_progress_running"); err != nil {
			t.Errorf("%s: %v", when, err)
		}
	}
	running("no run", 0)

	_, pds, o, first := e.interruptedRun()

	p, err = ReadProgress(context.Background(), e.db)
	if err != nil {
		t.Fatal(err)
	}
	// a and b done, c reached (its first page applied): 12 records.
	if !p.Run || p.CompletedAt != nil || p.ReposDone != 2 || p.ReposKnown != 3 || p.Records != 12 || p.ListingDone ||
		p.Holder != "instance-a" || p.Fence != first.Fence {
		t.Fatalf("interrupted progress = %+v; want 2 done of 3 known, 12 records, listing not done, held by instance-a", p)
	}
	if p.Fraction <= 0.6 || p.Fraction >= 0.7 || p.ETASeconds < 0 {
		t.Errorf("fraction %v, ETA %v; want 2/3 and a known ETA", p.Fraction, p.ETASeconds)
	}
	// instance-a's grant has not run out: as far as the database knows,
	// it still works on the run.
	if p.State != StateRunning || p.Lease == nil || p.Lease.Holder != "instance-a" || p.Lease.State != fence.StateHeld {
		t.Errorf("state %q, lease %+v; want running, held by instance-a", p.State, p.Lease)
	}
	running("mid-run", 1)

	// instance-a is gone and its grant ran out: the run's row still says
	// instance-a, but nothing runs it.
	if _, err := e.db.Exec(`UPDATE leases SET renewed_at = renewed_at - 120000, expires_at = renewed_at - 60000 WHERE name = ?1`, LeaseName); err != nil {
		t.Fatal(err)
	}
	if p, err = ReadProgress(context.Background(), e.db); err != nil || p.State != StateStopped || p.ETASeconds != -1 || p.Holder != "instance-a" {
		t.Fatalf("after the grant ran out: %+v, %v; want stopped, ETA unknown, last holder instance-a", p, err)
	}
	running("stopped", 0)

	pds.Intercept(nil)
	second := e.acquire("instance-b")
	if err := e.backfiller(o).Run(context.Background(), second); err != nil {
		t.Fatal(err)
	}
	p, err = ReadProgress(context.Background(), e.db)
	if err != nil {
		t.Fatal(err)
	}
	if p.CompletedAt == nil || p.ReposDone != 8 || p.ReposKnown != 8 || p.Records != 40 || !p.ListingDone ||
		p.Fraction != 1 || p.ETASeconds != 0 || p.Holder != "instance-b" || p.State != StateCompleted {
		t.Fatalf("completed progress = %+v; want 8 of 8, 40 records, fraction 1, ETA 0", p)
	}

	rec := httptest.NewRecorder()
	ProgressHandler(e.db).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/backfill", nil))
	var view map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &view); err != nil || rec.Code != 200 {
		t.Fatalf("/debug/backfill = %d %s", rec.Code, rec.Body)
	}
	for _, k := range []string{"repos_done", "repos_known", "records_applied", "repos_per_second", "eta_seconds", "listing_done", "state", "lease"} {
		if _, ok := view[k]; !ok {
			t.Errorf("/debug/backfill has no %q: %s", k, rec.Body)
		}
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP appview_backfill_progress_repos Latest backfill run: (collection, DID) pairs by state: done, failed, known (reached so far; the total once listing is done).
# TYPE appview_backfill_progress_repos gauge
appview_backfill_progress_repos{state="done"} 8
appview_backfill_progress_repos{state="failed"} 0
appview_backfill_progress_repos{state="known"} 8
# HELP appview_backfill_progress_records Latest backfill run: records applied so far.
# TYPE appview_backfill_progress_records gauge
appview_backfill_progress_records 40
`), "appview_backfill_progress_repos", "appview_backfill_progress_records"); err != nil {
		t.Fatal(err)
	}
}

// TestProgressStateSaysWhetherAnInstanceHoldsTheRun: a run's row outlives
// the process that wrote it, so an unfinished run is "running" only while
// the backfill lease is held; otherwise the state says what is known.
func TestProgressStateSaysWhetherAnInstanceHoldsTheRun(t *testing.T) {
	// lease, when set, is the backfill lease row: its renewed_at and
	// expires_at relative to the database's now, in ms.
	type lease struct{ renewed, expires int64 }
	for _, tc := range []struct {
		name      string
		runFence  int64
		completed bool
		lease     *lease
		// failedAt, when set, is the latest failed attempt's last_error_at
		// (the run's updated_at is 2000).
		failedAt   int64
		state      string
		leaseState string
	}{
		{name: "held by another instance", runFence: 3, lease: &lease{-1000, 14000}, state: StateRunning, leaseState: fence.StateHeld},
		{name: "holder's grant expired", runFence: 3, lease: &lease{-60000, -45000}, state: StateStopped, leaseState: fence.StateExpired},
		{name: "lease released", runFence: 3, lease: &lease{-5000, -5000}, state: StateStopped, leaseState: fence.StateReleased},
		{name: "lease never taken", runFence: 3, state: StateStopped},
		{name: "completed, lease expired", runFence: 3, completed: true, lease: &lease{-60000, -45000}, state: StateCompleted, leaseState: fence.StateExpired},
		{name: "written with leases disabled", runFence: 0, state: StateUnknown},
		{name: "written with leases disabled, now held", runFence: 0, lease: &lease{-1000, 14000}, state: StateRunning, leaseState: fence.StateHeld},
		{name: "held, its latest attempt failed", runFence: 3, lease: &lease{-1000, 14000}, failedAt: 2500, state: StateFailing, leaseState: fence.StateHeld},
		{name: "held, an attempt began after a failure", runFence: 3, lease: &lease{-1000, 14000}, failedAt: 1500, state: StateRunning, leaseState: fence.StateHeld},
		{name: "failed, then the holder's grant expired", runFence: 3, lease: &lease{-60000, -45000}, failedAt: 2500, state: StateStopped, leaseState: fence.StateExpired},
		{name: "failed with leases disabled", runFence: 0, failedAt: 2000, state: StateFailing},
		{name: "failed, then completed", runFence: 3, completed: true, failedAt: 2500, state: StateCompleted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := openDB(t)
			completed := any(nil)
			if tc.completed {
				completed = 3000
			}
			if _, err := db.Exec(`INSERT INTO backfill_runs (id, started_at, completed_at, fence, holder, updated_at, repos_done, repos_failed, records)
VALUES (1, 1000, ?1, ?2, 'appview-1', 2000, 3, 0, 9)`, completed, tc.runFence); err != nil {
				t.Fatal(err)
			}
			if tc.failedAt > 0 {
				if _, err := db.Exec(`UPDATE backfill_runs SET failed_attempts = 2, last_error = 'every relay failed', last_error_at = ?1`, tc.failedAt); err != nil {
					t.Fatal(err)
				}
			}
			if l := tc.lease; l != nil {
				if _, err := db.Exec(`INSERT INTO leases (name, holder, fence, acquired_at, renewed_at, expires_at)
VALUES (?1, 'appview-2', 4, `+database.NowMS+` - 120000, `+database.NowMS+` + ?2, `+database.NowMS+` + ?3)`, LeaseName, l.renewed, l.expires); err != nil {
					t.Fatal(err)
				}
			}
			p, err := ReadProgress(context.Background(), db)
			if err != nil {
				t.Fatal(err)
			}
			if p.State != tc.state {
				t.Errorf("state %q, want %q", p.State, tc.state)
			}
			switch {
			case tc.leaseState == "" && p.Lease != nil:
				t.Errorf("lease %+v, want none", p.Lease)
			case tc.leaseState != "" && (p.Lease == nil || p.Lease.State != tc.leaseState || p.Lease.Holder != "appview-2"):
				t.Errorf("lease %+v, want %s by appview-2", p.Lease, tc.leaseState)
			}
			if tc.failedAt > 0 && (p.FailedAttempts != 2 || p.LastError != "every relay failed" || p.LastErrorAt == nil || p.LastErrorAt.UnixMilli() != tc.failedAt) {
				t.Errorf("failed attempts %d, last error %q at %v; want 2, the error, at %d", p.FailedAttempts, p.LastError, p.LastErrorAt, tc.failedAt)
			}
			if p.State == StateStopped && p.ETASeconds != -1 {
				t.Errorf("a stopped run has ETA %v, want -1 (unknown)", p.ETASeconds)
			}
		})
	}
}
