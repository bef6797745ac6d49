package webhooks

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Delivery outcomes, the values of the "outcome" label.
const (
	// OutcomeDelivered: the receiver answered 2xx.
	OutcomeDelivered = "delivered"
	// OutcomeRetried: the attempt failed and another is scheduled.
	OutcomeRetried = "retried"
	// OutcomeFailed: the last attempt of the schedule failed (or its
	// outcome was lost), or the stored delivery could not be rendered.
	OutcomeFailed = "failed"
	// OutcomeRefused: the SSRF guard refused the target address; final.
	OutcomeRefused = "refused"
)

// Metrics are the dispatcher's Prometheus collectors. Build them once per
// process (NewMetrics) and share them between successive dispatchers.
type Metrics struct {
	// deliveries counts recorded attempt outcomes by outcome.
	deliveries *prometheus.CounterVec
	// latency is the wall time of one HTTP attempt, in seconds.
	latency prometheus.Histogram
	// pending is the number of pending deliveries the holder last counted.
	pending prometheus.Gauge
}

// NewMetrics builds the collectors and registers them with reg (nil: not
// registered, e.g. in tests). Names: appview_webhook_deliveries_total
// {outcome}, appview_webhook_attempt_duration_seconds,
// appview_webhook_deliveries_pending. Build them once per process (the
// consumer's registration does, NewDispatcherOptions): a second
// registration on one registry is refused.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_webhook_deliveries_total",
			Help: "Webhook delivery attempts by recorded outcome (delivered, retried, failed, refused).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "appview_webhook_attempt_duration_seconds",
			Help:    "Wall time of one webhook HTTP attempt, in seconds.",
			Buckets: prometheus.DefBuckets,
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "appview_webhook_deliveries_pending",
			Help: "Pending webhook deliveries, as last counted by the dispatcher of this instance (0 when it holds no custody).",
		}),
	}
	for _, o := range []string{OutcomeDelivered, OutcomeRetried, OutcomeFailed, OutcomeRefused} {
		m.deliveries.WithLabelValues(o)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.deliveries, m.latency, m.pending} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register webhook metrics: %w", err)
		}
	}
	return m, nil
}
