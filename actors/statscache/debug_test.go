package statscache_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/actors/statscache"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"
)

// debugStats is the part of the /debug/stats document the test reads.
type debugStats struct {
	Instance   string `json:"instance"`
	Lease      string `json:"lease"`
	Fence      int64  `json:"fence"`
	DID        string `json:"did"`
	Repository string `json:"repository"`
	PullCount  int64  `json:"pull_count"`
	PushCount  int64  `json:"push_count"`
	Holds      []struct {
		HoldDID   string `json:"hold_did"`
		PullCount int64  `json:"pull_count"`
	} `json:"holds"`
	Error string `json:"error"`
}

func getStats(t *testing.T, mux *http.ServeMux, query string) (int, debugStats) {
	t.Helper()
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, statscache.DebugPath+query, nil))
	var out debugStats
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("GET %s%s: %d %q: %v", statscache.DebugPath, query, rec.Code, rec.Body.String(), err)
	}
	return rec.Code, out
}

func TestTheDebugStatsEndpointIsAnsweredFromTheRunningCachesView(t *testing.T) {
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	mux := http.NewServeMux()
	props, err := statscache.New(workers.Deps{DB: db, Log: zerolog.Nop(), Metrics: prometheus.NewRegistry(), Admin: mux, Instance: "me"})
	if err != nil {
		t.Fatal(err)
	}
	const query = "?did=did:plc:o&repository=app"
	if code, body := getStats(t, mux, query); code != http.StatusServiceUnavailable || body.Instance != "me" || body.Error == "" {
		t.Fatalf("before any cache runs: %d %+v, want 503 with an error", code, body)
	}

	c := acquire(t, db, "me")
	pid := sys.Root.Spawn(props(c))
	res := request[*processor.StatsObserved](t, sys, pid, &processor.ObserveStats{Custody: c, Stats: []processor.HoldStat{
		stat("did:web:h1", 5, 100), stat("did:web:h2", 7, 100),
	}})
	if res.Applied != 2 {
		t.Fatalf("observe: %+v", res)
	}
	code, body := getStats(t, mux, query)
	if code != http.StatusOK {
		t.Fatalf("GET: %d %+v", code, body)
	}
	if body.Lease != c.Lease || body.Fence != c.Fence || body.DID != "did:plc:o" || body.Repository != "app" ||
		body.PullCount != 12 || body.PushCount != 2 || len(body.Holds) != 2 ||
		body.Holds[0].HoldDID != "did:web:h1" || body.Holds[1].PullCount != 7 {
		t.Fatalf("GET: %+v", body)
	}
	// A query that names no repository is refused with a short reason,
	// never answered with zero counts (which read as "no pulls yet").
	for _, tc := range []struct{ query, reason string }{
		{"?did=did:plc:o", "did and repository are required"},
		{"?repository=app", "did and repository are required"},
		{"?did=notadid&repository=y", `did "notadid" is not a DID`},
		{"?did=DID:plc:o&repository=app", "is not a DID"},
		{"?did=did:plc:&repository=app", "is not a DID"},
		{"?did=&repository=app", `did "" is not a DID`},
		{"?did=did:plc:o&repository=", "repository is empty"},
		{"?did=did:plc:o&repository=%20%09", "repository is empty"},
		{"?did=did:plc:o&repository=a/../b", `no repository can have this name: repository "a/../b" has an empty, "." or ".." path segment`},
		{"?did=did:plc:o&repository=a%0Ab", "no repository can have this name"},
		{"?did=did:plc:o&did=did:plc:p&repository=app", "did is given 2 times"},
		{"?did=did:plc:o&repository=app&repository=other", "repository is given 2 times"},
		{"?did=did:plc:" + strings.Repeat("x", 3000) + "&repository=app", "is not a DID"},
		{"?did=did:plc:o&repository=a%zzb", "query is not a valid URL query"},
		{"?did=did:plc:o;repository=app", "query is not a valid URL query"},
	} {
		code, body := getStats(t, mux, tc.query)
		if code != http.StatusBadRequest || body.Instance != "me" || !strings.Contains(body.Error, tc.reason) || len(body.Error) > 200 {
			t.Errorf("GET %.80s: %d %+v, want 400 with a short error containing %q", tc.query, code, body, tc.reason)
		}
	}

	stopped(t, sys, pid)
	if code, body := getStats(t, mux, query); code != http.StatusServiceUnavailable {
		t.Fatalf("after the cache stopped: %d %+v, want 503", code, body)
	}
}

func TestAnUnexpectedMessageIsLoggedNotDroppedSilently(t *testing.T) {
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	logs := &testsupport.LockedBuffer{}
	c := acquire(t, db, "me")
	pid := sys.Root.Spawn(statscache.NewProps(statscache.Options{DB: db, Custody: c, Log: zerolog.New(logs)}))
	defer stopped(t, sys, pid)
	// A value where the protocol sends a pointer: the mistake the log catches.
	sys.Root.Send(pid, processor.GetStats{OwnerDID: "did:plc:o", Repository: "app"})
	request[*processor.StatsSnapshot](t, sys, pid, &processor.GetStats{OwnerDID: "did:plc:o", Repository: "app"})
	if got := logs.String(); !strings.Contains(got, "unexpected message ignored") || !strings.Contains(got, "processor.Get") {
		t.Fatalf("log after an unexpected message: %q", got)
	}
}
