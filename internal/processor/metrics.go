package processor

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the processor's Prometheus collectors.
type Metrics struct {
	events  *prometheus.CounterVec
	skips   *prometheus.CounterVec
	latency prometheus.Histogram
}

// NewMetrics registers the processor's collectors on reg:
// appview_processor_events_total{collection,operation,outcome},
// appview_processor_skipped_total{reason} and
// appview_processor_batch_apply_seconds (a histogram of ApplyTx latency).
// Build them once per process and give the same value to every Processor
// (the consumer's and the backfill's count into one set): a second
// registration on one registry is refused.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_processor_events_total",
			Help: "Jetstream events processed, by collection (io.atcr NSID, \"other\" outside io.atcr), operation (create, update, delete, identity, account) and outcome (applied, unchanged, skipped).",
		}, []string{"collection", "operation", "outcome"}),
		skips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_processor_skipped_total",
			Help: "Events skipped without being applied, by reason.",
		}, []string{"reason"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "appview_processor_batch_apply_seconds",
			Help:    "Time to apply one batch of events inside its transaction (excluding commit), in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
	for _, c := range []prometheus.Collector{m.events, m.skips, m.latency} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register processor metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) event(collection, operation, outcome string) {
	if m != nil {
		m.events.WithLabelValues(collection, operation, outcome).Inc()
	}
}

func (m *Metrics) skipped(reason string) {
	if m != nil {
		m.skips.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) batch(d time.Duration) {
	if m != nil {
		m.latency.Observe(d.Seconds())
	}
}
