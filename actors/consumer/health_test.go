package consumer

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/workers"
)

// Every re-evaluation of the consumer's health sets it, but only a change
// is logged: once at warn, with the reason, the host, the wire and the
// last error, when it becomes unhealthy, and once at info when events
// arrive again; the retries in between log nothing. Where it reads from
// is kept for the status page.
func TestTheConsumerLogsEachChangeOfHealthOnceWithTheReasonAndTheHost(t *testing.T) {
	var buf bytes.Buffer
	h := &workers.Health{}
	c := &consumer{o: Options{Health: h}, log: zerolog.New(&buf)}
	const url = "ws://127.0.0.1:1/subscribe"
	down := jetstream.Upstream{URL: url, Wire: jetstream.WireLegacy, State: jetstream.StateBackoff, LastError: "dial tcp 127.0.0.1:1: connect: connection refused"}
	start := time.Now().Add(-12 * time.Second)
	for range 5 { // five retries, every host down for 12 s, unhealthy after 3 s
		c.checkHealth(down, start, 3*time.Second)
	}
	if ok, _, reason := h.Status(); ok || !strings.HasPrefix(reason, "no event from any host for 12s") {
		t.Fatalf("health ok=%v reason %q; want unhealthy, no event for 12s", ok, reason)
	}
	if src := h.Source(); src.URL != url || src.Wire != "legacy" || src.State != "backoff" || src.LastError == "" {
		t.Errorf("source %+v; want the URL, wire, state and last error the client reported", src)
	}
	up := jetstream.Upstream{URL: url, Wire: jetstream.WireLegacy, State: jetstream.StateConnected, LastEvent: time.Now()}
	for range 3 {
		c.checkHealth(up, start, 3*time.Second)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 2 {
		t.Fatalf("%d log lines, want one per change (2):\n%s", len(lines), buf.String())
	}
	if w := lines[0]; w["level"] != "warn" || !strings.HasPrefix(w["reason"].(string), "no event from any host for 12s") ||
		w["url"] != url || w["wire"] != "legacy" || !strings.Contains(w["last_error"].(string), "connection refused") {
		t.Errorf("first line %v; want a warn with the reason, url, wire and last error", w)
	}
	if i := lines[1]; i["level"] != "info" || !strings.Contains(i["message"].(string), "healthy again") {
		t.Errorf("second line %v; want info, healthy again", i)
	}
}
