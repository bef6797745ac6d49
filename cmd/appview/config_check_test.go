package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/cli"
)

// `config check` refuses every configuration serve refuses before it
// opens anything, with serve's line first: the same code decides.
func TestConfigCheckRefusesWhatServeRefusesWithServesLineFirst(t *testing.T) {
	for _, tc := range refusals() {
		if tc.setup != nil {
			continue // about the world (a database, a port), not the configuration
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			args := []string{"config", "check"}
			if tc.yaml != "" {
				writeTestFile(t, filepath.Join(dir, "appview.yaml"), tc.yaml)
				args = append(args, "appview.yaml")
			}
			args = append(args, tc.args...)
			r := runAppview(t, dir, childEnv(append([]string{"APPVIEW_ADMIN_ADDR=127.0.0.1:0"}, tc.env...)...), args...)
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if r.code != cli.ExitConfig || len(lines) < 2 || r.stdout != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want 2, the problems and a summary on stderr", r.code, r.stdout, r.stderr)
			}
			if prefix := "appview: config: " + tc.key + ": "; !strings.HasPrefix(lines[0], prefix) || !strings.Contains(lines[0], tc.reason) {
				t.Errorf("first line %q, want %q... containing %q", lines[0], prefix, tc.reason)
			}
			if last := lines[len(lines)-1]; !strings.HasSuffix(last, ": serve would refuse to start (exit 2)") {
				t.Errorf("last line %q, want the count of problems", last)
			}
			if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
				t.Errorf("config check created ./data (stat: %v)", err)
			}
		})
	}
}

// Every problem, each naming its key and, for the file, its line; a
// valid configuration is one line on stdout; nothing is opened.
func TestConfigCheckListsEveryProblemOrSaysValidInOneLine(t *testing.T) {
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "bad.yaml"), "log_level: loud\nleases:\n  tll: 15s\n  renew_deadline: 30s\nadmin:\n  addr: 0.0.0.0:5001\n")
	r := runAppview(t, dir, childEnv("APPVIEW_CLEANUP_CHUNK_ROWS=0"), "config", "check", "bad.yaml", "--set", "jetstream.rewnd=1s")
	want := []string{
		"appview: config: leases.tll: unknown key (did you mean leases.ttl?) (line 3)",
		"appview: config: jetstream.rewnd: unknown key (did you mean jetstream.rewind?) (from --set)",
		`appview: config: log_level: want debug, info, warn or error, got "loud" (line 1)`,
		"appview: config: leases.renew_deadline: must be less than leases.ttl (30s >= 15s) (line 4)",
		"appview: config: admin.token: required when admin.addr (0.0.0.0:5001) is not a loopback address: set admin.token or admin.token_file, or admin.allow_unauthenticated: true to serve the admin endpoint to anyone who reaches it (admin.addr at line 6)",
		"appview: config: cleanup.chunk_rows: must be at least 1 (from APPVIEW_CLEANUP_CHUNK_ROWS)",
		"appview: 6 problems: serve would refuse to start (exit 2)",
	}
	if r.code != cli.ExitConfig || r.stderr != strings.Join(want, "\n")+"\n" {
		t.Errorf("exit %d, stderr:\n%s\nwant exit 2 and:\n%s", r.code, r.stderr, strings.Join(want, "\n"))
	}

	writeTestFile(t, filepath.Join(dir, "good.yaml"), "log_level: debug\nleases:\n  ttl: 20s\n")
	r = runAppview(t, dir, childEnv("APPVIEW_ADMIN_ADDR=127.0.0.1:0"), "--config", "good.yaml", "config", "check", "--set", "leases.enabled=true")
	if want := "configuration valid: keys set: 2 from good.yaml, 1 from APPVIEW_* variables, 1 from --set; every other key at its default\n"; r.code != 0 || r.stdout != want || r.stderr != "" {
		t.Errorf("valid: exit %d, stdout %q, stderr %q; want 0 and %q", r.code, r.stdout, r.stderr, want)
	}
	r = runAppview(t, dir, childEnv(), "--config", "good.yaml", "config", "check", "bad.yaml")
	if r.code != cli.ExitConfig || !strings.Contains(r.stderr, "two configuration files (--config good.yaml and bad.yaml): give one") {
		t.Errorf("FILE and --config: exit %d, stderr %q; want a usage error", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Errorf("config check created ./data (stat: %v)", err)
	}
}

// `config show` prints the configuration in effect with each value's
// source, and never a secret, from the file or the environment.
func TestConfigShowGivesSourcesAndMasksSecrets(t *testing.T) {
	dir := t.TempDir()
	const token, stripe = "file-token-0123456789abcdef", "sk_live_from_the_environment"
	writeTestFile(t, filepath.Join(dir, "appview.yaml"), "admin:\n  addr: 0.0.0.0:5001\n  token: "+token+"\n")
	r := runAppview(t, dir, childEnv("APPVIEW_BILLING_STRIPE_SECRET_KEY="+stripe, "APPVIEW_BILLING_ENABLED=true"),
		"config", "show", "appview.yaml", "--set", "leases.ttl=20s")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if strings.Contains(r.stdout, token) || strings.Contains(r.stdout, stripe) {
		t.Fatalf("config show printed a secret:\n%s", r.stdout)
	}
	for _, line := range []string{
		`  addr: "0.0.0.0:5001"          # appview.yaml:2`,
		`  token: "********"             # appview.yaml:3`,
		`  stripe_secret_key: "********" # APPVIEW_BILLING_STRIPE_SECRET_KEY`,
		`  enabled: true                 # APPVIEW_BILLING_ENABLED`,
		`  ttl: 20s                      # --set`,
		`  renew_interval: 5s            # default`,
	} {
		if !strings.Contains(r.stdout, line+"\n") {
			t.Errorf("config show lacks %q:\n%s", line, r.stdout)
		}
	}
	// An invalid configuration is not shown: its problems are, as by check.
	r = runAppview(t, dir, childEnv(), "config", "show", "--set", "leases.ttl=1ms")
	if r.code != cli.ExitConfig || r.stdout != "" || !strings.HasPrefix(r.stderr, "appview: config: leases.ttl: must be at least 500ms") {
		t.Errorf("invalid: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}
