package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/testsupport"
)

// refusal is one configuration `appview serve` must refuse at start (docs/spec.md
// §3): exit code 2 and exactly one stderr line naming key and reason.
type refusal struct {
	name string
	// yaml, when set, is written to appview.yaml and passed as --config.
	yaml string
	env  []string
	args []string
	// setup prepares the run directory and returns extra arguments.
	setup  func(t *testing.T, dir string) []string
	key    string
	reason string
}

func refusals() []refusal {
	return []refusal{
		{name: "unknown top-level key", yaml: "instance_idd: web-1\n", key: "instance_idd", reason: "unknown key (did you mean instance_id?) (line 1)"},
		{name: "unknown nested key", yaml: "admin:\n  addr: 127.0.0.1:0\nleases:\n  tll: 15s\n", key: "leases.tll", reason: "unknown key (did you mean leases.ttl?) (line 4)"},
		{name: "duplicate key", yaml: "leases:\n  ttl: 15s\n  ttl: 20s\n", key: "leases.ttl", reason: "duplicate key (line 3)"},
		{name: "two YAML documents", yaml: "admin:\n  addr: 127.0.0.1:0\n---\nleases:\n  ttl: 20s\n", key: "--config", reason: "more than one YAML document"},
		{name: "unparsable duration", yaml: "leases:\n  ttl: fifteen seconds\n", key: "leases.ttl", reason: `unparsable duration "fifteen seconds"`},
		{name: "ttl below 500ms", args: []string{"--set", "leases.ttl=3ms"}, key: "leases.ttl", reason: "must be at least 500ms, got 3ms"},
		{name: "ttl above 1h", env: []string{"APPVIEW_LEASES_TTL=100000h"}, key: "leases.ttl", reason: "must be at most 1h, got 100000h"},
		{name: "retry_interval above the ttl", yaml: "leases:\n  retry_interval: 20s\n", key: "leases.retry_interval", reason: "must not exceed leases.ttl (20s > 15s)"},
		{name: "renew_interval not below half the ttl", args: []string{"--set", "leases.renew_interval=7500ms"}, key: "leases.renew_interval", reason: "must be less than half of leases.ttl"},
		{name: "renew_deadline not below ttl", args: []string{"--set", "leases.renew_deadline=15s"}, key: "leases.renew_deadline", reason: "must be less than leases.ttl"},
		{name: "renew_deadline not above renew_interval", args: []string{"--set", "leases.renew_deadline=5s"}, key: "leases.renew_deadline", reason: "must be greater than leases.renew_interval"},
		{name: "database url scheme", env: []string{"APPVIEW_DATABASE_URL=postgres://db.example/appview"}, key: "database.url", reason: "scheme must be one of"},
		{name: "in-memory database", args: []string{"--set", "database.url=:memory:"}, key: "database.url", reason: "in-memory database is private"},
		{name: "file url naming another host", env: []string{"APPVIEW_DATABASE_URL=file://db.example/appview.db"}, key: "database.url", reason: `host "db.example"`},
		{name: "jetstream url scheme", args: []string{"--set", "jetstream.urls=https://jetstream.example/subscribe"}, key: "jetstream.urls", reason: "scheme must be one of ws, wss"},
		{name: "labeler url scheme", args: []string{"--set", "labeler.url=ftp://labeler.example"}, key: "labeler.url", reason: "scheme must be one of"},
		{name: "negative duration", args: []string{"--set", "shutdown_timeout=-5s"}, key: "shutdown_timeout", reason: "must be positive"},
		{name: "negative count", args: []string{"--set", "backfill.concurrency=-2"}, key: "backfill.concurrency", reason: "at least 1"},
		{name: "negative chunk size", args: []string{"--set", "cleanup.chunk_rows=-1"}, key: "cleanup.chunk_rows", reason: "at least 1"},
		{name: "negative retry delay", env: []string{"APPVIEW_WEBHOOKS_RETRY_SCHEDULE=0s,-30s"}, key: "webhooks.retry_schedule", reason: "must not be negative"},
		{name: "bad value from the environment", env: []string{"APPVIEW_LEASES_TTL=15"}, key: "leases.ttl", reason: "(from APPVIEW_LEASES_TTL)"},
		{name: "unknown key in --set", args: []string{"--set", "leases.tll=15s"}, key: "leases.tll", reason: "unknown key"},
		{name: "instance id with a newline", env: []string{"APPVIEW_INSTANCE_ID=web-1\nweb-2"}, key: "instance_id", reason: `"web-1\nweb-2" has a whitespace, control or invisible character`},
		{name: "advertise url with port 0", args: []string{"--set", "admin.advertise_url=http://10.0.0.5:0"}, key: "admin.advertise_url", reason: "port 0 is not in 1..65535"},
		{name: "missing config file", args: []string{"--config", "nowhere.yaml"}, key: "--config", reason: "no such file or directory"},
		{
			name: "database path under a file", key: "database.url", reason: "not a directory",
			setup: func(t *testing.T, dir string) []string {
				writeTestFile(t, filepath.Join(dir, "data"), "not a directory\n")
				return nil // the default file:./data/appview.db
			},
		},
		{
			name: "database path is a directory", key: "database.url", reason: "cannot open file:db",
			setup: func(t *testing.T, dir string) []string {
				mkdir(t, filepath.Join(dir, "db"))
				return []string{"--set", "database.url=file:db"}
			},
		},
		{
			// SQLite refused a FIFO or a device only after creating
			// PATH-journal beside it (/dev/null-journal for file:/dev/null).
			name: "database path is a FIFO", key: "database.url", reason: "database file db.fifo is a FIFO, not a regular file",
			setup: func(t *testing.T, dir string) []string {
				if err := syscall.Mkfifo(filepath.Join(dir, "db.fifo"), 0o600); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					for _, side := range []string{"-journal", "-wal", "-shm"} {
						if _, err := os.Stat(filepath.Join(dir, "db.fifo"+side)); err == nil {
							t.Errorf("the refusal left db.fifo%s behind", side)
						}
					}
				})
				return []string{"--set", "database.url=file:db.fifo"}
			},
		},
		{
			// A refusal made after the configuration loaded (the database
			// would not open) still says where the value came from.
			name: "unopenable database named in the environment", key: "database.url", reason: "(from APPVIEW_DATABASE_URL)",
			env: []string{"APPVIEW_DATABASE_URL=file:db"},
			setup: func(t *testing.T, dir string) []string {
				mkdir(t, filepath.Join(dir, "db"))
				return nil
			},
		},
		{
			name: "database file is not a database", key: "database.url", reason: "not an SQLite database (SQLite: file is not a database)",
			setup: func(t *testing.T, dir string) []string {
				writeTestFile(t, filepath.Join(dir, "appview.db"), strings.Repeat("not a database, just text\n", 200))
				return []string{"--set", "database.url=file:appview.db"}
			},
		},
		{
			// Root ignores directory permissions, so an unwritable database
			// is made the way root cannot undo: its write-ahead log cannot
			// be created because a directory has the log's name.
			name: "database cannot be written", key: "database.url", reason: "cannot open file:appview.db",
			setup: func(t *testing.T, dir string) []string {
				mkdir(t, filepath.Join(dir, "appview.db-wal"))
				return []string{"--set", "database.url=file:appview.db"}
			},
		},
		{
			// A newer appview applied a breaking migration (docs/operations.md,
			// "Rolling upgrades and rollbacks"): this one must not run on
			// the schema, nor write to it.
			name: "database past a breaking migration this binary does not know", key: "database.url",
			reason: "the database needs a newer appview: its schema is at version 999",
			setup: func(t *testing.T, dir string) []string {
				db := testsupport.OpenUnmigrated(t, filepath.Join(dir, "appview.db"))
				if _, err := db.Migrate(context.Background()); err != nil {
					t.Fatal(err)
				}
				for _, q := range []string{
					`INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'split_everything', 0)`,
					`INSERT INTO schema_compat (id, min_version, migration, why) VALUES (1, 999, '0999_split_everything', 'tags moved')`,
				} {
					if _, err := db.Exec(q); err != nil {
						t.Fatal(err)
					}
				}
				return []string{"--set", "database.url=file:appview.db"}
			},
		},
		{
			// A server that answers, and says the token is wrong: retrying
			// would not change it (a server not up yet exits 1 instead:
			// TestAStartOnADatabaseUnavailableForNowExitsOneToBeRestarted).
			name: "sqld url refusing the token", key: "database.auth_token", reason: "the server refused database.auth_token: HTTP status=401",
			setup: func(t *testing.T, dir string) []string {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					http.Error(w, "unauthorized", http.StatusUnauthorized)
				}))
				t.Cleanup(srv.Close)
				return []string{"--set", "database.url=" + srv.URL, "--set", "database.auth_token=expired"}
			},
		},
		{
			// Another HTTP server (an admin port, a wrong path).
			name: "url of a server that is not sqld", key: "database.url", reason: "not a libSQL server (a wrong host, port or path?): HTTP status=404",
			setup: func(t *testing.T, dir string) []string {
				srv := httptest.NewServer(http.NotFoundHandler())
				t.Cleanup(srv.Close)
				return []string{"--set", "database.url=" + srv.URL}
			},
		},
		{
			name: "admin port in use", key: "admin.addr", reason: "(is another appview running?): address already in use (from --set)",
			setup: func(t *testing.T, dir string) []string {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ln.Close() })
				return []string{"--set", "admin.addr=" + ln.Addr().String()}
			},
		},
		{
			// An admin port others can reach needs a token.
			name: "non-loopback admin address without a token", key: "admin.token", reason: "not a loopback address",
			args: []string{"--set", "admin.addr=0.0.0.0:0"},
		},
		{
			name: "admin token file missing", key: "admin.token_file", reason: "no such file",
			args: []string{"--set", "admin.token_file=/nonexistent/appview-token"},
		},
	}
}

// TestAStartOnADatabaseUnavailableForNowExitsOneToBeRestarted: a database
// that is not up yet (a host that boots before sqld) or whose write lock
// a backup holds past busy_timeout is no configuration error. The start
// fails with one line naming database.url and saying it is transient,
// and exit 1, which deploy/appview.service restarts (exit 2 it does not).
func TestAStartOnADatabaseUnavailableForNowExitsOneToBeRestarted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		args   []string
		setup  func(t *testing.T, dir string) []string
		reason string
	}{
		{
			name: "serve, sqld not listening yet", args: []string{"serve"}, reason: "Connection refused",
			setup: func(t *testing.T, dir string) []string {
				return []string{"--set", "database.url=http://127.0.0.1:" + strconv.Itoa(freePort(t))}
			},
		},
		{
			name: "leases, sqld not listening yet", args: []string{"leases"}, reason: "Connection refused",
			setup: func(t *testing.T, dir string) []string {
				return []string{"--set", "database.url=http://127.0.0.1:" + strconv.Itoa(freePort(t))}
			},
		},
		{
			name: "serve, write lock held past busy_timeout", args: []string{"serve"}, reason: "database is locked",
			setup: func(t *testing.T, dir string) []string {
				db, _ := migratedWithLease(t, filepath.Join(dir, "appview.db"))
				holdWriteLock(t, db)
				return []string{"--set", "database.url=file:appview.db", "--set", "database.busy_timeout=200ms"}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			args := append(append([]string{}, tc.args...), tc.setup(t, dir)...)
			r := runAppview(t, dir, childEnv("APPVIEW_ADMIN_ADDR=127.0.0.1:0"), args...)
			if r.code != cli.ExitFailure {
				t.Errorf("exit code %d, want %d (restartable, not a refusal)", r.code, cli.ExitFailure)
			}
			line, ok := strings.CutSuffix(r.stderr, "\n")
			const prefix = "appview: database.url: unavailable for now, transient (exit 1: try again; a service manager restarts serve): "
			if !ok || strings.Contains(line, "\n") || !strings.HasPrefix(line, prefix) || !strings.Contains(line, tc.reason) {
				t.Fatalf("stderr = %q, want one line %q... containing %q", r.stderr, prefix, tc.reason)
			}
			assertNoDriverWords(t, line)
		})
	}
}

func writeTestFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestServeRefusesBadConfigurationWithExitCode2AndOneLineNamingTheKey(t *testing.T) {
	t.Parallel()
	for _, tc := range refusals() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			args := []string{"serve"}
			if tc.yaml != "" {
				writeTestFile(t, filepath.Join(dir, "appview.yaml"), tc.yaml)
				args = append(args, "--config", "appview.yaml")
			}
			if tc.setup != nil {
				args = append(args, tc.setup(t, dir)...)
			}
			args = append(args, tc.args...)
			// Port 0 unless the case is about the admin address: nothing
			// here may take 5001, and a case that wrongly starts must not
			// collide with another.
			env := childEnv(append([]string{"APPVIEW_ADMIN_ADDR=127.0.0.1:0"}, tc.env...)...)
			r := runAppview(t, dir, env, args...)
			assertRefusal(t, r, tc.key, tc.reason)
		})
	}
}

// assertRefusal checks exit code 2 and exactly one stderr line of the form
// "appview: config: KEY: REASON".
func assertRefusal(t *testing.T, r result, key, reason string) {
	t.Helper()
	if r.code != cli.ExitConfig {
		t.Errorf("exit code %d, want %d", r.code, cli.ExitConfig)
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Fatalf("stderr has %d lines, want exactly one:\n%s", len(lines), r.stderr)
	}
	prefix := "appview: config: " + key + ": "
	if !strings.HasPrefix(lines[0], prefix) || !strings.Contains(lines[0], reason) {
		t.Fatalf("stderr = %q, want %q... containing %q", lines[0], prefix, reason)
	}
	assertNoDriverWords(t, lines[0])
}

// assertNoDriverWords fails when a refusal's line carries the database
// driver's own words (its statement, codes and nesting), which belong
// in the debug line (TestARefusalsDriverDetailIsADebugLine).
func assertNoDriverWords(t *testing.T, line string) {
	t.Helper()
	for _, driver := range []string{"error code =", "failed to connect to database", "failed to execute query", "Unable to connect", "Hrana: `", "(os error"} {
		if strings.Contains(line, driver) {
			t.Errorf("the refusal %q carries the driver's words %q", line, driver)
		}
	}
}

// What the driver said behind a refused database is one debug line
// before the refusal, at log_level debug only.
func TestARefusalsDriverDetailIsADebugLine(t *testing.T) {
	dir := t.TempDir()
	mkdir(t, filepath.Join(dir, "appview.db-wal")) // the log cannot be created: SQLite's disk I/O error
	r := runAppview(t, dir, childEnv("APPVIEW_ADMIN_ADDR=127.0.0.1:0", "APPVIEW_LOG_LEVEL=debug"), "serve", "--set", "database.url=file:appview.db")
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	var debug struct{ Level, Event, Detail string }
	if r.code != cli.ExitConfig || len(lines) < 2 || json.Unmarshal([]byte(lines[len(lines)-2]), &debug) != nil ||
		debug.Level != "debug" || debug.Event != "start.refused" || !strings.Contains(debug.Detail, "error code =") {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit 2, a debug line start.refused with the driver's words, then the refusal", r.code, r.stderr)
	}
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "appview: config: database.url: cannot open file:appview.db: ") {
		t.Errorf("last line %q, want the refusal", last)
	}
	assertNoDriverWords(t, last)
}

// assertFlagRefusal checks that r is a refusal before anything ran
// about flag, which is no configuration key: exit 2 and one line
// "appview: FLAG: ..." containing reason (no "config:").
func assertFlagRefusal(t *testing.T, r result, flag, reason string) {
	t.Helper()
	if r.code != cli.ExitConfig {
		t.Errorf("exit code %d, want %d", r.code, cli.ExitConfig)
	}
	line, ok := strings.CutSuffix(r.stderr, "\n")
	if prefix := "appview: " + flag + ": "; !ok || strings.Contains(line, "\n") || !strings.HasPrefix(line, prefix) || !strings.Contains(line, reason) {
		t.Fatalf("stderr = %q, want one line %q... containing %q", r.stderr, prefix, reason)
	}
}

// A port in use is refused before the database is opened: the refused
// start creates no database (README: refused before anything starts).
func TestABusyAdminPortIsRefusedBeforeTheDatabaseIsCreated(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	r := runAppview(t, dir, childEnv("APPVIEW_ADMIN_ADDR="+ln.Addr().String()), "serve")
	assertRefusal(t, r, "admin.addr", "cannot listen on "+ln.Addr().String()+" (is another appview running?): address already in use (from APPVIEW_ADMIN_ADDR)")
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Errorf("the refused start created ./data, the default database's directory (stat: %v)", err)
	}
}

func TestLeasesRefusesBadConfigurationLikeServe(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := runAppview(t, dir, childEnv("APPVIEW_LEASES_TTL=1s"), "leases")
	assertRefusal(t, r, "leases.renew_interval", "must be less than half of leases.ttl")
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Errorf("a refused configuration still created ./data (stat: %v)", err)
	}
}

func TestConfigInitOutputLoadsToTheDefaultsAndServeAcceptsIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := runAppview(t, dir, childEnv(), "config", "init")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("config init: code %d, stderr %q", r.code, r.stderr)
	}
	sample := config.SampleFor(workerKeys()) // config.Sample and the sections of registered workers
	if r.stdout != sample {
		t.Fatalf("config init printed something other than config.Sample")
	}
	r = runAppview(t, dir, childEnv(), "config", "init", "appview.yaml")
	if r.code != 0 {
		t.Fatalf("config init appview.yaml: code %d, stderr %q", r.code, r.stderr)
	}
	written, err := os.ReadFile(filepath.Join(dir, "appview.yaml"))
	if err != nil || string(written) != sample {
		t.Fatalf("config init FILE wrote something other than config.Sample (read: %v)", err)
	}
	// Over an existing file: refused (exit 2, one line), the file kept.
	if err := os.WriteFile(filepath.Join(dir, "mine.yaml"), []byte("log_level: debug\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = runAppview(t, dir, childEnv(), "config", "init", "mine.yaml")
	if kept, _ := os.ReadFile(filepath.Join(dir, "mine.yaml")); r.code != cli.ExitConfig || !strings.Contains(r.stderr, "--force") || string(kept) != "log_level: debug\n" {
		t.Fatalf("config init over an existing file: code %d, stderr %q, file now %q; want exit %d naming --force, the file kept",
			r.code, r.stderr, kept, cli.ExitConfig)
	}
	// "-" is standard output, not a file named "-".
	r = runAppview(t, dir, childEnv(), "config", "init", "-")
	if _, err := os.Stat(filepath.Join(dir, "-")); r.code != 0 || r.stdout != sample || err == nil {
		t.Fatalf("config init -: code %d, stdout of %d bytes, a file named - (stat: %v)", r.code, len(r.stdout), err)
	}
	cfg, err := config.Load(config.Sources{File: filepath.Join(dir, "appview.yaml"), Workers: workerKeys()})
	if err != nil {
		t.Fatalf("load the written file: %v", err)
	}
	cfg.InstanceID = ""
	defaults, _ := config.Load(config.Sources{Workers: workerKeys()})
	defaults.InstanceID = ""
	if !reflect.DeepEqual(cfg, defaults) {
		t.Fatalf("the written file loads to\n%+v\nwant config.Default() with the registered workers' sections\n%+v", cfg, defaults)
	}
	if len(workerKeys()) == 0 && !reflect.DeepEqual(cfg, config.Default()) {
		t.Fatalf("the written file loads to\n%+v\nwant config.Default()\n%+v", cfg, config.Default())
	}

	r = runAppview(t, dir, childEnv(), "config", "init", "appview.yaml")
	if r.code != cli.ExitConfig || !strings.HasPrefix(r.stderr, "appview: appview.yaml exists (use --force to overwrite)") {
		t.Fatalf("config init over an existing file: code %d, stderr %q; want 2 (refused, nothing written) and a hint to use --force", r.code, r.stderr)
	}
	if r = runAppview(t, dir, childEnv(), "config", "init", "--force", "appview.yaml"); r.code != 0 {
		t.Fatalf("config init --force over an existing file: code %d, stderr %q", r.code, r.stderr)
	}

	// The file as written, unchanged; only the admin address moves to a
	// free port (the lifecycle test is the one test that takes 5001).
	p := startServe(t, dir, childEnv("APPVIEW_ADMIN_ADDR=127.0.0.1:0"), "--config", "appview.yaml")
	base := p.started()
	p.waitFor(startTimeout, "/readyz 200", func() bool { code, _ := get(base + "/readyz"); return code == 200 })
	p.signal(os.Interrupt)
	if code, _ := p.wait(runTimeout); code != 0 {
		t.Fatalf("serve --config (init output): exit %d after SIGINT, want 0", code)
	}
}

func TestConfigInitIntoAMissingDirectorySaysSoWithoutSuggestingForce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := runAppview(t, dir, childEnv(), "config", "init", "nonexistent/appview.yaml")
	if r.code != cli.ExitFailure {
		t.Errorf("exit code %d, want %d", r.code, cli.ExitFailure)
	}
	if !strings.Contains(r.stderr, "no such file or directory") || strings.Contains(r.stderr, "--force") {
		t.Fatalf("stderr = %q, want the missing directory named and no --force hint (it would not help)", r.stderr)
	}
	if r = runAppview(t, dir, childEnv(), "config", "init", "--force", "nonexistent/appview.yaml"); r.code != cli.ExitFailure {
		t.Fatalf("config init --force into a missing directory: exit %d, want %d", r.code, cli.ExitFailure)
	}
}

func TestConfigInitForceReplacesARegularFileAndRefusesAnyOther(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	longer := filepath.Join(dir, "appview.yaml")
	writeTestFile(t, longer, strings.Repeat("# an older, longer file\n", 2000))
	if r := runAppview(t, dir, childEnv(), "config", "init", "--force", "appview.yaml"); r.code != 0 {
		t.Fatalf("config init --force: exit %d, stderr %q", r.code, r.stderr)
	}
	if got, err := os.ReadFile(longer); err != nil || string(got) != config.SampleFor(workerKeys()) {
		t.Fatalf("after --force the file holds %d bytes (err %v), want exactly the sample (%d bytes)", len(got), err, len(config.SampleFor(workerKeys())))
	}

	// A FIFO with no reader: opening it to write used to wait forever.
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"config", "init", "--force", "fifo"}, {"config", "init", "--force", "."},
		{"config", "init", "fifo"}, {"config", "init", "."}} { // without --force: no hint that it would help
		r := runAppview(t, dir, childEnv(), args...)
		if r.code != cli.ExitConfig || !strings.Contains(r.stderr, "is not a regular file") {
			t.Errorf("appview %s: exit %d, stderr %q; want 2 and \"is not a regular file\"", strings.Join(args, " "), r.code, r.stderr)
		}
	}
}

func TestServeTakesTheFileThenTheEnvironmentThenSet(t *testing.T) {
	t.Parallel()
	// Each source sets a ttl too short for the default renew_interval
	// (5s), so the refusal names the ttl that won.
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "appview.yaml"), "leases:\n  ttl: 1s\n")
	env := childEnv("APPVIEW_ADMIN_ADDR=127.0.0.1:0")
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"file", nil, nil, "(5s >= 1s/2)"},
		{"environment over file", []string{"APPVIEW_LEASES_TTL=2s"}, nil, "(5s >= 2s/2)"},
		{"--set over environment", []string{"APPVIEW_LEASES_TTL=2s"}, []string{"--set", "leases.ttl=4s"}, "(5s >= 4s/2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"serve", "--config", "appview.yaml"}, tc.args...)
			r := runAppview(t, dir, append(append([]string{}, env...), tc.env...), args...)
			assertRefusal(t, r, "leases.renew_interval", tc.want)
		})
	}
}
