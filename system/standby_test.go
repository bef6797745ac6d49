package system

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/atcr-io/appview/internal/events"
)

// The standby and nudge endpoints answer a POST for a leased worker this
// instance runs (202 and 204), and refuse other names, unleased workers
// and other methods.
func TestTheStandbyAndNudgeEndpointsAnswerOnlyPOSTsForLeasedWorkers(t *testing.T) {
	leased, unleased := &probe{}, &probe{}
	h := newHarness(t, testConfig(), leased.actorWorker("leased-actor", true), unleased.actorWorker("unleased-actor", false))
	h.start()
	h.waitEvent(events.WorkerStarted, "leased-actor", 1)
	h.waitEvent(events.WorkerStarted, "unleased-actor", 1)
	for _, tc := range []struct {
		h      http.Handler
		method string
		lease  string
		want   int
	}{
		{h.sys.StandbyHandler(), http.MethodPost, "leased-actor", http.StatusAccepted},
		{h.sys.StandbyHandler(), http.MethodPost, "unleased-actor", http.StatusNotFound},
		{h.sys.StandbyHandler(), http.MethodPost, "no-such-worker", http.StatusNotFound},
		{h.sys.StandbyHandler(), http.MethodGet, "leased-actor", http.StatusMethodNotAllowed},
		{h.sys.NudgeHandler(), http.MethodPost, "leased-actor", http.StatusNoContent},
		{h.sys.NudgeHandler(), http.MethodPost, "", http.StatusNotFound},
	} {
		rec := httptest.NewRecorder()
		tc.h.ServeHTTP(rec, httptest.NewRequest(tc.method, "/lease/x?lease="+tc.lease, nil))
		if rec.Code != tc.want {
			t.Errorf("%s ?lease=%q: %d, want %d", tc.method, tc.lease, rec.Code, tc.want)
		}
	}
	h.stop()
}
