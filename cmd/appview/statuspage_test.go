package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/testsupport"
)

// browserOptOut is the environment variable that lets a developer without
// Chromium skip the browser test. It is ignored when CI=true: CI installs
// Chromium (.ci/run) and must never skip this test.
const browserOptOut = "APPVIEW_SKIP_BROWSER_TESTS"

// chromium returns the Chromium binary (CHROMIUM_BIN, else chromium or
// chromium-browser on PATH). Without one the test fails loudly, unless
// browserOptOut=1 outside CI.
func chromium(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("CHROMIUM_BIN"); bin != "" {
		return bin
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if bin, err := exec.LookPath(name); err == nil {
			return bin
		}
	}
	if os.Getenv("CI") != "true" && os.Getenv(browserOptOut) == "1" {
		t.Skipf("no Chromium on PATH and %s=1: the status page browser test is skipped", browserOptOut)
	}
	t.Fatalf("no Chromium found (install Debian's chromium package, set CHROMIUM_BIN, or outside CI set %s=1 to skip)", browserOptOut)
	return ""
}

// headless runs Chromium headless on url with the flags this machine
// needs (no sandbox as root, no network beyond the page) and a new empty
// profile; extra selects the output (--dump-dom or --screenshot=...).
func headless(t *testing.T, bin, url string, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir(), "--window-size=1000,900"}, extra...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	cmd.Dir = t.TempDir()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %s: %v\n%s", strings.Join(extra, " "), err, stderr.String())
	}
	return string(out)
}

// TestStatusPageInHeadlessChromiumShowsTheFleetAndTheHolder runs two
// instances on one database, hands every lease over from one to the
// other, brings the first back as a contender, and loads the status page
// of the new holder in headless Chromium: the page must show
// both instances, the current holder of each lease and the handover. The
// screenshot is written to APPVIEW_STATUS_SCREENSHOT when set (that is
// how docs/status-page.png is made).
func TestStatusPageInHeadlessChromiumShowsTheFleetAndTheHolder(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	dir := t.TempDir()
	env := func(id string) []string {
		return childEnv("APPVIEW_INSTANCE_ID="+id, "APPVIEW_DATABASE_URL=file:"+filepath.Join(dir, "shared.db"),
			"APPVIEW_ADMIN_ADDR=127.0.0.1:0", "APPVIEW_BACKFILL_ENABLED=false",
			"APPVIEW_JETSTREAM_URLS=ws://127.0.0.1:1/subscribe",
			"APPVIEW_LEASES_TTL=3s", "APPVIEW_LEASES_RENEW_INTERVAL=500ms", "APPVIEW_LEASES_RENEW_DEADLINE=2s", "APPVIEW_LEASES_RETRY_INTERVAL=300ms")
	}
	// A backfill run half-way and a committed Jetstream position, as a
	// running fleet would have them (backfill is disabled here and the
	// Jetstream URL refuses, so neither moves).
	db := testsupport.OpenUnmigrated(t, filepath.Join(dir, "shared.db"))
	if _, err := db.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, q := range []string{
		`INSERT INTO backfill_runs (id, started_at, fence, holder, updated_at, repos_done, repos_failed, records) VALUES (1, ?1, 1, 'status-a', ?1, 2, 1, 57)`,
		`INSERT INTO backfill_collections (run_id, collection, done, updated_at) VALUES (1, 'io.atcr.manifest', 0, ?1)`,
		`INSERT INTO backfill_repos (run_id, collection, did, state, updated_at) VALUES (1, 'io.atcr.manifest', 'did:plc:a', 'done', ?1), (1, 'io.atcr.manifest', 'did:plc:b', 'done', ?1), (1, 'io.atcr.manifest', 'did:plc:c', 'failed', ?1), (1, 'io.atcr.manifest', 'did:plc:d', 'running', ?1), (1, 'io.atcr.manifest', 'did:plc:e', 'running', ?1), (1, 'io.atcr.manifest', 'did:plc:f', 'running', ?1)`,
	} {
		if _, err := db.Exec(q, now.Add(-time.Minute).UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(`INSERT INTO jetstream_cursor (id, time_us, updated_at, fence) VALUES (1, ?1, ?2, 0)`, now.Add(-4*time.Second).UnixMicro(), now.UnixMilli()); err != nil {
		t.Fatal(err)
	}
	a := startServe(t, t.TempDir(), env("status-a"))
	aURL := a.started()
	held := func(base, holder string) func() bool {
		return func() bool {
			code, body := get(base + "/debug/leases")
			if code != 200 {
				return false
			}
			var v struct {
				Leases []struct{ Holder, State string }
			}
			if json.Unmarshal([]byte(body), &v) != nil || len(v.Leases) == 0 {
				return false
			}
			for _, l := range v.Leases {
				if l.Holder != holder || l.State != "held" {
					return false
				}
			}
			return true
		}
	}
	a.waitFor(startTimeout, "status-a to hold every lease", held(aURL, "status-a"))
	b := startServe(t, t.TempDir(), env("status-b"))
	bURL := b.started()
	b.waitFor(startTimeout, "status-b to contend", func() bool {
		_, page := get(bURL + "/")
		return strings.Contains(page, "status-a") && strings.Contains(page, "status-b")
	})
	a.signal(syscall.SIGTERM)
	if code, _ := a.wait(30 * time.Second); code != 0 {
		t.Fatalf("status-a exited %d", code)
	}
	b.waitFor(startTimeout, "status-b to hold every lease", held(bURL, "status-b"))
	a = startServe(t, t.TempDir(), env("status-a"))
	a.started()
	b.waitFor(startTimeout, "the page to show status-a again and the handover", func() bool {
		_, page := get(bURL + "/")
		return strings.Contains(page, `<code>status-a</code></td><td><code>status-b</code>`) && strings.Contains(page, "<code>status-a</code>")
	})

	dom := headless(t, bin, bURL+"/", "--dump-dom")
	for _, want := range []string{
		`<code id="self">status-b</code>`,          // served by the holder
		`<code>status-a</code>`,                    // the other instance
		`<td class="holder"><code>status-b</code>`, // the current holder of the leases
		`<td class="held">held</td>`,
		`<svg class="spark"`, // the sparkline (a placeholder until two lag samples)
		// Backfill is disabled: no instance holds its lease, so the
		// unfinished run is not running, whatever its row says.
		`<p id="backfill">run 1 (stopped`, "3/6+ repos",
		`<p id="jetstream">position <code>`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the rendered page lacks %q", want)
		}
	}
	if strings.Contains(dom, `<td class="holder"><code>status-a</code>`) {
		t.Error("the page shows status-a as a holder after the handover")
	}
	if !strings.Contains(dom, `<td><code>status-a</code></td><td><code>status-b</code></td>`) {
		t.Error("the page shows no handover from status-a to status-b")
	}
	shot := filepath.Join(t.TempDir(), "status.png")
	if out := os.Getenv("APPVIEW_STATUS_SCREENSHOT"); out != "" {
		shot = out
	}
	headless(t, bin, bURL+"/", "--screenshot="+shot, "--hide-scrollbars")
	png, err := os.ReadFile(shot)
	if err != nil || len(png) < 1000 || string(png[1:4]) != "PNG" {
		t.Fatalf("screenshot %s: %d bytes, %v", shot, len(png), err)
	}
}
