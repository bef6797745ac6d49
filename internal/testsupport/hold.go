package testsupport

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// Hold XRPC paths (docs/lexicons.md, hold XRPC).
const (
	holdHealthPath         = "/xrpc/_health"
	holdUpdateCrewTierPath = "/xrpc/io.atcr.hold.updateCrewTier"
)

// CrewTier is one io.atcr.hold.updateCrewTier call as a fake hold received it.
type CrewTier struct {
	UserDID  string
	TierRank int
}

// HoldInterceptor runs for every well-formed updateCrewTier call after the
// hold recorded it and before it answers: it may delay the answer (block)
// or write one itself (returning true). A hold acts on a call when it
// receives it, so a call the client gives up on still counts.
type HoldInterceptor func(w http.ResponseWriter, r *http.Request, call CrewTier) bool

// Hold is a fake ATCR hold serving GET /xrpc/_health (200 while up) and
// POST /xrpc/io.atcr.hold.updateCrewTier {userDid, tierRank} → {tierName}.
// It records every call and can be taken down for good (Down).
type Hold struct {
	srv       *httptest.Server
	mu        sync.Mutex
	calls     []CrewTier
	checks    int
	intercept HoldInterceptor
}

// NewHold starts a fake hold on loopback; it stops at test cleanup.
func NewHold(t testing.TB) *Hold {
	h := &Hold{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+holdHealthPath, func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.checks++
		h.mu.Unlock()
		writeJSON(w, map[string]string{"version": "fakepeer"})
	})
	mux.HandleFunc("POST "+holdUpdateCrewTierPath, func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			UserDID  string `json:"userDid"`
			TierRank *int   `json:"tierRank"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.UserDID == "" || in.TierRank == nil {
			XRPCError(w, http.StatusBadRequest, "InvalidRequest", "want {userDid, tierRank}")
			return
		}
		call := CrewTier{UserDID: in.UserDID, TierRank: *in.TierRank}
		h.mu.Lock()
		h.calls = append(h.calls, call)
		icpt := h.intercept
		h.mu.Unlock()
		if icpt != nil && icpt(w, r, call) {
			return
		}
		writeJSON(w, map[string]string{"tierName": fmt.Sprintf("tier-%d", call.TierRank)})
	})
	h.srv = httptest.NewServer(mux)
	t.Cleanup(h.srv.Close)
	return h
}

// URL is the hold's base URL (the #atcr_hold service endpoint).
func (h *Hold) URL() string { return h.srv.URL }

// Calls returns every updateCrewTier call received so far, in order.
func (h *Hold) Calls() []CrewTier {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]CrewTier(nil), h.calls...)
}

// HealthChecks is how many GET /xrpc/_health the hold has answered.
func (h *Hold) HealthChecks() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.checks
}

// Intercept installs (or with nil removes) an updateCrewTier interceptor.
func (h *Hold) Intercept(i HoldInterceptor) {
	h.mu.Lock()
	h.intercept = i
	h.mu.Unlock()
}

// Down takes the hold down for good: its listener closes, so later
// connections are refused, and idle ones are closed. It waits for the
// requests in progress to finish.
func (h *Hold) Down() { h.srv.Close() }
