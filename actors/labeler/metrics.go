package labeler

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the subscriber's Prometheus collectors. Build them once per
// process (NewMetrics) and share them across grants of custody.
type Metrics struct {
	// Frames counts frames received, by kind: labels, info, error,
	// unknown (a message type this subscriber ignores), malformed, and
	// seq_regression (a #labels frame whose seq is not above the last
	// applied one: skipped, nothing written).
	Frames *prometheus.CounterVec
	// Labels counts labels by outcome: takedown, negated, expired,
	// ignored, unsupported, pending (a takedown of a record not indexed
	// yet), malformed; and resolved, a pending takedown applied later.
	Labels *prometheus.CounterVec
	// StreamErrors counts error frames by code (FutureCursor,
	// ConsumerTooSlow, other).
	StreamErrors *prometheus.CounterVec
	// Connections counts connection attempts by outcome: connected,
	// failed (dial or handshake error).
	Connections *prometheus.CounterVec
	// Cursor is the seq of the last applied #labels frame.
	Cursor prometheus.Gauge
}

// Frame kinds, the `kind` label of appview_labeler_frames_total.
const (
	frameLabels    = "labels"
	frameInfo      = "info"
	frameError     = "error"
	frameUnknown   = "unknown"
	frameMalformed = "malformed"
	// frameSeqRegression is a #labels frame skipped because its seq is not
	// above the last applied one (the name jetstream uses for its class).
	frameSeqRegression = "seq_regression"
)

// NewMetrics builds the collectors and registers them on reg (nil: not
// registered, e.g. in tests that read them directly). It returns an error
// when a collector is already registered.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Frames: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_labeler_frames_total",
			Help: "subscribeLabels frames received, by kind (labels, info, error, unknown, malformed, seq_regression).",
		}, []string{"kind"}),
		Labels: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_labeler_labels_total",
			Help: "Labels received, by outcome (takedown, negated, expired, ignored, unsupported, pending, resolved, malformed).",
		}, []string{"outcome"}),
		StreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_labeler_stream_errors_total",
			Help: "Error frames received from the labeler, by error code.",
		}, []string{"error"}),
		Connections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_labeler_connections_total",
			Help: "Connection attempts to the labeler, by outcome (connected, failed).",
		}, []string{"outcome"}),
		Cursor: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "appview_labeler_cursor_seq",
			Help: "Seq of the last subscribeLabels frame applied.",
		}),
	}
	for _, k := range []string{frameLabels, frameInfo, frameError, frameUnknown, frameMalformed, frameSeqRegression} {
		m.Frames.WithLabelValues(k)
	}
	for _, o := range labelOutcomes {
		m.Labels.WithLabelValues(o)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.Frames, m.Labels, m.StreamErrors, m.Connections, m.Cursor} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register labeler metrics: %w", err)
		}
	}
	return m, nil
}

// streamErrorCode bounds the cardinality of the error label: codes come
// from the remote side.
func streamErrorCode(code string) string {
	switch code {
	case errFutureCursorName, errConsumerTooSlowName:
		return code
	default:
		return "other"
	}
}
