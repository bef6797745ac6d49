package cleanup

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/system"
)

func TestMain(m *testing.M) { testsupport.VerifyTestMain(m) }

const (
	hour      = int64(time.Hour / time.Millisecond)
	retention = 30 * 24 * time.Hour
	ttl       = 15 * time.Second
)

type fixture struct {
	db  *database.DB
	now int64 // database clock when the fixture was built, Unix ms
	cfg config.Config
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := testsupport.OpenDB(t)
	mustExec(t, db.DB, `INSERT INTO webhooks (id, did, url, created_at) VALUES
	  (1, 'did:plc:owner', 'https://hooks.example/1', 0), (2, 'did:plc:owner', 'https://hooks.example/2', 0)`)
	f := &fixture{db: db, cfg: config.Default()}
	f.cfg.Cleanup.Retention = retention
	f.cfg.Leases.TTL = ttl
	if err := db.QueryRow("SELECT " + database.NowMS).Scan(&f.now); err != nil {
		t.Fatalf("db clock: %v", err)
	}
	return f
}

func mustExec(t *testing.T, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.Exec(query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

func (f *fixture) acquire(t *testing.T, holder string) fence.Custody {
	t.Helper()
	return testsupport.Custody(t, f.db, LeaseName, holder, ttl)
}

func (f *fixture) sweeper(t *testing.T, chunk int, log zerolog.Logger, m *Metrics) *Sweeper {
	t.Helper()
	s, err := New(Options{DB: f.db, Rules: Rules(f.cfg), ChunkRows: chunk, Log: log, Metrics: m})
	if err != nil {
		t.Fatalf("new sweeper: %v", err)
	}
	return s
}

// ids returns the first column of query, in order, as strings.
func ids(t *testing.T, db *sql.DB, query string) []string {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func leaseRows(t *testing.T, db *sql.DB) []string {
	return ids(t, db, `SELECT name||'|'||holder||'|'||fence||'|'||acquired_at||'|'||renewed_at||'|'||expires_at FROM leases ORDER BY name`)
}

// seed inserts rows on both sides of every rule's cutoff. Names say what
// the sweep must do with them.
func (f *fixture) seed(t *testing.T) {
	t.Helper()
	old := f.now - retention.Milliseconds() - hour
	recent := f.now - hour
	db := f.db.DB
	for i, d := range []struct {
		key, status string
		at          int64
	}{
		{"old-delivered-1", "delivered", old}, {"old-delivered-2", "delivered", old},
		{"old-delivered-3", "delivered", old}, {"old-failed", "failed", old},
		{"keep-old-pending", "pending", old}, {"keep-recent-delivered", "delivered", recent},
		{"keep-recent-failed", "failed", recent},
	} {
		mustExec(t, db, `INSERT INTO webhook_deliveries (webhook_id, event_key, trigger_name, trigger_data, status, attempts, next_attempt_at, created_at, updated_at)
		  VALUES (1, ?1, 'push', '{}', ?2, ?3, ?4, ?4, ?4)`,
			d.key, d.status, i, d.at)
	}
	// Run 1 and 2 completed long ago; 2 is the latest completed run and
	// must survive. Run 3 started long ago and is still running.
	mustExec(t, db, `INSERT INTO backfill_runs (id, started_at, completed_at, fence, updated_at) VALUES
	  (1, ?1, ?2, 1, ?2), (2, ?3, ?4, 1, ?4), (3, ?5, NULL, 2, ?5)`, old-3*hour, old-2*hour, old-hour, old, old)
	stale := f.now - ContenderStaleTTLs*ttl.Milliseconds() - 1000
	mustExec(t, db, `INSERT INTO lease_contenders (name, instance, nudge_url, seen_at) VALUES
	  ('cleanup', 'gone', 'http://gone', ?1), ('cleanup', 'alive', 'http://alive', ?2)`, stale, f.now-1000)
	mustExec(t, db, `INSERT INTO unleased_instances (instance, nonce, started_at, seen_at, every_ms) VALUES
	  ('killed', 'n1', ?1, ?1, 5000), ('running', 'n2', ?1, ?2, 5000)`, stale, f.now-1000)
	mustExec(t, db, `INSERT INTO hold_crew (hold_did, rkey, member_did, role, added_at) VALUES
	  ('did:web:hold.example', 'r1', 'did:plc:crew', 'write', 0)`)
	mustExec(t, db, `INSERT INTO billing_tier_pushes (hold_did, user_did, tier_rank, outcome, fence, updated_at) VALUES
	  ('did:web:hold.example', 'did:plc:crew', 1, 'pushed', 1, ?1),
	  ('did:web:hold.example', 'did:plc:left-old', 1, 'pushed', 1, ?1),
	  ('did:web:hold.example', 'did:plc:left-recent', 1, 'pushed', 1, ?2)`, old, recent)
	// Leases of other workers, one long expired: the sweep must leave them be.
	mustExec(t, db, `INSERT INTO leases (name, holder, fence, acquired_at, renewed_at, expires_at) VALUES
	  ('backfill', 'x', 7, ?1, ?1, ?1), ('jetstream-consumer', 'y', 3, ?2, ?2, ?3)`, old, f.now, f.now+60000)
}

func TestSweepPrunesExactlyWhatIsPastRetention(t *testing.T) {
	f := newFixture(t)
	f.seed(t)
	c := f.acquire(t, "inst-a")
	leasesBefore := leaseRows(t, f.db.DB)

	rep, err := f.sweeper(t, 2, zerolog.Nop(), nil).Sweep(context.Background(), c)
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}

	db := f.db.DB
	if got, want := ids(t, db, `SELECT event_key FROM webhook_deliveries ORDER BY event_key`),
		[]string{"keep-old-pending", "keep-recent-delivered", "keep-recent-failed"}; !reflect.DeepEqual(got, want) {
		t.Errorf("webhook_deliveries left %v, want %v", got, want)
	}
	if got, want := ids(t, db, `SELECT id FROM backfill_runs ORDER BY id`), []string{"2", "3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("backfill_runs left %v, want the latest completed run and the running one %v", got, want)
	}
	if got, want := ids(t, db, `SELECT instance FROM lease_contenders`), []string{"alive"}; !reflect.DeepEqual(got, want) {
		t.Errorf("lease_contenders left %v, want %v", got, want)
	}
	if got, want := ids(t, db, `SELECT instance FROM unleased_instances`), []string{"running"}; !reflect.DeepEqual(got, want) {
		t.Errorf("unleased_instances left %v, want %v", got, want)
	}
	if got, want := ids(t, db, `SELECT user_did FROM billing_tier_pushes ORDER BY user_did`),
		[]string{"did:plc:crew", "did:plc:left-recent"}; !reflect.DeepEqual(got, want) {
		t.Errorf("billing_tier_pushes left %v, want %v", got, want)
	}
	if got := leaseRows(t, db); !reflect.DeepEqual(got, leasesBefore) {
		t.Errorf("leases changed:\nbefore %v\nafter  %v", leasesBefore, got)
	}
	want := map[string]int64{"webhook_deliveries": 4, "backfill_runs": 1, "lease_contenders": 1, "unleased_instances": 1, "billing_tier_pushes": 1}
	if !reflect.DeepEqual(rep.Deleted, want) {
		t.Errorf("report %v, want %v", rep.Deleted, want)
	}
}

func TestSweepDeletesOldLatestRunOnceANewerRunCompletes(t *testing.T) {
	f := newFixture(t)
	f.seed(t)
	c := f.acquire(t, "inst-a")
	s := f.sweeper(t, 0, zerolog.Nop(), nil)
	if _, err := s.Sweep(context.Background(), c); err != nil {
		t.Fatalf("first sweep: %v", err)
	}
	mustExec(t, f.db.DB, `UPDATE backfill_runs SET completed_at = ?1 WHERE id = 3`, f.now-hour)
	if _, err := s.Sweep(context.Background(), c); err != nil {
		t.Fatalf("second sweep: %v", err)
	}
	if got, want := ids(t, f.db.DB, `SELECT id FROM backfill_runs`), []string{"3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("backfill_runs left %v, want %v", got, want)
	}
}

func TestSupersededCustodyDeletesNothing(t *testing.T) {
	f := newFixture(t)
	f.seed(t)
	first := f.acquire(t, "inst-a")
	mustExec(t, f.db.DB, `UPDATE leases SET expires_at = 0 WHERE name = ?1`, LeaseName)
	second := f.acquire(t, "inst-b")
	if second.Fence != first.Fence+1 {
		t.Fatalf("second fence %d, want %d", second.Fence, first.Fence+1)
	}
	count := func() string {
		return strings.Join(ids(t, f.db.DB, `SELECT (SELECT COUNT(*) FROM webhook_deliveries)||','||
		  (SELECT COUNT(*) FROM backfill_runs)||','||(SELECT COUNT(*) FROM lease_contenders)||','||
		  (SELECT COUNT(*) FROM billing_tier_pushes)`), "")
	}
	before, leasesBefore := count(), leaseRows(t, f.db.DB)

	rep, err := f.sweeper(t, 2, zerolog.Nop(), nil).Sweep(context.Background(), first)
	if !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("sweep under fence %d: err %v, want ErrSuperseded", first.Fence, err)
	}
	if after := count(); after != before {
		t.Errorf("row counts %s after a superseded sweep, want unchanged %s", after, before)
	}
	if got := leaseRows(t, f.db.DB); !reflect.DeepEqual(got, leasesBefore) {
		t.Errorf("leases changed:\nbefore %v\nafter  %v", leasesBefore, got)
	}
	if len(rep.Failed) != 1 {
		t.Errorf("superseded sweep tried %d rules, want to stop at the first: %v", len(rep.Failed), rep.Failed)
	}

	if _, err := f.sweeper(t, 2, zerolog.Nop(), nil).Sweep(context.Background(), second); err != nil {
		t.Fatalf("sweep under the current fence: %v", err)
	}
	if after := count(); after == before {
		t.Errorf("current custody deleted nothing (counts %s)", after)
	}
}

func TestFailingRuleIsReportedAndOtherRulesStillRun(t *testing.T) {
	f := newFixture(t)
	f.seed(t)
	c := f.acquire(t, "inst-a")
	rules := append([]Rule{{Name: "missing", Table: "no_such_table", Where: "x < ?1", Age: time.Hour}}, Rules(f.cfg)...)
	var logs bytes.Buffer
	s, err := New(Options{DB: f.db, Rules: rules, Log: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := s.Sweep(context.Background(), c)
	if err == nil || !strings.Contains(err.Error(), `"missing"`) {
		t.Fatalf("sweep error %v, want one naming rule \"missing\"", err)
	}
	if rep.Deleted["webhook_deliveries"] != 4 {
		t.Errorf("webhook_deliveries deleted %d after an earlier rule failed, want 4", rep.Deleted["webhook_deliveries"])
	}
	if !strings.Contains(logs.String(), `"rule":"missing"`) {
		t.Errorf("no warning names the failing rule; log:\n%s", logs.String())
	}
}

func TestSweepLogsOneLineAndCountsDeletedRows(t *testing.T) {
	f := newFixture(t)
	f.seed(t)
	c := f.acquire(t, "inst-a")
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	if err := f.sweeper(t, 0, zerolog.New(&logs), m).Run(context.Background(), c); err != nil {
		t.Fatalf("run: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("sweep logged %d lines, want 1:\n%s", len(lines), logs.String())
	}
	var line struct {
		Level   string           `json:"level"`
		Event   string           `json:"event"`
		Fence   int64            `json:"fence"`
		Deleted map[string]int64 `json:"deleted"`
		Total   int64            `json:"deleted_total"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &line); err != nil {
		t.Fatalf("log line %q: %v", lines[0], err)
	}
	if line.Level != "info" || line.Event != "cleanup.sweep" || line.Fence != c.Fence || line.Total != 8 ||
		line.Deleted["webhook_deliveries"] != 4 {
		t.Errorf("log line %+v", line)
	}
	if got := testutil.ToFloat64(m.deleted.WithLabelValues("webhook_deliveries")); got != 4 {
		t.Errorf("rows_deleted_total{rule=webhook_deliveries} = %v, want 4", got)
	}
	if got := testutil.ToFloat64(m.sweeps.WithLabelValues("ok")); got != 1 {
		t.Errorf("sweeps_total{outcome=ok} = %v, want 1", got)
	}
}

func TestNewRefusesRulesThatWouldTouchLeasesOrEverything(t *testing.T) {
	f := newFixture(t)
	for _, r := range []Rule{
		{Name: "leases", Table: "leases", Where: "expires_at < ?1", Age: time.Hour},
		{Name: "LEASES", Table: "LEASES", Where: "expires_at < ?1", Age: time.Hour},
		{Name: "all", Table: "webhook_deliveries", Where: " ", Age: time.Hour},
		{Name: "inject", Table: "webhook_deliveries; DROP TABLE leases", Where: "1", Age: time.Hour},
		{Name: "young", Table: "webhook_deliveries", Where: "updated_at < ?1", Age: 0},
	} {
		if _, err := New(Options{DB: f.db, Rules: []Rule{r}}); err == nil {
			t.Errorf("New accepted rule %+v", r)
		}
	}
}

func TestWorkerRegistersALeasedJobOnTheCleanupInterval(t *testing.T) {
	f := newFixture(t)
	cfg := config.Default()
	cfg.Cleanup.Interval = 7 * time.Minute
	d := workers.Deps{Config: cfg, DB: f.db, Log: zerolog.Nop(), Metrics: prometheus.NewRegistry()}
	w, err := Worker(d)
	if err != nil {
		t.Fatalf("worker: %v", err)
	}
	if w.Name != "cleanup" || !w.Leased || w.Job == nil || w.Interval != 7*time.Minute {
		t.Errorf("worker %+v", w)
	}
	var r system.Registry
	if err := r.Register(w); err != nil {
		t.Errorf("register: %v", err)
	}

	cfg.Cleanup.ChunkRows = 0
	err = cfg.Validate()
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Key != "cleanup.chunk_rows" {
		t.Errorf("chunk_rows 0: err %v, want *config.Error for cleanup.chunk_rows", err)
	}
}

func TestSmallChunksStillDeleteEveryMatchingRow(t *testing.T) {
	for _, rows := range []int{9, 11} { // an exact multiple of the chunk, and not
		t.Run(fmt.Sprint(rows), func(t *testing.T) {
			f := newFixture(t)
			c := f.acquire(t, "inst-a")
			old := f.now - retention.Milliseconds() - hour
			for i := 0; i < rows; i++ {
				mustExec(t, f.db.DB, `INSERT INTO webhook_deliveries (webhook_id, event_key, trigger_name, trigger_data, status, next_attempt_at, created_at, updated_at)
				  VALUES (2, ?1, 'push', '{}', 'delivered', ?2, ?2, ?2)`,
					fmt.Sprintf("k%d", i), old)
			}
			rep, err := f.sweeper(t, 3, zerolog.Nop(), nil).Sweep(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Deleted["webhook_deliveries"] != int64(rows) {
				t.Errorf("deleted %d, want %d", rep.Deleted["webhook_deliveries"], rows)
			}
		})
	}
}
