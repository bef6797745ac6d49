package workers_test

import (
	"context"
	"database/sql"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"
	"github.com/atcr-io/appview/system"
)

// This is the leased worker of docs/architecture.md ("Adding a worker"),
// which lives in its own package (actors/digest/digest.go) and is
// registered by one line in cmd/appview/workers.go, `digest.Registration,`.
// The tests below compile it, run it on a file database and check that
// the page shows this code.

// Registration is the digest worker's line in cmd/appview/workers.go. Its
// Keys make digest.enabled and digest.interval configuration keys.
var Registration = workers.Registration{
	New: Worker,
	Keys: workers.Keys{Section: "digest", Enabled: true, Interval: 24 * time.Hour, MinInterval: time.Minute,
		Why: "a digest is a daily summary", About: "writes a digest row (lease daily-digest)"},
}

// Worker writes a digest row every digest.interval, on exactly one instance.
func Worker(d workers.Deps) (workers.Spec, error) {
	return workers.Spec{
		Name:   "daily-digest", // also the lease name
		Leased: true,
		Job: func(ctx context.Context, c fence.Custody) error {
			return fence.Fenced(ctx, d.DB, c, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO digests (sent_at, fence) VALUES (unixepoch() * 1000, ?1)`, c.Fence)
				return err // commits only while this instance still holds the lease
			})
		},
	}, nil
}

// digestMigration is the worker's table, as the page shows it in
// internal/database/migrations/NNNN_digests.sql.
const digestMigration = `CREATE TABLE digests (
  sent_at INTEGER NOT NULL, -- Unix ms
  fence   INTEGER NOT NULL  -- the daily-digest fence it was written under
);`

// The example runs end to end: loaded with its keys, built by the
// runtime, started under its lease on a file database, it writes its row
// at once (the first run is at grant) under the fence of its grant.
func TestTheExampleWorkerWritesItsRowUnderItsFence(t *testing.T) {
	db := testsupport.OpenDB(t)
	if _, err := db.Exec(digestMigration); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(config.Sources{Workers: []config.WorkerKeys{Registration.Keys},
		Sets: []string{"instance_id=example", "leases.ttl=3s", "leases.renew_interval=500ms", "leases.renew_deadline=2s", "leases.retry_interval=200ms"}})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := Registration.Build(workers.Deps{Config: cfg, DB: db, Log: zerolog.Nop()})
	if err != nil || spec.Interval != 24*time.Hour {
		t.Fatalf("Build: %+v, %v; want every digest.interval (24h)", spec, err)
	}
	reg := &system.Registry{}
	if err := reg.Register(spec); err != nil {
		t.Fatal(err)
	}
	sys, err := system.New(system.Options{Config: cfg, DB: db, Log: zerolog.Nop(), Registry: reg, Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.Start(); err != nil {
		t.Fatal(err)
	}
	var rows, written, held int64
	deadline := time.Now().Add(15 * time.Second)
	for rows == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if err := db.QueryRow(`SELECT count(*), coalesce(max(d.fence), 0), coalesce(max(l.fence), 0)
			FROM digests d JOIN leases l ON l.name = 'daily-digest'`).Scan(&rows, &written, &held); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sys.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if rows != 1 || written < 1 || written != held {
		t.Fatalf("%d digest rows, written under fence %d, lease daily-digest at fence %d; want one row under the lease's fence", rows, written, held)
	}
}

// docs/architecture.md shows this worker and its table: its code blocks
// are this file's, so the page cannot drift from code that runs.
func TestTheArchitecturePageShowsTheExampleThatRuns(t *testing.T) {
	page, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```(go|sql)\n(.*?)```").FindAllSubmatch(page, -1)
	var code, sql string
	for _, b := range blocks {
		switch body := string(b[2]); {
		case string(b[1]) == "go" && strings.HasPrefix(body, "package digest\n"):
			code = body
		case string(b[1]) == "sql" && strings.Contains(body, "CREATE TABLE digests"):
			sql = body
		}
	}
	if code == "" || sql == "" {
		t.Fatal("docs/architecture.md lacks the digest worker's package or its table")
	}
	// The page's file from its first declaration on is this file's.
	decls := code[strings.Index(code, "\n// Registration"):]
	if !strings.Contains(string(self), decls) {
		t.Errorf("the page's digest.go differs from example_test.go from its first declaration on:\n%s", decls)
	}
	if !strings.Contains(string(self), strings.TrimSpace(sql)) {
		t.Errorf("the page's migration differs from digestMigration:\n%s", sql)
	}
}
