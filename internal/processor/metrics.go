package processor

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/atcr-io/appview/internal/promshare"
)

// Metrics are the processor's Prometheus collectors.
type Metrics struct {
	events  *prometheus.CounterVec
	skips   *prometheus.CounterVec
	latency prometheus.Histogram
}

// NewMetrics registers the processor's collectors on reg (reusing them when
// another Processor registered them first):
// appview_processor_events_total{collection,operation,outcome},
// appview_processor_skipped_total{reason} and
// appview_processor_batch_apply_seconds (a histogram of ApplyTx latency).
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
	var err error
	if m.events, err = promshare.Register(reg, m.events); err != nil {
		return nil, err
	}
	if m.skips, err = promshare.Register(reg, m.skips); err != nil {
		return nil, err
	}
	if m.latency, err = promshare.Register(reg, m.latency); err != nil {
		return nil, err
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
