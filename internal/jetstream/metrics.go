package jetstream

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/atcr-io/appview/internal/logval"
)

// Why a Client reconnected: the reason label of
// appview_jetstream_reconnects_total.
const (
	// ReasonDial: the dial or websocket handshake failed.
	ReasonDial = "dial"
	// ReasonStale: nothing (no frame, no ping, no pong) arrived within the
	// staleness timeout.
	ReasonStale = "stale"
	// ReasonServerClose: the server sent a close frame.
	ReasonServerClose = "server_close"
	// ReasonReadError: the connection failed (reset, EOF without a close
	// frame, protocol error).
	ReasonReadError = "read_error"
	// ReasonErrorFrame: a v2 error frame (ConsumerTooSlow, ...), terminal.
	ReasonErrorFrame = "error_frame"
	// ReasonRefused: the upgrade was refused with an HTTP error status,
	// with an XRPC error (CursorTooOld, UnknownZstdDictionary,
	// InvalidRequest, ...) or without one (a CDN's 429, a proxy's 502).
	ReasonRefused = "refused"
	// ReasonFailback: the client left a later URL on purpose, for an
	// earlier one that answers again (ClientOptions.FailbackInterval).
	ReasonFailback = "failback"
	// ReasonSeqReset: the host's sequence numbers restarted below the
	// resume cursor (ErrSeqReset).
	ReasonSeqReset = "seq_reset"
)

var reconnectReasons = []string{ReasonDial, ReasonStale, ReasonServerClose, ReasonReadError, ReasonErrorFrame, ReasonRefused, ReasonSeqReset, ReasonFailback}

// Connection states: the state label of appview_jetstream_connection_state.
const (
	StateConnecting = "connecting"
	StateConnected  = "connected"
	StateBackoff    = "backoff"
)

var connectionStates = []string{StateConnecting, StateConnected, StateBackoff}

// Metrics are the Client's Prometheus collectors. Build them once per
// process (at worker registration) and share them across the clients built
// for successive grants of custody. A nil *Metrics records nothing.
type Metrics struct {
	frames       prometheus.Counter
	bytes        prometheus.Counter
	events       *prometheus.CounterVec
	decodeErrors *prometheus.CounterVec
	reconnects   *prometheus.CounterVec
	connected    prometheus.Gauge
	connState    *prometheus.GaugeVec
	infos        *prometheus.CounterVec
	serverErrors *prometheus.CounterVec
	tooOld       prometheus.Counter
	tooOldGap    prometheus.Counter
}

// NewMetrics builds the collectors and registers them on reg (nil: not
// registered, still counted, useful in tests). Series:
//
//	appview_jetstream_frames_total                 websocket data messages received
//	appview_jetstream_received_bytes_total         their size in bytes, as received (compressed when compress=true)
//	appview_jetstream_events_total{kind}           frames decoded into events
//	appview_jetstream_decode_errors_total{class}   frames skipped, by ErrorClass
//	appview_jetstream_reconnects_total{reason}     connections lost and retried, by Reason*
//	appview_jetstream_connected                    1 while a connection is up
//	appview_jetstream_connection_state{url,state}  1 for the URL and state the client is in (connecting, connected, backoff)
//	appview_jetstream_info_total{name}             v2 #info advisories (OutdatedCursor, ...)
//	appview_jetstream_server_errors_total{error}   v2 error frames and refused upgrades, by XRPC error name or HTTP_<status>
//	appview_jetstream_cursor_too_old_total         sequence cursors refused below a host's lookback floor
//	appview_jetstream_gap_events_total             sequence numbers lost to those refusals (floor - cursor)
//
// Build them once per process (the consumer's registration does) and
// share them: a second registration on one registry is refused.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		frames: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "appview_jetstream_frames_total",
			Help: "Jetstream websocket data messages received.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "appview_jetstream_received_bytes_total",
			Help: "Bytes of Jetstream websocket data messages received, as sent (compressed with compress=true).",
		}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_jetstream_events_total",
			Help: "Jetstream frames decoded into events, by kind.",
		}, []string{"kind"}),
		decodeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_jetstream_decode_errors_total",
			Help: "Jetstream frames skipped because they could not be decoded, by class.",
		}, []string{"class"}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_jetstream_reconnects_total",
			Help: "Jetstream connections lost or refused and retried, by reason.",
		}, []string{"reason"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "appview_jetstream_connected",
			Help: "1 while the Jetstream client has a live connection.",
		}),
		connState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "appview_jetstream_connection_state",
			Help: "1 for the configured Jetstream URL the client is on and its state (connecting, connected, backoff); 0 otherwise.",
		}, []string{"url", "state"}),
		infos: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_jetstream_info_total",
			Help: "Jetstream v2 #info advisories received, by name.",
		}, []string{"name"}),
		serverErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_jetstream_server_errors_total",
			Help: "Jetstream v2 error frames and refused upgrades, by XRPC error name, or HTTP_<status> for a refusal without one.",
		}, []string{"error"}),
		tooOld: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "appview_jetstream_cursor_too_old_total",
			Help: "Sequence cursors a Jetstream host refused as older than its lookback.",
		}),
		tooOldGap: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "appview_jetstream_gap_events_total",
			Help: "Sequence numbers skipped because a host no longer had them (floor minus cursor of each CursorTooOld).",
		}),
	}
	// Every series exists from the start, so a rate() over a class that
	// has never happened is 0 rather than absent.
	for _, k := range []string{KindCommit, KindIdentity, KindAccount, KindSync} {
		m.events.WithLabelValues(k)
	}
	for _, c := range ErrorClasses {
		m.decodeErrors.WithLabelValues(string(c))
	}
	for _, r := range reconnectReasons {
		m.reconnects.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.frames, m.bytes, m.events, m.decodeErrors, m.reconnects, m.connected,
		m.connState, m.infos, m.serverErrors, m.tooOld, m.tooOldGap} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("jetstream metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) frame(size int64) {
	if m == nil {
		return
	}
	m.frames.Inc()
	m.bytes.Add(float64(size))
}

func (m *Metrics) decoded(ev *Event, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.decodeErrors.WithLabelValues(string(ClassOf(err))).Inc()
		return
	}
	m.events.WithLabelValues(ev.Kind).Inc()
}

func (m *Metrics) reconnect(reason string) {
	if m != nil {
		m.reconnects.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) setConnected(up bool) {
	if m == nil {
		return
	}
	if up {
		m.connected.Set(1)
	} else {
		m.connected.Set(0)
	}
}

// state sets the connection-state series of urls: 1 for (at, st), 0 for
// every other (at "" : all 0).
func (m *Metrics) state(urls []string, at, st string) {
	if m == nil {
		return
	}
	for _, u := range urls {
		for _, s := range connectionStates {
			v := 0.0
			if u == at && s == st {
				v = 1
			}
			m.connState.WithLabelValues(logval.RedactURL(u), s).Set(v)
		}
	}
}

// knownName reports whether s is one of the #info and error names counted
// under their own label; any other name a server sends is "other", so a
// hostile server cannot grow the series without bound.
func knownName(s string) bool {
	switch s {
	case "OutdatedCursor", ErrNameConsumerTooSlow, ErrNameCursorTooOld, ErrNameUnknownZstdDictionary, "InvalidRequest":
		return true
	}
	return false
}

// label is the metric label of a server's error name: a known XRPC name,
// "HTTP_<status>" for an upgrade refused without one (httpErrorName: at
// most the few hundred statuses there are), else "other".
func label(s string) string {
	if knownName(s) {
		return s
	}
	if code, ok := strings.CutPrefix(s, "HTTP_"); ok && len(code) == 3 && code[0] >= '1' && code[0] <= '5' &&
		strings.Trim(code, "0123456789") == "" {
		return s
	}
	return "other"
}

func (m *Metrics) info(name string) {
	if m != nil {
		m.infos.WithLabelValues(label(name)).Inc()
	}
}

func (m *Metrics) serverError(name string) {
	if m != nil {
		m.serverErrors.WithLabelValues(label(name)).Inc()
	}
}

func (m *Metrics) cursorTooOld(gap int64) {
	if m != nil {
		m.tooOld.Inc()
		m.tooOldGap.Add(float64(gap))
	}
}
