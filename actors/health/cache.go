package health

import (
	"encoding/json"
	"net/http"
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Status is the cached result for one hold.
type Status struct {
	// HoldDID is the hold's DID (did:web or did:plc).
	HoldDID string `json:"hold_did"`
	// Endpoint is the base URL checked; empty when the DID did not resolve.
	Endpoint string `json:"endpoint"`
	// Healthy is true when the last check got a 2xx.
	Healthy bool `json:"healthy"`
	// LastCheckedMS is when the last check started, Unix ms.
	LastCheckedMS int64 `json:"last_checked_ms"`
	// LatencyMS is the last check's duration in ms (µs resolution), up to
	// the response status or the failure.
	LatencyMS float64 `json:"latency_ms"`
	// LastError is the last check's failure; empty when healthy.
	LastError string `json:"last_error,omitempty"`
	// ConsecutiveFailures counts failed checks since the last healthy one.
	ConsecutiveFailures int `json:"consecutive_failures"`
	// LastHealthyMS is when a check last succeeded, Unix ms; 0 if never.
	LastHealthyMS int64 `json:"last_healthy_ms"`
}

// Cache is one instance's view of hold health. Safe for concurrent use: a
// round replaces the whole view at once and readers get a copy.
type Cache struct {
	instance string

	mu      sync.RWMutex
	holds   map[string]Status
	roundMS int64
}

// NewCache returns an empty cache labelled with this instance's id (shown
// in /debug/holds, so an operator knows whose view it is).
func NewCache(instance string) *Cache {
	return &Cache{instance: instance, holds: map[string]Status{}}
}

// Snapshot returns every cached hold, sorted by DID, and the start of the
// round that produced them (Unix ms; 0 before the first round).
func (c *Cache) Snapshot() ([]Status, int64) {
	c.mu.RLock()
	out := make([]Status, 0, len(c.holds))
	for _, s := range c.holds {
		out = append(out, s)
	}
	round := c.roundMS
	c.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].HoldDID < out[j].HoldDID })
	return out, round
}

// Get returns one hold's status.
func (c *Cache) Get(holdDID string) (Status, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	s, ok := c.holds[holdDID]
	return s, ok
}

// previous returns the cached statuses of the given holds.
func (c *Cache) previous(dids []string) map[string]Status {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]Status, len(dids))
	for _, d := range dids {
		if s, ok := c.holds[d]; ok {
			out[d] = s
		}
	}
	return out
}

// replace installs a round's view: exactly the holds in next.
func (c *Cache) replace(next map[string]Status, roundMS int64) {
	c.mu.Lock()
	c.holds = next
	c.roundMS = roundMS
	c.mu.Unlock()
}

// snapshotJSON is the /debug/holds document.
type snapshotJSON struct {
	Instance string   `json:"instance"`
	RoundMS  int64    `json:"round_at_ms"`
	Holds    []Status `json:"holds"`
}

// ServeHTTP serves the cache as JSON (GET /debug/holds).
func (c *Cache) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	holds, round := c.Snapshot()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(snapshotJSON{Instance: c.instance, RoundMS: round, Holds: holds})
}

var (
	descHealthy = prometheus.NewDesc("appview_hold_healthy",
		"1 when the hold's last GET /xrpc/_health returned 2xx, else 0 (this instance's view).",
		[]string{"hold"}, nil)
	descLatency = prometheus.NewDesc("appview_hold_check_latency_seconds",
		"Duration of the hold's last health check, in seconds.", []string{"hold"}, nil)
	descFailures = prometheus.NewDesc("appview_hold_consecutive_failures",
		"Failed health checks of the hold since its last healthy one.", []string{"hold"}, nil)
	descLastCheck = prometheus.NewDesc("appview_hold_last_check_timestamp_seconds",
		"When the hold was last checked, Unix seconds.", []string{"hold"}, nil)
)

// Describe implements prometheus.Collector.
func (c *Cache) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHealthy, descLatency, descFailures, descLastCheck} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: one series per cached hold, so
// a hold that is no longer known disappears from /metrics with the round
// that dropped it.
func (c *Cache) Collect(ch chan<- prometheus.Metric) {
	holds, _ := c.Snapshot()
	for _, s := range holds {
		healthy := 0.0
		if s.Healthy {
			healthy = 1
		}
		ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, healthy, s.HoldDID)
		ch <- prometheus.MustNewConstMetric(descLatency, prometheus.GaugeValue, s.LatencyMS/1000, s.HoldDID)
		ch <- prometheus.MustNewConstMetric(descFailures, prometheus.GaugeValue, float64(s.ConsecutiveFailures), s.HoldDID)
		ch <- prometheus.MustNewConstMetric(descLastCheck, prometheus.GaugeValue, float64(s.LastCheckedMS)/1000, s.HoldDID)
	}
}
