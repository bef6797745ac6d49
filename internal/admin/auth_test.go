package admin

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const testToken = "0123456789abcdef-test"

// serveGuarded starts an admin server with opts and a protected probe
// endpoint at /debug/probe and /lease/nudge, as serve registers them.
func serveGuarded(t *testing.T, opts Options) (*Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	srv, err := bindAndListen("127.0.0.1:0", testsupport.OpenUnmigrated(t, filepath.Join(t.TempDir(), "a.db")), reg, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Mux.HandleFunc("GET /debug/probe", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "secret view\n") })
	srv.Mux.HandleFunc("POST /lease/nudge", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return srv, reg
}

func do(t *testing.T, method, url string, header map[string][]string, body io.Reader) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func auth(v ...string) map[string][]string { return map[string][]string{"Authorization": v} }

func TestTokenProtectsNudgeAndDebugButNotProbes(t *testing.T) {
	srv, reg := serveGuarded(t, Options{Token: testToken})
	base := srv.URL("")
	for _, tc := range []struct {
		name, method, path string
		header             map[string][]string
		want               int
		reason             string // counted refusal reason
	}{
		{"healthz open", "GET", "/healthz", nil, 200, ""},
		{"readyz open (503 only because unmigrated)", "GET", "/readyz", nil, 503, ""},
		{"metrics open by default", "GET", "/metrics", nil, 200, ""},
		{"debug without token", "GET", "/debug/probe", nil, 401, reasonMissing},
		{"nudge without token", "POST", "/lease/nudge?lease=x", nil, 401, reasonMissing},
		{"nudge with wrong token", "POST", "/lease/nudge?lease=x", auth("Bearer wrong-token-0123456789"), 401, reasonWrong},
		{"wrong token of another length", "GET", "/debug/probe", auth("Bearer x"), 401, reasonWrong},
		{"basic scheme", "GET", "/debug/probe", auth("Basic dXNlcjpwYXNz"), 401, reasonMalformed},
		{"bearer without token", "GET", "/debug/probe", auth("Bearer"), 401, reasonMalformed},
		{"bearer with empty token", "GET", "/debug/probe", auth("Bearer "), 401, reasonMalformed},
		{"token with inner space", "GET", "/debug/probe", auth("Bearer " + testToken + " extra"), 401, reasonMalformed},
		{"two authorization headers", "GET", "/debug/probe", auth("Bearer "+testToken, "Bearer "+testToken), 401, reasonMalformed},
		{"right token", "GET", "/debug/probe", auth("Bearer " + testToken), 200, ""},
		{"scheme is case-insensitive", "GET", "/debug/probe", auth("bearer " + testToken), 200, ""},
		{"nudge with right token", "POST", "/lease/nudge?lease=x", auth("Bearer " + testToken), 204, ""},
		{"unknown path without token", "GET", "/nope", nil, 401, reasonMissing},
		{"unknown path with token", "GET", "/nope", auth("Bearer " + testToken), 404, ""},
		{"pprof is off by default", "GET", "/debug/pprof/", auth("Bearer " + testToken), 404, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := map[string]float64{}
			for _, r := range []string{reasonMissing, reasonMalformed, reasonWrong} {
				before[r] = failureCount(t, reg, r)
			}
			code, h, body := do(t, tc.method, base+tc.path, tc.header, nil)
			if code != tc.want {
				t.Fatalf("%s %s = %d %q, want %d", tc.method, tc.path, code, body, tc.want)
			}
			for _, r := range []string{reasonMissing, reasonMalformed, reasonWrong} {
				want := before[r]
				if r == tc.reason {
					want++
				}
				if got := failureCount(t, reg, r); got != want {
					t.Errorf("failures{reason=%s} = %v, want %v", r, got, want)
				}
			}
			if code == 401 {
				if h.Get("WWW-Authenticate") == "" {
					t.Error("401 without a WWW-Authenticate challenge")
				}
				if strings.Contains(body, testToken) || strings.Count(body, "\n") != 1 {
					t.Errorf("401 body %q: want one line, never the token", body)
				}
			}
		})
	}
}

func failureCount(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "appview_admin_auth_failures_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no appview_admin_auth_failures_total{reason=%q}", reason)
	return 0
}

func TestProtectMetricsPutsMetricsBehindTheToken(t *testing.T) {
	srv, _ := serveGuarded(t, Options{Token: testToken, ProtectMetrics: true})
	if code, _, _ := do(t, "GET", srv.URL("")+"/metrics", nil, nil); code != 401 {
		t.Fatalf("/metrics without token = %d, want 401", code)
	}
	code, _, body := do(t, "GET", srv.URL("")+"/metrics", auth("Bearer "+testToken), nil)
	if code != 200 || !strings.Contains(body, "appview_admin_auth_failures_total") {
		t.Fatalf("/metrics with token = %d, want 200 with the failure counter", code)
	}
	if code, _, _ := do(t, "GET", srv.URL("")+"/healthz", nil, nil); code != 200 {
		t.Fatalf("/healthz = %d, want 200 (always open)", code)
	}
}

func TestWithoutTokenEverythingIsOpen(t *testing.T) {
	srv, _ := serveGuarded(t, Options{})
	if code, _, _ := do(t, "GET", srv.URL("")+"/debug/probe", nil, nil); code != 200 {
		t.Fatalf("/debug/probe with no token configured = %d, want 200", code)
	}
}

func TestOversizedBodiesAndHeadersAreRefusedWith4xx(t *testing.T) {
	srv, _ := serveGuarded(t, Options{Token: testToken})
	base := srv.URL("")
	big := strings.NewReader(strings.Repeat("x", MaxBodyBytes+1))
	// Refused before the token is looked at: no read of an unbounded body.
	code, _, body := do(t, "POST", base+"/lease/nudge?lease=x", auth("Bearer "+testToken), big)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "limit") {
		t.Fatalf("oversized nudge = %d %q, want 413", code, body)
	}
	code, _, _ = do(t, "GET", base+"/healthz", nil, strings.NewReader(strings.Repeat("x", MaxBodyBytes+1)))
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body on an open path = %d, want 413", code)
	}
	code, _, _ = do(t, "GET", base+"/debug/probe", map[string][]string{"Authorization": {"Bearer " + testToken}, "X-Pad": {strings.Repeat("y", 2*MaxHeaderBytes)}}, nil)
	if code != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("oversized headers = %d, want 431", code)
	}
}

// TestChunkedOversizedBodyIsCutOff: a body without Content-Length is
// bounded by MaxBytesReader when a handler reads it.
func TestChunkedOversizedBodyIsCutOff(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv, err := bindAndListen("127.0.0.1:0", testsupport.OpenUnmigrated(t, filepath.Join(t.TempDir(), "a.db")), reg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	srv.Mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		read <- err
		if err != nil {
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		}
	})
	go func() { _ = srv.Serve() }()
	defer srv.Shutdown(context.Background())
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	go func() {
		w := bufio.NewWriter(conn)
		_, _ = io.WriteString(w, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
		chunk := strings.Repeat("z", 4096)
		for i := 0; i < (MaxBodyBytes/4096)+4; i++ {
			_, _ = io.WriteString(w, "1000\r\n"+chunk+"\r\n")
		}
		_ = w.Flush()
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked oversized body = %d, want 413", resp.StatusCode)
	}
	if err := <-read; err == nil {
		t.Fatal("the handler read an unbounded body")
	}
}

func TestBearerHeaderCarriesTheToken(t *testing.T) {
	if BearerHeader("") != nil {
		t.Fatal("an empty token gave a header")
	}
	srv, reg := serveGuarded(t, Options{Token: testToken})
	req, err := http.NewRequest(http.MethodPost, srv.URL("")+"/lease/nudge?lease=x", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = BearerHeader(testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("nudge with BearerHeader = %d, want 204", resp.StatusCode)
	}
	if n := testutil.CollectAndCount(reg, "appview_admin_auth_failures_total"); n != 3 {
		t.Fatalf("failure series = %d, want the 3 reasons pre-created", n)
	}
	if failureCount(t, reg, reasonMissing)+failureCount(t, reg, reasonWrong)+failureCount(t, reg, reasonMalformed) != 0 {
		t.Fatal("a nudge with the token was counted as a failure")
	}
}

func TestPprofIsMountedBehindTheToken(t *testing.T) {
	srv, _ := serveGuarded(t, Options{Token: testToken, Pprof: true})
	if code, _, _ := do(t, "GET", srv.URL("")+"/debug/pprof/", nil, nil); code != 401 {
		t.Fatalf("/debug/pprof/ without token = %d, want 401", code)
	}
	code, _, body := do(t, "GET", srv.URL("")+"/debug/pprof/goroutine?debug=1", auth("Bearer "+testToken), nil)
	if code != 200 || !strings.Contains(body, "goroutine profile") {
		t.Fatalf("/debug/pprof/goroutine with token = %d %.80q", code, body)
	}
}
