package backfill

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/testsupport"
)

// lockedBuffer is a log destination several goroutines may write to.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the JSON log lines at level warn or above, and the info
// lines whose message starts with prefix.
func (b *lockedBuffer) lines(t *testing.T, prefix string) (loud, info []map[string]any) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		switch m["level"] {
		case "warn", "error":
			loud = append(loud, m)
		case "info":
			if strings.HasPrefix(m["message"].(string), prefix) {
				info = append(info, m)
			}
		}
	}
	return loud, info
}

// A run whose every relay is down fails attempt after attempt: the run
// shows as failing, with its failed attempts and the last error, wherever
// progress is read, and the log says so once (one warning, not a line
// per collection per attempt); the attempt that completes it logs its
// failed attempts at info, and a later run that fails is said again.
func TestAFailingRunShowsAsFailingAndIsLoggedOncePerChange(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	e.pds(1, "did:plc:a")
	relay.Add(colManifest, "did:plc:a")
	relay.Add(colTag, "did:plc:a")
	var down atomic.Bool
	down.Store(true)
	relay.Intercept(func(w http.ResponseWriter, r *http.Request, req testsupport.Request) bool {
		if down.Load() {
			testsupport.XRPCError(w, http.StatusServiceUnavailable, "Unavailable", "maintenance")
			return true
		}
		return false
	})
	var logs lockedBuffer
	o := e.options(relay.URL())
	o.Log = zerolog.New(&logs).Level(zerolog.InfoLevel)
	b := e.backfiller(o)
	c := e.acquire("instance-a")
	ctx := context.Background()
	for range 3 {
		if err := b.Run(ctx, c); err == nil {
			t.Fatal("a run with every relay down completed")
		}
	}
	p, err := ReadProgress(ctx, e.db)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != StateFailing || p.FailedAttempts != 3 || p.LastErrorAt == nil ||
		!strings.Contains(p.LastError, "2 of 2 collections could not be listed") || !strings.Contains(p.LastError, "maintenance") {
		t.Fatalf("progress %+v; want failing, 3 failed attempts, the last error", p)
	}
	loud, _ := logs.lines(t, "")
	if len(loud) != 1 || loud[0]["level"] != "warn" || loud[0]["failed_attempts"] != 1.0 ||
		!strings.Contains(loud[0]["error"].(string), "could not be listed") {
		t.Fatalf("%d warn or error lines %v; want one warning for three failed attempts", len(loud), loud)
	}

	down.Store(false)
	if err := b.Run(ctx, c); err != nil {
		t.Fatal(err)
	}
	if p, err = ReadProgress(ctx, e.db); err != nil || p.State != StateCompleted || p.FailedAttempts != 3 {
		t.Fatalf("progress %+v, %v; want completed, its 3 failed attempts kept", p, err)
	}
	if _, done := logs.lines(t, "backfill run completed"); len(done) != 1 || done[0]["failed_attempts"] != 3.0 {
		t.Fatalf("completed lines %v; want one, with failed_attempts 3", done)
	}

	down.Store(true) // a new run (rerun_after 0), failing again: a change
	if err := b.Run(ctx, c); err == nil {
		t.Fatal("a run with every relay down completed")
	}
	if loud, _ := logs.lines(t, ""); len(loud) != 2 {
		t.Fatalf("%d warn or error lines %v; want a second warning for the new run failing", len(loud), loud)
	}
}
