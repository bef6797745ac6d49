package admin

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/testsupport"
)

// serve starts an admin server on a free loopback port.
func serve(t *testing.T, db *database.DB) *Server {
	t.Helper()
	return serveOn(t, "127.0.0.1:0", db)
}

// bindAndListen starts a server as serve does: Bind, then Listen on the
// listener.
func bindAndListen(addr string, db *database.DB, reg *prometheus.Registry, opts Options) (*Server, error) {
	ln, err := Bind(addr)
	if err != nil {
		return nil, err
	}
	return Listen(ln, db, reg, opts)
}

func serveOn(t *testing.T, addr string, db *database.DB) *Server {
	t.Helper()
	srv, err := bindAndListen(addr, db, prometheus.NewRegistry(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return srv
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestReadyzIsUnavailableUntilMigrationsAreDone(t *testing.T) {
	db := testsupport.OpenUnmigrated(t, filepath.Join(t.TempDir(), "a.db"))
	srv := serve(t, db)
	base := srv.URL("")
	if code, body := get(t, base+"/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Fatalf("/healthz = %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before migrating = %d, want 503", code)
	} else {
		assertOneLine(t, body)
	}
	if _, err := db.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, base+"/readyz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Fatalf("/readyz after migrating = %d %q, want 200 ok", code, body)
	}
	if _, err := db.Exec("DELETE FROM schema_migrations WHERE version = (SELECT MAX(version) FROM schema_migrations)"); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "migrations pending") {
		t.Fatalf("/readyz with a migration missing = %d %q, want 503 migrations pending", code, body)
	}
}

func TestMetricsServeGoRuntimeAndProcessCollectors(t *testing.T) {
	srv := serve(t, testsupport.OpenUnmigrated(t, filepath.Join(t.TempDir(), "a.db")))
	code, body := get(t, srv.URL("")+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	for _, name := range []string{"go_goroutines", "go_memstats_alloc_bytes", "process_resident_memory_bytes"} {
		if !strings.Contains(body, "\n"+name+" ") {
			t.Errorf("/metrics has no %s", name)
		}
	}
}

func TestBindRefusesAnAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := Bind(ln.Addr().String()); err == nil || !strings.Contains(err.Error(), "address already in use") ||
		!strings.Contains(err.Error(), "listen on "+ln.Addr().String()) {
		t.Fatalf("Bind on a taken port = %v, want listen on %s: address already in use", err, ln.Addr())
	}
}

func TestURLPrefersAdvertiseAndNamesAReachableHost(t *testing.T) {
	srv := serveOn(t, "0.0.0.0:0", testsupport.OpenUnmigrated(t, filepath.Join(t.TempDir(), "a.db")))
	_, port, _ := net.SplitHostPort(srv.Addr())
	if got, want := srv.URL(""), "http://localhost:"+port; got != want {
		t.Errorf("URL() on 0.0.0.0 = %s, want %s", got, want)
	}
	if got := srv.URL("http://10.0.0.5:5001"); got != "http://10.0.0.5:5001" {
		t.Errorf("URL(advertise) = %s", got)
	}
}

// assertOneLine fails unless body is one non-empty line ending in "\n": a
// probe's log shows the reason whole (driver errors embed newlines).
func assertOneLine(t *testing.T, body string) {
	t.Helper()
	line, ok := strings.CutSuffix(body, "\n")
	if !ok || line == "" || strings.ContainsAny(line, "\r\n") {
		t.Fatalf("/readyz body is not one line: %q", body)
	}
}

func TestReadyzRunsTheAddedChecksAfterTheDatabase(t *testing.T) {
	db := testsupport.OpenUnmigrated(t, filepath.Join(t.TempDir(), "a.db"))
	if _, err := db.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := serve(t, db)
	var failing atomic.Value
	failing.Store("")
	srv.AddReadyCheck(func() error {
		if msg := failing.Load().(string); msg != "" {
			return errors.New(msg)
		}
		return nil
	})
	if code, body := get(t, srv.URL("")+"/readyz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Fatalf("/readyz with a passing check = %d %q", code, body)
	}
	failing.Store("lease writes failing since 2026-11-29T13:00:00Z: database or disk is full")
	code, body := get(t, srv.URL("")+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "disk is full") {
		t.Fatalf("/readyz with a failing check = %d %q, want 503 naming it", code, body)
	}
	assertOneLine(t, body)
}
