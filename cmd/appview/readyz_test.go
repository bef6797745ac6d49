package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/testsupport"
)

// readyzNoticeBound is how soon /readyz must report a lost or restored
// database (its own check is bounded by 2 s).
const readyzNoticeBound = 5 * time.Second

// Short lease timings, so that an outage outlasts the renew deadline
// within a few seconds and a new grant follows soon after the restart.
var shortLeases = []string{
	"APPVIEW_LEASES_TTL=3s", "APPVIEW_LEASES_RENEW_INTERVAL=1s",
	"APPVIEW_LEASES_RENEW_DEADLINE=2s", "APPVIEW_LEASES_RETRY_INTERVAL=500ms",
}

func TestReadyzFailsWhileSqldIsDownAndTheInstanceRecoversWhenItIsBack(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	env := childEnv(append([]string{"APPVIEW_ADMIN_ADDR=127.0.0.1:0", "APPVIEW_DATABASE_URL=" + srv.URL}, shortLeases...)...)
	p := startServe(t, t.TempDir(), env)
	base := p.started()
	p.waitFor(startTimeout, "/readyz 200", func() bool { code, _ := get(base + "/readyz"); return code == 200 })
	// renew_deadline 2s against a libSQL server: the operator is warned once.
	if n := countRenewDeadlineWarnings(p); n != 1 {
		t.Errorf("%d warnings about renew_deadline against sqld, want 1", n)
	}
	first := p.waitLog(startTimeout, map[string]string{"event": string(lease.LeaseAcquired)})
	held := asString(first["lease"])

	srv.Kill()
	killed := time.Now()
	var body string
	p.waitFor(readyzNoticeBound, "/readyz 503 after sqld was killed", func() bool {
		var code int
		code, body = get(base + "/readyz")
		return code == 503
	})
	t.Logf("/readyz 503 %s after sqld was killed", time.Since(killed).Round(time.Millisecond))
	if !strings.Contains(body, "database") {
		t.Errorf("/readyz body %q does not say the database is the problem", body)
	}
	if line, ok := strings.CutSuffix(body, "\n"); !ok || strings.ContainsAny(line, "\r\n") {
		t.Errorf("/readyz body %q is not one line", body)
	}
	if code, _ := get(base + "/healthz"); code != 200 {
		t.Errorf("/healthz = %d while the database is down; the process is alive", code)
	}
	// Down long enough for the holder to give its lease up: every pooled
	// connection has seen the outage or sat idle through it.
	p.waitLog(startTimeout, map[string]string{"event": string(lease.LeaseLost), "lease": held})

	srv.Restart()
	back := time.Now()
	p.waitFor(readyzNoticeBound, "/readyz 200 after sqld came back", func() bool { code, _ := get(base + "/readyz"); return code == 200 })
	t.Logf("/readyz 200 %s after sqld came back", time.Since(back).Round(time.Millisecond))
	firstFence, _ := first["fence"].(float64)
	p.waitFor(startTimeout, "the lease granted again with a higher fence", func() bool {
		for _, m := range p.logLines() {
			if m["event"] == string(lease.LeaseAcquired) && m["lease"] == held {
				if f, _ := m["fence"].(float64); f > firstFence {
					return true
				}
			}
		}
		return false
	})

	p.signal(syscall.SIGTERM)
	if code, _ := p.wait(readyzNoticeBound); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0", code)
	}
	assertJSONLog(t, p.lines())
}

// countRenewDeadlineWarnings counts the start-up warnings that
// leases.renew_deadline is too short for a libSQL server.
func countRenewDeadlineWarnings(p *proc) int {
	n := 0
	for _, m := range p.logLines() {
		if msg, _ := m["msg"].(string); m["level"] == "warn" && strings.HasPrefix(msg, "leases.renew_deadline is below") {
			n++
		}
	}
	return n
}
