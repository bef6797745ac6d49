package main

import (
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/cli"
)

// getAuth is get with "Authorization: Bearer token" ("" sends none).
func getAuth(url, token string) (int, string) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestServeWithATokenFileGuardsDebugAndPprofAndExportsBuildInfo runs the
// real binary with admin.token_file and admin.pprof: probes stay open, /debug/* and /debug/pprof/ need the token,
// /metrics carries appview_build_info and the refusal counter.
func TestServeWithATokenFileGuardsDebugAndPprofAndExportsBuildInfo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const token = "serve-test-token-0123456789"
	writeTestFile(t, dir+"/token", token+"\n")
	p := startServe(t, dir, childEnv("APPVIEW_ADMIN_ADDR=127.0.0.1:0", "APPVIEW_ADMIN_TOKEN_FILE=token", "APPVIEW_ADMIN_PPROF=true",
		"APPVIEW_BACKFILL_ENABLED=false"))
	base := p.started()
	p.waitFor(startTimeout, "/readyz 200", func() bool { code, _ := get(base + "/readyz"); return code == 200 })
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/healthz", "", 200},
		{"/metrics", "", 200},
		{"/debug/leases", "", 401},
		{"/debug/leases", "wrong-token-0123456789", 401},
		{"/debug/leases", token, 200},
		{"/debug/pprof/", "", 401},
		{"/debug/pprof/", token, 200},
		{"/", "", 401}, // the status page
		{"/", token, 200},
		{"/debug/backfill", "", 401},
		{"/debug/backfill", token, 200},
		{"/no-such-page", token, 404},
	} {
		if code, body := getAuth(base+tc.path, tc.token); code != tc.want {
			t.Errorf("GET %s (token %q) = %d %.100q, want %d", tc.path, tc.token, code, body, tc.want)
		}
	}
	_, metrics := get(base + "/metrics")
	if !strings.Contains(metrics, `goversion="`+runtime.Version()+`"`) || !strings.Contains(metrics, "appview_build_info{") {
		t.Errorf("/metrics has no appview_build_info with goversion %s", runtime.Version())
	}
	if !strings.Contains(metrics, `appview_admin_auth_failures_total{reason="missing"} 4`) ||
		!strings.Contains(metrics, `appview_admin_auth_failures_total{reason="wrong"} 1`) {
		t.Errorf("/metrics does not count the refusals:\n%s", grepLines(metrics, "appview_admin_auth_failures_total"))
	}
	// The container HEALTHCHECK: the same configuration, probed from the
	// admin address the instance logged.
	addr := strings.TrimPrefix(base, "http://")
	if r := runAppview(t, dir, childEnv("APPVIEW_ADMIN_ADDR="+addr, "APPVIEW_ADMIN_TOKEN_FILE=token"), "healthcheck"); r.code != 0 || !strings.HasSuffix(r.stdout, "/readyz: ok\n") {
		t.Errorf("healthcheck: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r := runAppview(t, dir, childEnv(), "healthcheck", "--url", "http://127.0.0.1:1/readyz")
	if r.code != cli.ExitFailure || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("healthcheck of a closed port: exit %d, stderr %q; want 1 and one line", r.code, r.stderr)
	}
	for _, line := range p.logLines() {
		if line["level"] == "error" {
			t.Errorf("logged at error level: %v", line)
		}
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
