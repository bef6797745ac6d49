package consumer

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the consumer's Prometheus collectors.
type Metrics struct {
	batches prometheus.Counter
	events  prometheus.Counter
	commit  prometheus.Histogram
	// eventCommit is each event's time from its frame's arrival to the
	// commit of the transaction that applied it.
	eventCommit prometheus.Histogram
	cursorLag   prometheus.GaugeFunc
	// cursorUS is the committed cursor (Unix µs) of the consumer running
	// in this process, 0 while none runs (another instance holds the lease): what cursorLag is
	// computed from when scraped.
	cursorUS atomic.Int64
	cursorTS prometheus.Gauge
	seq      prometheus.Gauge
	stale    prometheus.Counter
	future   prometheus.Counter
	syncs    prometheus.Counter
	gaps     prometheus.Counter
	// lifecycleRereads counts the re-reads #account and #identity events
	// asked for, by outcome: queued, shed.
	lifecycleRereads *prometheus.CounterVec
}

// NewMetrics registers on reg: appview_consumer_batches_total,
// appview_consumer_events_total (committed), appview_consumer_commit_seconds
// (one batch: apply, enqueue, cursor, commit),
// appview_jetstream_event_commit_seconds (each event, from its frame's
// arrival at the socket to the commit that applied it: what the
// consumer adds to what Jetstream delivers), appview_jetstream_cursor_lag_seconds
// (wall clock minus the committed cursor, computed when scraped, so it
// grows while nothing commits: a stalled host, a stuck stream, a full
// disk; 0 on an instance whose consumer is not running),
// appview_jetstream_cursor_timestamp_seconds (the committed cursor as a
// Unix time in seconds; it replaces appview_jetstream_cursor_time_us,
// whose unit promlint refuses), appview_jetstream_position_seq (the stored
// sequence number on its host, 0 in time space),
// appview_consumer_stale_commits_total (commits older than their
// repository's rev, skipped), appview_consumer_future_rev_commits_total
// (commits whose rev lies more than 5 minutes ahead of this host's
// clock, skipped), appview_consumer_sync_events_total (#sync
// events queued for a re-read), appview_consumer_lifecycle_resyncs_total
// (re-reads #account and #identity events asked for: queued, or shed
// past the bound on first events of unknown accounts) and
// appview_jetstream_gaps_total (CursorTooOld refusals that requested a
// backfill).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "appview_consumer_batches_total", Help: "Jetstream batches committed by the consumer.",
		}),
		events: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "appview_consumer_events_total", Help: "Jetstream events in committed batches.",
		}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "appview_consumer_commit_seconds", Help: "Time to apply and commit one batch, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		eventCommit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "appview_jetstream_event_commit_seconds",
			Help: "Time from a Jetstream frame's arrival at the socket to the commit of the transaction that applied its event, in seconds.",
			// 0.5 ms .. 65 s: a lone live frame takes a few ms, a
			// catch-up's frames wait behind the batches before them.
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}),
		cursorTS: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "appview_jetstream_cursor_timestamp_seconds", Help: "The committed Jetstream cursor (time_us) as a Unix time in seconds.",
		}),
		seq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "appview_jetstream_position_seq", Help: "The committed position's sequence number on its Jetstream host (0: a host without sequence numbers).",
		}),
		stale: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "appview_consumer_stale_commits_total", Help: "Commits skipped because their rev is older than the repository's newest applied rev.",
		}),
		future: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "appview_consumer_future_rev_commits_total", Help: "Commits skipped because their rev lies more than 5 minutes ahead of this host's clock.",
		}),
		syncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "appview_consumer_sync_events_total", Help: "Jetstream #sync events, each queuing a re-read of its repository.",
		}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "appview_jetstream_gaps_total", Help: "Positions a Jetstream host no longer had (CursorTooOld, OutdatedCursor); each requests a backfill run.",
		}),
		lifecycleRereads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appview_consumer_lifecycle_resyncs_total", Help: "Repository re-reads #account and #identity events asked for, by outcome (queued; shed: not queued, the queue holding the most re-reads of first events it may).",
		}, []string{"outcome"}),
	}
	m.lifecycleRereads.WithLabelValues("queued")
	m.lifecycleRereads.WithLabelValues("shed")
	m.cursorLag = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "appview_jetstream_cursor_lag_seconds", Help: "Wall clock minus the committed Jetstream cursor, in seconds (0 while this instance runs no consumer).",
	}, m.lag)
	for _, col := range []prometheus.Collector{m.batches, m.events, m.commit, m.eventCommit, m.cursorLag, m.cursorTS, m.seq, m.stale, m.future, m.syncs, m.gaps, m.lifecycleRereads} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("register consumer metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) committed(events int, took time.Duration, cursorUS int64) {
	if m == nil {
		return
	}
	m.batches.Inc()
	m.events.Add(float64(events))
	m.commit.Observe(took.Seconds())
	m.cursorTS.Set(float64(cursorUS) / 1e6)
	m.cursorUS.Store(cursorUS)
}

// eventsCommitted observes, for each event committed at at, the time
// since its frame arrived (Batch.Received; nil: unknown).
func (m *Metrics) eventsCommitted(arrived []time.Time, at time.Time) {
	if m == nil {
		return
	}
	for _, t := range arrived {
		if !t.IsZero() {
			m.eventCommit.Observe(at.Sub(t).Seconds())
		}
	}
}

// following sets the cursor the lag is computed from: the stored one when
// a consumer starts, 0 when it stops.
func (m *Metrics) following(cursorUS int64) {
	if m != nil {
		m.cursorUS.Store(cursorUS)
	}
}

// lag is appview_jetstream_cursor_lag_seconds: the wall clock minus the
// committed cursor, now; 0 without one.
func (m *Metrics) lag() float64 {
	us := m.cursorUS.Load()
	if us <= 0 {
		return 0
	}
	return time.Since(time.UnixMicro(us)).Seconds()
}

func (m *Metrics) screened(stale, future, syncs int, seq int64) {
	if m == nil {
		return
	}
	m.stale.Add(float64(stale))
	m.future.Add(float64(future))
	m.syncs.Add(float64(syncs))
	if seq > 0 {
		m.seq.Set(float64(seq))
	}
}

func (m *Metrics) gap() {
	if m != nil {
		m.gaps.Inc()
	}
}

func (m *Metrics) lifecycle(queued, shed int) {
	if m == nil {
		return
	}
	if queued > 0 {
		m.lifecycleRereads.WithLabelValues("queued").Add(float64(queued))
	}
	if shed > 0 {
		m.lifecycleRereads.WithLabelValues("shed").Add(float64(shed))
	}
}
