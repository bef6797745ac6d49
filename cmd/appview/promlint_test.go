package main

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// Every metric a fully wired instance exports (every worker registered:
// billing, labeler and backfill enabled, their peers unreachable) passes
// Prometheus' own linter: names with base units and _total for counters,
// help texts, no reserved suffixes on the wrong type.
func TestMetricsOfAFullyWiredInstancePassPromlint(t *testing.T) {
	t.Parallel()
	const nowhere = "127.0.0.1:1" // connection refused at once
	dir := t.TempDir()
	p := startServe(t, dir, childEnv(
		"APPVIEW_HEALTH_CHECK_INTERVAL=200ms",
		"APPVIEW_HEALTH_TIMEOUT=100ms",
		"APPVIEW_ADMIN_ADDR=127.0.0.1:0",
		"APPVIEW_JETSTREAM_URLS=ws://"+nowhere+"/subscribe",
		"APPVIEW_BACKFILL_ENABLED=true",
		"APPVIEW_BACKFILL_RELAY_ENDPOINTS=http://"+nowhere,
		"APPVIEW_IDENTITY_PLC_URL=http://"+nowhere,
		"APPVIEW_LABELER_URL=http://"+nowhere,
		"APPVIEW_BILLING_ENABLED=true",
		"APPVIEW_BILLING_STRIPE_SECRET_KEY=sk_test_promlint",
		"APPVIEW_BILLING_STRIPE_API_URL=http://"+nowhere,
	))
	base := p.started()
	// A hold to check, so the health checker's series exist too.
	db, err := database.Open(context.Background(), database.Options{URL: "file:" + filepath.Join(dir, "data", "appview.db"), BusyTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`INSERT INTO hold_captains (hold_did, owner_did, public, allow_all_crew, enable_bluesky_posts, deployed_at)
VALUES ('did:web:hold.invalid', 'did:plc:captain', 1, 0, 0, 0)`); err != nil {
		t.Fatal(err)
	}
	// Series of labelled families appear once a worker has used them: wait
	// for one round of each worker (all fail fast against nowhere).
	var body, missing string
	defer func() {
		if t.Failed() {
			t.Logf("last missing family: %s", missing)
		}
	}()
	p.waitFor(startTimeout, "every worker's metrics on /metrics", func() bool {
		var code int
		missing = ""
		code, body = get(base + "/metrics")
		if code != 200 {
			return false
		}
		for _, family := range []string{"appview_lease_held", "appview_jetstream_frames_total", "appview_backfill_errors_total",
			"appview_labeler_connections_total", "appview_billing_rounds_total", "appview_hold_checks_total", "appview_hold_healthy",
			"appview_webhook_deliveries_total", "appview_consumer_batches_total"} {
			if !strings.Contains(body, "# TYPE "+family+" ") {
				missing = family
				return false
			}
		}
		return true
	})
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatalf("lint: %v", err)
	}
	for _, pr := range problems {
		t.Errorf("%s: %s", pr.Metric, pr.Text)
	}
}

// docMetric matches a metric name of this project in the docs; a name
// ending in "_" is a prefix ("appview_jetstream_*") and is not matched.
var docMetric = regexp.MustCompile(`\bappview_[a-z0-9_]*[a-z0-9]\b`)

// retiredMetrics are names that no longer exist, which the docs may give
// only where they say what replaced them (docs/hygiene.md).
var retiredMetrics = map[string]string{"appview_jetstream_cursor_time_us": "docs/hygiene.md"}

// Every metric the README and docs/ name is one the shipped binary
// registers: a string literal "appview_..." in a (non-test) source file
// it links. A renamed metric left in the docs (docs/jetstream.md listed
// appview_jetstream_cursor_time_us long after it became
// _cursor_timestamp_seconds) fails here, not an operator's alert.
func TestEveryMetricTheDocsNameIsRegistered(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.Dir}}{{range .GoFiles}}\t{{.}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	registered := map[string]bool{}
	fset := token.NewFileSet()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Split(line, "\t")
		if len(fields) < 2 || !isModuleDir(fields[0]) {
			continue
		}
		for _, name := range fields[1:] {
			f, err := parser.ParseFile(fset, filepath.Join(fields[0], name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if v, err := strconv.Unquote(lit.Value); err == nil && strings.HasPrefix(v, "appview_") {
						registered[v] = true
					}
				}
				return true
			})
		}
	}
	if len(registered) == 0 {
		t.Fatal("found no metric name in the binary's sources")
	}
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range append(docs, "../../README.md") {
		body, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(path, "../../")
		for i, line := range strings.Split(string(body), "\n") {
			for _, name := range docMetric.FindAllString(line, -1) {
				base := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(name, suffix); ok && registered[b] {
						base = b
					}
				}
				switch where, retired := retiredMetrics[name]; {
				case registered[base]:
				case retired && where == rel:
				case retired:
					t.Errorf("%s:%d names %s, which was renamed (see %s)", rel, i+1, name, where)
				default:
					t.Errorf("%s:%d names %s, which the binary does not register", rel, i+1, name)
				}
			}
		}
	}
}

// isModuleDir reports whether dir is a directory of this module (go list
// prints absolute directories; the module root is two levels up).
func isModuleDir(dir string) bool {
	root, err := filepath.Abs("../..")
	return err == nil && (dir == root || strings.HasPrefix(dir, root+string(filepath.Separator)))
}
