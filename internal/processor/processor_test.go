package processor_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
)

func readJSONL(t testing.TB, path string) []jetstream.Event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	var out []jetstream.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev jetstream.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// unfenced is the custody of a worker running with leases disabled.
var unfenced = fence.Custody{Lease: "test"}

func countRows(t testing.TB, db *database.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

var registryTables = []string{"users", "manifests", "manifest_layers", "manifest_references", "manifest_annotations",
	"tags", "stars", "repo_pages", "hold_captains", "hold_crew", "repository_hold_stats", "repository_stats", "record_tombstones"}

// Real app.bsky.* traffic leaves no record rows. Its #identity and
// #account events keep a users row for each account they name (the first
// event of a DID is kept: docs/interop.md, "Account lifecycle").
func TestRealTrafficCreatesNoRecordRowsAndLogsNothingAboveWarn(t *testing.T) {
	for _, name := range []string{"expected_v1.jsonl", "golden_v1.jsonl"} {
		t.Run(name, func(t *testing.T) {
			db := testsupport.OpenDB(t)
			events := readJSONL(t, filepath.Join("..", "jetstream", "testdata", name))
			var logs bytes.Buffer
			reg := prometheus.NewRegistry()
			m, err := processor.NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			p := processor.New(processor.Options{Log: zerolog.New(&logs).Level(zerolog.DebugLevel), Metrics: m})
			res, err := p.Apply(context.Background(), db, unfenced, events)
			if err != nil {
				t.Fatalf("apply: %v", err)
			}
			var commits, maxUS int64
			accounts := map[string]bool{}
			for _, ev := range events {
				if ev.Kind == jetstream.KindCommit {
					commits++
				} else {
					accounts[ev.DID] = true
				}
				maxUS = max(maxUS, ev.TimeUS)
			}
			for _, table := range registryTables {
				want := 0
				if table == "users" {
					want = len(accounts)
				}
				if n := countRows(t, db, table); n != want {
					t.Errorf("%s has %d rows, want %d", table, n, want)
				}
			}
			if got := int64(res.Skipped[processor.ReasonNotATCR]); got != commits {
				t.Errorf("not_atcr skips = %d, want %d (every commit); result %+v", got, commits, res)
			}
			if res.SkippedTotal() != int(commits) || res.Applied+res.Unchanged != len(events)-int(commits) {
				t.Errorf("result %+v: want only not_atcr skips and the identity and account events applied", res)
			}
			if res.MaxTimeUS != maxUS {
				t.Errorf("MaxTimeUS = %d, want %d", res.MaxTimeUS, maxUS)
			}
			if got := metricSum(t, reg, "appview_processor_skipped_total"); got != float64(commits) {
				t.Errorf("skipped metric = %v, want %d", got, commits)
			}
			for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				if line == "" {
					continue
				}
				var l struct{ Level string }
				_ = json.Unmarshal([]byte(line), &l)
				if l.Level != "debug" && l.Level != "info" && l.Level != "warn" {
					t.Errorf("log line above warn: %s", line)
				}
			}
		})
	}
}

// metricSum sums every series of the named counter.
func metricSum(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
