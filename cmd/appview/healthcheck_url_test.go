package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// --url names the admin endpoint: its base URL probes /readyz, not the
// status page "/", which answers 200 while the instance is not ready.
// Found from outside: `healthcheck --url http://127.0.0.1:5190` exited 0
// while /readyz answered 503.
func TestHealthcheckURLProbesReadyz(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.URL.RequestURI())
		mu.Unlock()
		switch r.URL.Path {
		case "/":
			_, _ = w.Write([]byte("status page\n"))
		case "/readyz", "/admin/readyz":
			http.Error(w, "not ready: no lease", http.StatusServiceUnavailable)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	for _, c := range []struct{ url, path string }{
		{srv.URL, "/readyz"},
		{srv.URL + "/", "/readyz"},
		{srv.URL + "/readyz", "/readyz"},
		{srv.URL + "/readyz/", "/readyz"},
		{srv.URL + "/admin/", "/admin/readyz"},
		{srv.URL + "/?x=1", "/readyz?x=1"},
	} {
		mu.Lock()
		got = nil
		mu.Unlock()
		r := runAppview(t, t.TempDir(), childEnv(), "healthcheck", "--url", c.url)
		if r.code != 1 || !strings.Contains(r.stderr, "HTTP 503: not ready: no lease") {
			t.Errorf("healthcheck --url %s: exit %d, stderr %q; want 1 and /readyz's 503", c.url, r.code, r.stderr)
		}
		mu.Lock()
		if len(got) != 1 || got[0] != c.path {
			t.Errorf("healthcheck --url %s requested %q, want [%s]", c.url, got, c.path)
		}
		mu.Unlock()
	}
}
