package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStatusPageInHeadlessChromiumShowsAnUnhealthyConsumerAndAFailingBackfill
// runs one instance whose only Jetstream host refuses every connection,
// unhealthy after 1 s, and whose relay refuses every listing, and loads
// its status page in headless Chromium: the consumer's row must say
// unhealthy, why, the host and wire it tries, that no event came and the
// last error; the backfill must show as failing with its last error. The
// log says each once. The screenshot is written to
// APPVIEW_UNHEALTHY_SCREENSHOT when set.
func TestStatusPageInHeadlessChromiumShowsAnUnhealthyConsumerAndAFailingBackfill(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"error":"Forbidden","message":"this relay is closed"}`))
	}))
	t.Cleanup(relay.Close)
	dir := t.TempDir()
	p := startServe(t, dir, childEnv("APPVIEW_INSTANCE_ID=status-u", "APPVIEW_DATABASE_URL=file:"+filepath.Join(dir, "u.db"),
		"APPVIEW_ADMIN_ADDR=127.0.0.1:0", "APPVIEW_JETSTREAM_URLS=ws://127.0.0.1:1/subscribe", "APPVIEW_JETSTREAM_UNHEALTHY_AFTER=1s",
		"APPVIEW_BACKFILL_RELAY_ENDPOINTS="+relay.URL, "APPVIEW_IDENTITY_PLC_URL=http://127.0.0.1:9"))
	base := p.started()
	p.waitFor(startTimeout, "the page to show the consumer unhealthy and the backfill failing", func() bool {
		_, page := get(base + "/")
		return strings.Contains(page, `<span class="unhealthy">unhealthy</span>`) && strings.Contains(page, "(failing,")
	})
	dom := headless(t, bin, base+"/", "--dump-dom")
	for _, want := range []string{
		`consumer <span class="unhealthy">unhealthy</span>: <span id="consumer-reason">no event from any host for `,
		`<code id="consumer-url">ws://127.0.0.1:1/subscribe</code> (legacy wire, `,
		"last event none yet",
		"last error: dial ", "connection refused",
		`<p id="jetstream" class="muted">no position committed yet</p>`,
		`<p id="backfill">run 1 (failing, <code>status-u</code>)`,
		`<span id="backfill-error" class="problem">1 failed attempt, the last `, "could not be listed", "this relay is closed",
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the rendered page lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("page:\n%s", dom)
	}
	shot := filepath.Join(t.TempDir(), "unhealthy.png")
	if out := os.Getenv("APPVIEW_UNHEALTHY_SCREENSHOT"); out != "" {
		shot = out
	}
	headless(t, bin, base+"/", "--screenshot="+shot, "--hide-scrollbars")
	if png, err := os.ReadFile(shot); err != nil || len(png) < 1000 || string(png[1:4]) != "PNG" {
		t.Fatalf("screenshot %s: %d bytes, %v", shot, len(png), err)
	}
	// Each is said once, however many retries there were meanwhile.
	p.waitFor(startTimeout, "a few more retries", func() bool {
		_, metrics := get(base + "/metrics")
		for _, line := range strings.Split(metrics, "\n") {
			if v, ok := strings.CutPrefix(line, `appview_jetstream_reconnects_total{reason="dial"} `); ok {
				n, err := strconv.Atoi(v)
				return err == nil && n >= 4
			}
		}
		return false
	})
	for msg, want := range map[string]string{
		"jetstream connection lost": "warn", // the first; the retries after it at debug
		"Jetstream consumer unhealthy: every host unreachable or silent (says so again only when events arrive)": "warn",
		"backfill run failing; it is attempted again later, and this is said again only when a run completes":    "warn",
	} {
		n := 0
		for _, m := range p.logLines() {
			if m["msg"] == msg {
				n++
				if m["level"] != want {
					t.Errorf("%q logged at %v, want %s", msg, m["level"], want)
				}
			}
		}
		if n != 1 {
			t.Errorf("%q logged %d times, want once", msg, n)
		}
	}
	p.signal(os.Interrupt)
	if code, _ := p.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
