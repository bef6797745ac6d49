package system

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/atcr-io/appview/internal/events"
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
