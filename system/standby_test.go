package system

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/events"
	"github.com/atcr-io/appview/internal/testsupport"
)

// The standby and nudge endpoints answer a POST for a leased worker this
// instance runs (202 and 204), and refuse other names and unleased
// workers (404), a missing, empty, repeated or unparsable lease parameter
// (400), other methods (405), and everything once the instance stops (503).
func TestTheStandbyAndNudgeEndpointsAnswerOnlyPOSTsForLeasedWorkers(t *testing.T) {
	leased, unleased := &probe{}, &probe{}
	h := newHarness(t, testConfig(), leased.actorWorker("leased-actor", true), unleased.actorWorker("unleased-actor", false))
	h.start()
	h.waitEvent(events.WorkerStarted, "leased-actor", 1)
	h.waitEvent(events.WorkerStarted, "unleased-actor", 1)
	for _, tc := range []struct {
		h      http.Handler
		method string
		query  string
		want   int
	}{
		{h.sys.StandbyHandler(), http.MethodPost, "lease=leased-actor", http.StatusAccepted},
		{h.sys.StandbyHandler(), http.MethodPost, "lease=unleased-actor", http.StatusNotFound},
		{h.sys.StandbyHandler(), http.MethodPost, "lease=no-such-worker", http.StatusNotFound},
		{h.sys.StandbyHandler(), http.MethodGet, "lease=leased-actor", http.StatusMethodNotAllowed},
		{h.sys.NudgeHandler(), http.MethodPost, "lease=leased-actor", http.StatusNoContent},
		{h.sys.NudgeHandler(), http.MethodPost, "lease=", http.StatusBadRequest},
		{h.sys.NudgeHandler(), http.MethodPost, "", http.StatusBadRequest},
		{h.sys.StandbyHandler(), http.MethodPost, "lease=leased-actor&lease=leased-job", http.StatusBadRequest},
		{h.sys.StandbyHandler(), http.MethodPost, "lease=%zz", http.StatusBadRequest},
	} {
		rec := httptest.NewRecorder()
		tc.h.ServeHTTP(rec, httptest.NewRequest(tc.method, "/lease/x?"+tc.query, nil))
		if rec.Code != tc.want {
			t.Errorf("%s ?%s: %d, want %d", tc.method, tc.query, rec.Code, tc.want)
		}
	}
	h.stop()
	// A stopping (here: stopped) instance takes no more signals: its
	// LeaseActors are gone, and it contends no more.
	for _, hd := range []http.Handler{h.sys.StandbyHandler(), h.sys.NudgeHandler()} {
		rec := httptest.NewRecorder()
		hd.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/lease/x?lease=leased-actor", nil))
		if rec.Code != http.StatusServiceUnavailable {
			t.Errorf("after the stop: %d, want 503", rec.Code)
		}
	}
}

// A contender's standby endpoint answers 200 with this process as the
// successor (instance_id, process nonce, lease TTL) when its watch began:
// the holder may then hand it the lease (leasestore.Store.Transfer).
// The instance's own held lease is not watched: 202, no body.
func TestTheStandbyEndpointOffersAContenderAsTheSuccessor(t *testing.T) {
	leased := &probe{}
	h := newHarness(t, testConfig(), leased.actorWorker("leased-actor", true))
	h.start()
	h.waitEvent(events.WorkerStarted, "leased-actor", 1)
	post := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.sys.StandbyHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/lease/standby?lease=leased-actor", nil))
		return rec
	}
	if rec := post(); rec.Code != http.StatusAccepted || rec.Body.Len() != 0 {
		t.Fatalf("standby for a held lease: %d %q; want 202 without a body", rec.Code, rec.Body.String())
	}
	// Another instance takes the lease: this one contends.
	if err := h.takeOver("leased-actor", time.Hour); err != nil {
		t.Fatal(err)
	}
	h.waitEvent(events.LeaseLost, "leased-actor", 1)
	var answer struct {
		Instance string `json:"instance"`
		Nonce    string `json:"nonce"`
		TTLMS    int64  `json:"ttl_ms"`
	}
	var last *httptest.ResponseRecorder
	// Standbys are spaced (one a second per lease): ask until one starts
	// a watch.
	testsupport.Eventually(t, "a standby answered with the successor", func() bool {
		last = post()
		return last.Code == http.StatusOK
	})
	if ct := last.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if err := json.Unmarshal(last.Body.Bytes(), &answer); err != nil {
		t.Fatalf("answer %q: %v", last.Body.String(), err)
	}
	if answer.Instance != instance || answer.Nonce != h.sys.store.Nonce() || answer.TTLMS != testTTL.Milliseconds() {
		t.Fatalf("answer %+v; want instance %s, nonce %s, ttl_ms %d", answer, instance, h.sys.store.Nonce(), testTTL.Milliseconds())
	}
	h.stop()
}
