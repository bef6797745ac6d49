package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/database"
)

// A pod of a Service named "appview" and a deploy script's own APPVIEW_*
// variables: serve starts, warns (one JSON line each) about the
// variables that are no key, names the closest key, says nothing about
// the service links, and stops cleanly.
func TestServeStartsInAKubernetesPodWithDeployScriptVariables(t *testing.T) {
	t.Parallel()
	p := startServe(t, t.TempDir(), childEnv(
		"APPVIEW_ADMIN_ADDR=127.0.0.1:0",
		"APPVIEW_PORT=tcp://10.0.0.1:80",
		"APPVIEW_SERVICE_HOST=10.0.0.1",
		"APPVIEW_SERVICE_PORT=80",
		"APPVIEW_PORT_80_TCP=tcp://10.0.0.1:80",
		"APPVIEW_PORT_80_TCP_PROTO=tcp",
		"APPVIEW_PORT_80_TCP_PORT=80",
		"APPVIEW_PORT_80_TCP_ADDR=10.0.0.1",
		"APPVIEW_BIN=/usr/local/bin/appview",
		"APPVIEW_VERSION=1.2.3",
		"APPVIEW_LEASES_TLL=20s",
		"APPVIEW_DATABASE_AUTH_TOKEN=meant-for-sqld", // beside the default file URL
	))
	p.started()
	if m := p.waitLog(runTimeout, map[string]string{"key": "database.auth_token"}); m["level"] != "warn" {
		t.Errorf("the unused token: %v, want a warning", m)
	}
	for name, closest := range map[string]string{
		"APPVIEW_BIN":        "",
		"APPVIEW_VERSION":    "",
		"APPVIEW_LEASES_TLL": "did you mean APPVIEW_LEASES_TTL",
	} {
		found := false
		for _, m := range p.logLines() {
			msg, _ := m["msg"].(string)
			if m["level"] == "warn" && m["event"] == "config.unknown_env" &&
				strings.Contains(msg, name+" is not a config key") && strings.Contains(msg, closest) {
				found = true
			}
		}
		if !found {
			t.Errorf("no warning naming %s (and %q)", name, closest)
		}
	}
	for _, m := range p.logLines() {
		if msg, _ := m["msg"].(string); strings.Contains(msg, "APPVIEW_PORT") || strings.Contains(msg, "APPVIEW_SERVICE") {
			t.Errorf("a service link was logged: %v", m)
		}
	}
	p.signal(syscall.SIGINT)
	if code, _ := p.wait(runTimeout); code != cli.ExitOK {
		t.Fatalf("exit %d, want 0", code)
	}
	assertJSONLog(t, p.lines())
}

// The commands that do not log JSON print the warning as a plain line and
// still do their work; --json output stays clean on stdout.
func TestOtherCommandsWarnOnStderrAndRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	db, err := database.Open(context.Background(), database.Options{URL: "file:" + filepath.Join(dir, "data", "appview.db"), BusyTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	db.Close()
	r := runAppview(t, dir, childEnv("APPVIEW_BIN=/usr/local/bin/appview", "APPVIEW_PORT=tcp://10.0.0.1:80"), "leases", "--json")
	if r.code != cli.ExitOK {
		t.Fatalf("leases: exit %d, stderr %q", r.code, r.stderr)
	}
	// APPVIEW_BIN resembles no key: the line says it is ignored and
	// suggests nothing (internal/config TestSuggestionsOnlyForANearMiss).
	want := "appview: warning: environment variable APPVIEW_BIN is not a config key and is ignored\n"
	if r.stderr != want {
		t.Errorf("stderr = %q, want exactly %q (nothing about the service link)", r.stderr, want)
	}
	if strings.Contains(r.stdout, "APPVIEW") {
		t.Errorf("the warning reached stdout: %q", r.stdout)
	}
}

// A refusal caused by a mistyped variable (the intended value never
// applied) was printed alone: the warning naming the typo, the likely
// cause, was dropped with the JSON log that never started.
func TestServeRefusingItsConfigurationPrintsTheWarningsFirst(t *testing.T) {
	t.Parallel()
	r := runAppview(t, t.TempDir(), childEnv("APPVIEW_LEASES_TLL=5s", "APPVIEW_LEASES_TTL=1ms"), "serve")
	if r.code != cli.ExitConfig {
		t.Fatalf("exit %d, want %d; stderr %q", r.code, cli.ExitConfig, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "appview: warning: environment variable APPVIEW_LEASES_TLL is not a config key") ||
		!strings.Contains(lines[1], "leases.ttl") {
		t.Fatalf("stderr = %q, want the warning about APPVIEW_LEASES_TLL, then the refusal naming leases.ttl", r.stderr)
	}
}
