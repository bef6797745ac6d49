package lease

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/atcr-io/appview/internal/fence"
)

// Metrics are the per-lease Prometheus collectors (docs/spec.md §7), all
// labelled lease: appview_lease_held (1 while held here), _fence (of the
// last grant here), _transitions_total{event,reason}, the round trips
// _renew_duration_seconds and _acquire_duration_seconds{outcome}, and
// _worker_healthy (the holder's worker's own report at its last renewal).
type Metrics struct {
	Held, Fence, WorkerHealthy *prometheus.GaugeVec
	Transitions                *prometheus.CounterVec
	Renew, Acquire             *prometheus.HistogramVec

	mu sync.Mutex
	// granted is the highest fence granted here, by lease: events of an
	// older grant (a hand-back answered late) move neither Held nor Fence.
	granted map[string]int64
}

// roundTripBuckets span a local file write (~100 µs) to a renew deadline (10 s).
var roundTripBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// NewMetrics registers the lease collectors on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "appview_lease_held", Help: "1 while this instance holds the lease, else 0.",
		}, []string{"lease"}),
		Fence: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "appview_lease_fence", Help: "Fence token of the last grant of the lease to this instance.",
		}, []string{"lease"}),
		Transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_lease_transitions_total", Help: "fence.Custody events by lease, event and reason.",
		}, []string{"lease", "event", "reason"}),
		Renew: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "appview_lease_renew_duration_seconds", Help: "Round trip of lease renewals.", Buckets: roundTripBuckets,
		}, []string{"lease", "outcome"}),
		Acquire: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "appview_lease_acquire_duration_seconds", Help: "Round trip of lease acquire attempts.", Buckets: roundTripBuckets,
		}, []string{"lease", "outcome"}),
		WorkerHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "appview_lease_worker_healthy", Help: "1 while the holder's worker reports itself healthy, 0 while it reports unhealthy.",
		}, []string{"lease"}),
	}
	for _, c := range []prometheus.Collector{m.Held, m.Fence, m.Transitions, m.Renew, m.Acquire, m.WorkerHealthy} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.granted = map[string]int64{}
	return m, nil
}

func (m *Metrics) observe(e Event) {
	if m == nil {
		return
	}
	if e.Kind == LeaseRenewed || e.Kind == LeaseContended {
		return // counted by the histograms; too frequent to be transitions
	}
	m.Transitions.WithLabelValues(e.Lease, string(e.Kind), e.Reason).Inc()
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.Fence < m.granted[e.Lease] {
		return // an older grant's events: custody has moved on
	}
	if e.Kind == LeaseAcquired {
		m.granted[e.Lease] = e.Fence
	}
	switch e.Kind {
	case LeaseAcquired:
		m.Held.WithLabelValues(e.Lease).Set(1)
		m.Fence.WithLabelValues(e.Lease).Set(float64(e.Fence))
	case LeaseLost, LeaseReleased:
		m.Held.WithLabelValues(e.Lease).Set(0)
	}
}

// observeCall records the round trip d of an acquire (g its grant) or,
// when acquire is false, of a renewal.
func (m *Metrics) observeCall(lease string, acquire bool, d time.Duration, g Grant, err error) {
	if m == nil {
		return
	}
	h, outcome := m.Renew, "ok"
	if acquire {
		h, outcome = m.Acquire, "contended"
		if g.Granted {
			outcome = "granted"
		}
	}
	switch {
	case errors.Is(err, fence.ErrSuperseded):
		outcome = "superseded"
	case err != nil:
		outcome = "error"
	}
	h.WithLabelValues(lease, outcome).Observe(d.Seconds())
}
