package backfill

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/atcr-io/appview/internal/testsupport"
)

// cycling answers every page with one item and the next cursor of a cycle
// "" -> c2 -> c1 -> c2 ...: a peer whose cursors never repeat the previous
// one but go round for ever.
func cycling(cursor string) string {
	if cursor == "c2" {
		return "c1"
	}
	return "c2"
}

// A PDS whose listRecords cursors cycle (c2 -> c1 -> c2) was paged for
// ever, every page committed. The repository now fails (class protocol) as
// soon as a cursor comes back, the other repositories are done.
func TestAPDSWhoseCursorsCycleFailsTheRepositoryInsteadOfLooping(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	pds := e.pds(3, "did:plc:good", "did:plc:loop")
	relay.Add(colManifest, "did:plc:good", "did:plc:loop")
	pds.Intercept(func(w http.ResponseWriter, _ *http.Request, req testsupport.Request) bool {
		if req.Method != methodListRecords || req.Repo != "did:plc:loop" || req.Collection != colManifest {
			return false
		}
		rkey := "3k" + req.Cursor
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"cursor": cycling(req.Cursor), "records": []any{map[string]any{
			"uri": "at://did:plc:loop/" + colManifest + "/" + rkey, "cid": "bafyrei" + rkey, "value": map[string]any{"$type": "x"}}}})
		return true
	})
	if err := e.backfiller(e.options(relay.URL())).Run(context.Background(), e.acquire("instance-a")); err != nil {
		t.Fatal(err)
	}
	if got := cursors(pds.Requests(), "did:plc:loop", colManifest); !equal(got, []string{"", "c2", "c1"}) {
		t.Fatalf("looping repository paged with cursors %q, want [\"\" c2 c1]", got)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_repos WHERE did = 'did:plc:loop' AND collection = ?1 AND state = 'failed'`, colManifest); n != 1 {
		t.Errorf("looping repository not failed")
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_repos WHERE did = 'did:plc:good' AND collection = ?1 AND state = 'done'`, colManifest); n != 1 {
		t.Errorf("the good repository's manifests not done")
	}
	if got := testutil.ToFloat64(e.metrics.Errors.WithLabelValues(classProtocol)); got != 1 {
		t.Errorf("%v protocol errors, want 1", got)
	}
}

// The relay's listing is bounded the same way: a cycle of relay cursors
// ends that relay's walk with a protocol error instead of looping.
func TestARelayWhoseCursorsCycleIsNotPagedForEver(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	e.pds(1, "did:plc:a")
	relay.Intercept(func(w http.ResponseWriter, _ *http.Request, req testsupport.Request) bool {
		if req.Method != methodListRepos {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"cursor": cycling(req.Cursor), "repos": []any{map[string]any{"did": "did:plc:a"}}})
		return true
	})
	err := e.backfiller(e.options(relay.URL())).Run(context.Background(), e.acquire("instance-a"))
	var relayCursors []string
	for _, req := range relay.Requests() {
		if req.Collection == colManifest {
			relayCursors = append(relayCursors, req.Cursor)
		}
	}
	if !equal(relayCursors, []string{"", "c2", "c1"}) {
		t.Fatalf("relay paged with cursors %q (run: %v), want [\"\" c2 c1]", relayCursors, err)
	}
	if err == nil || !strings.Contains(err.Error(), "already went through") {
		t.Errorf("run: %v, want the relay's cycle named", err)
	}
}

// A resumed checkpoint's cursor counts as seen: a run resuming at c2 stops
// when the peer leads back to c2, and a trail longer than the memory bound
// still catches a short cycle.
func TestACursorTrailCatchesACycleThroughTheResumedCursor(t *testing.T) {
	tr := newCursorTrail("c2")
	if !tr.add("c1") {
		t.Fatal("c1 is new")
	}
	if tr.add("c2") {
		t.Fatal("c2, the resumed cursor, came back and was not caught")
	}
	long := newCursorTrail("")
	for i := range maxCursorsRemembered + 10 {
		if !long.add(strings.Repeat("x", i+1)) {
			t.Fatalf("cursor %d reported as seen", i)
		}
	}
	caught := false
	for range 2 {
		for _, c := range []string{"p", "q", "r"} {
			if !long.add(c) {
				caught = true
			}
		}
	}
	if !caught {
		t.Fatal("a cycle after the memory bound was not caught")
	}
}
