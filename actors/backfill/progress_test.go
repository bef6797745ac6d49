package backfill

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestProgressFollowsARunFromInterruptedToCompleted reads the progress of
// a run stopped mid-way and then completed by another holder, as every
// instance and `appview backfill status` see it (issue 11.6).
func TestProgressFollowsARunFromInterruptedToCompleted(t *testing.T) {
	e := newEnv(t)
	p, err := ReadProgress(context.Background(), e.db)
	if err != nil || p.Run || p.ETASeconds != -1 {
		t.Fatalf("progress with no run = %+v, %v; want Run false, ETA -1", p, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewProgressCollector(e.db))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP appview_backfill_progress_running 1 while the latest backfill run is unfinished, else 0.
# TYPE appview_backfill_progress_running gauge
appview_backfill_progress_running 0
`), "appview_backfill_progress_running"); err != nil {
		t.Fatal(err)
	}

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
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP appview_backfill_progress_running 1 while the latest backfill run is unfinished, else 0.
# TYPE appview_backfill_progress_running gauge
appview_backfill_progress_running 1
`), "appview_backfill_progress_running"); err != nil {
		t.Errorf("mid-run: %v", err)
	}

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
		p.Fraction != 1 || p.ETASeconds != 0 || p.Holder != "instance-b" {
		t.Fatalf("completed progress = %+v; want 8 of 8, 40 records, fraction 1, ETA 0", p)
	}

	rec := httptest.NewRecorder()
	ProgressHandler(e.db).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/backfill", nil))
	var view map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &view); err != nil || rec.Code != 200 {
		t.Fatalf("/debug/backfill = %d %s", rec.Code, rec.Body)
	}
	for _, k := range []string{"repos_done", "repos_known", "records_applied", "repos_per_second", "eta_seconds", "listing_done"} {
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
