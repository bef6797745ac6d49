package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/actors/backfill"
	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

func TestWriteProgressDrawsABarOnATerminalAndPlainLinesOtherwise(t *testing.T) {
	started := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	p := backfill.Progress{Run: true, RunID: 3, Holder: "appview-1", Fence: 7, StartedAt: started,
		ReposDone: 45, ReposFailed: 5, ReposKnown: 100, Records: 900, Fraction: 0.5,
		ReposPerSecond: 2.5, RecordsPerSecond: 45, ETASeconds: 20, ListingDone: true, State: backfill.StateRunning}
	var tty, plain bytes.Buffer
	writeProgress(&tty, p, true, started)
	writeProgress(&plain, p, false, started)
	if !strings.Contains(tty.String(), strings.Repeat("█", barWidth/2)+strings.Repeat("░", barWidth/2)) ||
		!strings.Contains(tty.String(), " 50.0%") || !strings.Contains(tty.String(), "50/100 repos") || !strings.Contains(tty.String(), "ETA 20s") {
		t.Errorf("terminal output:\n%s", tty.String())
	}
	for _, want := range []string{"run: 3\n", "state: running\n", "holder: appview-1\n", "repos_done: 45\n", "repos_failed: 5\n",
		"repos_known: 100\n", "records_applied: 900\n", "percent: 50.0\n", "repos_per_second: 2.50\n", "eta: 20s\n"} {
		if !strings.Contains(plain.String(), want) {
			t.Errorf("plain output lacks %q:\n%s", want, plain.String())
		}
	}
	if strings.ContainsAny(plain.String(), "█░") {
		t.Errorf("plain output draws a bar:\n%s", plain.String())
	}
	p.ListingDone = false
	plain.Reset()
	writeProgress(&plain, p, false, started)
	if !strings.Contains(plain.String(), "repos_known: 100+\n") || !strings.Contains(plain.String(), "eta: at least 20s\n") {
		t.Errorf("while listing, the total and ETA are lower bounds:\n%s", plain.String())
	}
}

// An unfinished run's row outlives its process: the status says whether
// an instance holds the backfill lease, and what became of the last grant.
func TestWriteProgressSaysWhatIsKnownOfAnUnfinishedRun(t *testing.T) {
	started := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	now := started.Add(10 * time.Minute).UnixMilli()
	grant := func(state string, renewed, expires int64) *fence.Listed {
		return &fence.Listed{Row: fence.Row{Name: backfill.LeaseName, Holder: "appview-2", Fence: 8,
			RenewedAt: now + renewed, ExpiresAt: now + expires, Now: now}, State: state, TimeLeftMS: max(expires, 0)}
	}
	for _, tc := range []struct {
		name  string
		state string
		lease *fence.Listed
		plain []string // lines of the plain output
		tty   string   // in the terminal's header line
	}{
		{"held", backfill.StateRunning, grant(fence.StateHeld, -2500, 12500),
			[]string{"state: running\n", "lease: held by appview-2 (fence 8, 12.5s left)\n"}, "(running, holder appview-1, fence 7)"},
		{"grant expired", backfill.StateStopped, grant(fence.StateExpired, -195000, -180000),
			[]string{"state: stopped\n", "lease: expired: appview-2's grant (fence 8) ran out 3m0s ago\n", "eta: unknown\n"},
			"(stopped: no instance holds the backfill lease, expired: appview-2's grant (fence 8) ran out 3m0s ago; last holder appview-1, fence 7)"},
		{"released", backfill.StateStopped, grant(fence.StateReleased, -60000, -60000),
			[]string{"state: stopped\n", "lease: released by appview-2 (fence 8) 1m0s ago\n"}, "(stopped: no instance holds the backfill lease, released by appview-2"},
		{"never taken", backfill.StateStopped, nil,
			[]string{"state: stopped\n", "lease: never taken\n"}, "(stopped: no instance holds the backfill lease, never taken; last holder appview-1"},
		{"failing", backfill.StateFailing, grant(fence.StateHeld, -2500, 12500),
			[]string{"state: failing\n", "failed_attempts: 4\n", "last_error_at: 2026-12-01T11:58:00Z\n", "last_error: backfill run 3 left unfinished: every relay failed\n"},
			"(failing: 4 failed attempts, the last 2m0s ago; holder appview-1, fence 7)\n" + strings.Repeat("░", barWidth)},
		{"leases disabled", backfill.StateUnknown, nil,
			[]string{"state: unknown\n", "updated_at: 2026-12-01T12:05:00Z\n"}, "(unknown: written with leases disabled, last progress 2026-12-01T12:05:00Z; holder appview-1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := backfill.Progress{Run: true, RunID: 3, Holder: "appview-1", Fence: 7, StartedAt: started, UpdatedAt: started.Add(5 * time.Minute),
				ReposDone: 45, ReposKnown: 100, Fraction: 0.45, ETASeconds: -1, ListingDone: true, State: tc.state, Lease: tc.lease}
			if tc.state == backfill.StateFailing {
				at := started.Add(-2 * time.Minute)
				p.FailedAttempts, p.LastError, p.LastErrorAt, p.Fraction = 4, "backfill run 3 left unfinished: every relay failed", &at, 0
			}
			var tty, plain bytes.Buffer
			writeProgress(&tty, p, true, started)
			writeProgress(&plain, p, false, started)
			for _, want := range tc.plain {
				if !strings.Contains(plain.String(), want) {
					t.Errorf("plain output lacks %q:\n%s", want, plain.String())
				}
			}
			if tc.state == backfill.StateFailing && !strings.Contains(tty.String(), "last error (2m0s ago): backfill run 3 left unfinished") {
				t.Errorf("terminal output lacks the last error:\n%s", tty.String())
			}
			if !strings.Contains(tty.String(), tc.tty) {
				t.Errorf("terminal output lacks %q:\n%s", tc.tty, tty.String())
			}
			if tc.state != backfill.StateRunning && strings.Contains(plain.String()+tty.String(), "running") {
				t.Errorf("a run no instance is known to hold is shown running:\n%s%s", tty.String(), plain.String())
			}
		})
	}
}

// TestBackfillStatusReadsTheDatabaseWithoutWriting runs the command on a
// database holding one unfinished run (a pipe: plain lines).
func TestBackfillStatusReadsTheDatabaseWithoutWriting(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "appview.db")
	db := testsupport.OpenUnmigrated(t, path)
	if _, err := db.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	env := childEnv("APPVIEW_DATABASE_URL=file:" + path)
	if r := runAppview(t, dir, env, "backfill", "status"); r.code != 0 || r.stdout != "no backfill run recorded\n" {
		t.Fatalf("on an empty database: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// No run has no times: they are left out, not year 1.
	if r := runAppview(t, dir, env, "backfill", "status", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"run": false`) ||
		strings.Contains(r.stdout, "started_at") || strings.Contains(r.stdout, "updated_at") || strings.Contains(r.stdout, "0001-01-01") {
		t.Fatalf("--json on an empty database: exit %d, stdout:\n%s\nstderr %q", r.code, r.stdout, r.stderr)
	}
	if _, err := db.Exec(`INSERT INTO backfill_runs (id, started_at, fence, holder, updated_at, repos_done, repos_failed, records)
VALUES (1, 1000, 4, 'appview-2', 2000, 3, 1, 42)`); err != nil {
		t.Fatal(err)
	}
	var before int64
	_ = db.QueryRow(`SELECT updated_at FROM backfill_runs`).Scan(&before)
	// No instance holds the backfill lease: appview-2 is gone.
	r := runAppview(t, dir, env, "backfill", "status")
	if r.code != 0 || !strings.Contains(r.stdout, "holder: appview-2\n") || !strings.Contains(r.stdout, "repos_done: 3\n") ||
		!strings.Contains(r.stdout, "records_applied: 42\n") || !strings.Contains(r.stdout, "state: stopped\n") ||
		!strings.Contains(r.stdout, "lease: never taken\n") {
		t.Fatalf("exit %d, stdout:\n%s\nstderr %q", r.code, r.stdout, r.stderr)
	}
	// appview-3 holds it (it is about to resume the run).
	if _, err := db.Exec(`INSERT INTO leases (name, holder, fence, acquired_at, renewed_at, expires_at)
VALUES ('backfill', 'appview-3', 5, ` + database.NowMS + `, ` + database.NowMS + `, ` + database.NowMS + ` + 60000)`); err != nil {
		t.Fatal(err)
	}
	if r := runAppview(t, dir, env, "backfill", "status", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"started_at": "1970-01-01T00:00:01Z"`) {
		t.Fatalf("--json with a run: exit %d, stdout:\n%s\nstderr %q", r.code, r.stdout, r.stderr)
	}
	r = runAppview(t, dir, env, "backfill", "status")
	if r.code != 0 || !strings.Contains(r.stdout, "state: running\n") || !strings.Contains(r.stdout, "lease: held by appview-3 (fence 5, ") {
		t.Fatalf("with the lease held: exit %d, stdout:\n%s\nstderr %q", r.code, r.stdout, r.stderr)
	}
	var after int64
	_ = db.QueryRow(`SELECT updated_at FROM backfill_runs`).Scan(&after)
	if after != before {
		t.Fatal("backfill status wrote to the run")
	}
	if r := runAppview(t, t.TempDir(), childEnv("APPVIEW_DATABASE_URL=file:missing.db"), "backfill", "status"); r.code != cli.ExitConfig {
		t.Fatalf("on a missing database: exit %d, want %d (like appview leases)", r.code, cli.ExitConfig)
	}
}
