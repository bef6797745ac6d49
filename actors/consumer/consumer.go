package consumer

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/statsview"
	"github.com/atcr-io/appview/internal/webhooks"
)

// UpdateCollections replaces the collection filter on the live
// connection (a Jetstream options_update) and on every later one.
type UpdateCollections struct {
	// Collections are NSIDs or "prefix.*" wildcards.
	Collections []string
}

// Options configure one consumer actor (one grant of custody).
type Options struct {
	DB      *sql.DB
	Custody fence.Custody
	Log     zerolog.Logger
	// Jetstream is the jetstream section: urls, collections, compress,
	// rewind, stale_timeout, max_message_bytes.
	Jetstream config.Jetstream
	// Processor applies the events; share one per process.
	Processor *processor.Processor
	// Dispatcher configures the webhook dispatcher child (its Custody is
	// set to Custody here).
	Dispatcher webhooks.DispatcherOptions
	// Stats builds the StatsCache child that this grant's per-hold stats
	// are sent to (statscache.New); nil runs without one.
	Stats statsview.Props
	// ClientMetrics and Metrics may be nil.
	ClientMetrics *jetstream.Metrics
	Metrics       *Metrics
	// BatchSize and BatchLinger shape the client's batches (0: the
	// jetstream defaults); MinBackoff and MaxBackoff its reconnect delay.
	BatchSize              int
	BatchLinger            time.Duration
	MinBackoff, MaxBackoff time.Duration

	// enqueue replaces webhooks.EnqueueTx in tests.
	enqueue enqueueFunc
}

// NewProps returns the props of the consumer actor for one grant of custody.
func NewProps(o Options) *actor.Props {
	if o.enqueue == nil {
		o.enqueue = webhooks.EnqueueTx
	}
	o.Dispatcher.Custody = o.Custody
	return actor.PropsFromProducer(func() actor.Actor {
		log := o.Log.With().Str("component", "consumer").Str("custody", o.Custody.String()).Logger()
		c := &consumer{o: o, log: log, sampled: sampled(log), frameLog: map[jetstream.ErrorClass]zerolog.Logger{}}
		for _, class := range jetstream.ErrorClasses {
			c.frameLog[class] = sampled(log)
		}
		return c
	}, actor.WithSupervisor(escalate))
}

// escalate passes a child's failure (the StatsCache or the dispatcher, e.g.
// fence.ErrSuperseded from a fenced write) up as the consumer's own, so the
// LeaseActor decides: lost custody, or a restart of the whole worker.
var escalate = actor.NewOneForOneStrategy(0, 0, func(any) actor.Directive { return actor.EscalateDirective })

// Sampled logging: a hostile or broken stream can fail every batch, and
// must not flood the log doing it.
const (
	logBurst  = 10
	logPeriod = time.Minute
)

func sampled(l zerolog.Logger) zerolog.Logger {
	return l.Sample(&zerolog.BurstSampler{Burst: logBurst, Period: logPeriod})
}

// runEnded reports that the client's Run returned.
type runEnded struct{ err error }

type consumer struct {
	o   Options
	log zerolog.Logger
	// sampled is log at logBurst lines per logPeriod.
	sampled zerolog.Logger
	// frameLog samples undecodable frames per jetstream.ErrorClass, so a
	// flood of one class cannot hide another.
	frameLog map[jetstream.ErrorClass]zerolog.Logger
	root     *actor.RootContext
	self     *actor.PID
	stats    *actor.PID
	disp     *actor.PID

	client *jetstream.Client
	// cursor is the time_us of the last committed batch (read by the
	// client's CursorFor callback on its goroutine).
	cursor atomic.Int64
	// resumeURL and resumeUS are where this incarnation left off: the
	// endpoint its last committed batch was read from and that batch's
	// last time_us (see resumeAt). Only the client's Run goroutine touches
	// them (the handler and CursorFor both run there).
	resumeURL string
	resumeUS  int64
	// highUS is the largest time_us this incarnation committed; dialHighUS
	// is what it was when the current connection was dialled.
	highUS, dialHighUS int64
	// runDone closes when the Run goroutine has exited.
	runDone chan struct{}
}

// Receive handles the actor's messages. Batches never reach it: the
// client's Run goroutine commits them (blocking I/O stays off the actor).
func (c *consumer) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		c.start(ctx)
	case *UpdateCollections:
		if c.client != nil {
			if err := c.client.UpdateOptions(msg.Collections); err != nil {
				c.log.Warn().Err(logval.Error(err)).Msg("options_update not sent; the filter applies from the next connection")
			}
		}
	case *workers.Drain:
		c.drain()
	case *runEnded:
		if msg.err != nil {
			// ErrSuperseded (or any failure): fail, so the LeaseActor
			// treats it as lost custody or restarts us with backoff.
			panic(msg.err)
		}
	case *actor.Stopping, *actor.Restarting:
		c.stop()
	case *actor.Stopped:
		c.log.Debug().Msg("consumer stopped")
	case *actor.Terminated:
		// A child (StatsCache, dispatcher) stopped: only while the consumer
		// stops, since a child's failure escalates to it.
	default:
		c.log.Warn().Str("message_type", fmt.Sprintf("%T", msg)).Msg("unexpected message ignored")
	}
}

func (c *consumer) start(ctx actor.Context) {
	c.root, c.self = ctx.ActorSystem().Root, ctx.Self()
	stored, _, err := LoadCursor(context.Background(), c.o.DB)
	if err != nil {
		panic(err)
	}
	c.cursor.Store(stored)
	if c.o.Stats != nil {
		c.stats = ctx.Spawn(c.o.Stats(c.o.Custody))
	}
	c.disp = ctx.Spawn(webhooks.NewDispatcherProps(c.o.Dispatcher))
	js := c.o.Jetstream
	client, err := jetstream.NewClient(jetstream.ClientOptions{
		URLs:            js.URLs,
		Collections:     js.Collections,
		CursorFor:       c.resumeAt,
		Compress:        js.Compress,
		MaxMessageBytes: js.MaxMessageBytes,
		StaleTimeout:    js.StaleTimeout,
		BatchSize:       c.o.BatchSize,
		BatchLinger:     c.o.BatchLinger,
		MinBackoff:      c.o.MinBackoff,
		MaxBackoff:      c.o.MaxBackoff,
		Metrics:         c.o.ClientMetrics,
		Log:             c.o.Log.With().Str("component", "jetstream").Logger(),
	}, c.handle)
	if err != nil {
		panic(fmt.Errorf("jetstream client: %w", err))
	}
	c.client = client
	c.runDone = make(chan struct{})
	go func() {
		defer close(c.runDone)
		err := client.Run(context.Background())
		c.root.Send(c.self, &runEnded{err: err})
	}()
	c.log.Info().Int64("cursor", stored).Msg("consumer started")
}

// resumeAt is the cursor to (re)connect to url with.
//
// On the instance this incarnation last committed a batch from, it resumes
// at that batch's last time_us (inclusive, so that event comes again;
// every write is idempotent), less the reorder window when the last
// connection reached new events on the live tail, but never before where
// that connection began to reach them. Rewinding by jetstream.rewind there would only
// replay what this instance already sent us, and a connection that drops
// more often than it can deliver a rewind's worth of events would then
// never get past the cursor.
//
// Everywhere else it rewinds the committed cursor by jetstream.rewind: on
// the first connect of an incarnation (after a restart or a handover we do
// not know which instance the cursor came from) and on a different URL
// (failover), because each Jetstream instance stamps time_us on its own
// clock. Nothing committed yet means the live tail.
//
// Either is capped at cursorLead ahead of this host's clock: a cursor from
// the future (stored by an older version from a mis-stamped event) would
// make Jetstream live-tail and skip everything since the last commit.
func (c *consumer) resumeAt(url string) int64 {
	limit := time.Now().Add(cursorLead).UnixMicro()
	defer func() { c.dialHighUS = c.highUS }()
	if url == c.resumeURL && c.resumeUS > 0 {
		at := c.resumeUS
		live := c.highUS >= time.Now().Add(-liveTailLag).UnixMicro()
		if live && c.highUS > c.dialHighUS {
			// The last connection reached new events on the live tail,
			// which Jetstream sends out of time_us order: events stamped
			// up to reorderWindow before the newest one may still have
			// been on their way. Everything up to where that connection
			// started to break new ground had come before, so never
			// rewind past it: each connection that reaches new events
			// moves the resume point. (A replay from a cursor, further
			// behind than liveTailLag, is in time_us order: it resumes at
			// the last event, and a server that drops a subscriber every
			// few events still moves it on every connection.)
			window := min(reorderWindow, c.o.Jetstream.Rewind).Microseconds()
			at = min(at, max(c.highUS-window, c.dialHighUS))
		}
		return max(1, min(at, limit))
	}
	cur := c.cursor.Load()
	if cur == 0 {
		return 0
	}
	return max(1, min(cur, limit)-c.o.Jetstream.Rewind.Microseconds())
}

// reorderWindow bounds how far out of time_us order Jetstream sends events
// on its live tail (up to 31 ms in the shared capture of real traffic; a
// loaded instance can do worse). See resumeAt and batchCursor.
const reorderWindow = time.Second

// liveTailLag: events stamped within this of the host's clock are taken
// to come from Jetstream's live tail (stamped as they arrive, out of
// order); older ones from a replay out of its time-ordered store.
const liveTailLag = time.Minute

// drainGrace is added to webhooks.timeout to bound a drain of the dispatcher.
const drainGrace = time.Second

// drain runs before a graceful stop, while custody is still held: stop
// reading (the batch in flight commits), then let the webhook dispatcher
// finish and record the deliveries it has in flight, so the next holder
// does not send them again.
func (c *consumer) drain() {
	c.stop()
	if c.disp == nil {
		return
	}
	bound := c.o.Dispatcher.Config.Timeout + drainGrace
	if _, err := c.root.RequestFuture(c.disp, &webhooks.Drain{}, bound).Result(); err != nil {
		c.log.Warn().Err(logval.Error(err)).Msg("webhook dispatcher did not drain; deliveries in flight are resent by the next holder")
	}
}

// stop closes the socket and waits for the Run goroutine: after it
// returns, no batch is in flight and nothing more is written.
func (c *consumer) stop() {
	if c.client == nil {
		return
	}
	_ = c.client.Close()
	<-c.runDone
	c.client = nil
}

// handle commits one batch (the jetstream Handler, on the client's Run
// goroutine; the client reads no further until it returns).
func (c *consumer) handle(ctx context.Context, b jetstream.Batch) error {
	c.logFailures(&b)
	if len(b.Events) == 0 {
		return nil // only undecodable frames: the next event moves the cursor past them
	}
	start := time.Now()
	out, err := commitBatch(ctx, c.o.DB, c.o.Custody, c.o.Processor, c.o.enqueue, b.Events)
	if err != nil && isolable(ctx, err) {
		c.sampled.Warn().Err(logval.Error(err)).Int("events", len(b.Events)).Msg("batch did not commit; retrying it event by event")
		out, err = commitEach(ctx, c.o.DB, c.o.Custody, c.o.Processor, c.o.enqueue, b.Events, func(ev *jetstream.Event, err error) {
			c.o.Processor.ReportSkipped(ev, processor.ReasonDatabase, err)
		})
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopping: the batch is rolled back and replayed by the next holder
		}
		return fmt.Errorf("commit batch of %d events: %w", len(b.Events), err)
	}
	last, newest := batchCursor(b.Events)
	if newest > c.cursor.Load() {
		c.cursor.Store(last)
	}
	if last > 0 {
		c.resumeURL, c.resumeUS = b.URL, last
		c.highUS = max(c.highUS, newest)
	}
	c.o.Metrics.committed(len(b.Events), time.Since(start), c.cursor.Load())
	if len(out.res.HoldStats) > 0 && c.stats != nil {
		c.root.Send(c.stats, &statsview.Observe{Custody: c.o.Custody, Stats: out.res.HoldStats})
	}
	if out.enqueued > 0 {
		c.root.Send(c.disp, &webhooks.Kick{})
	}
	return nil
}

// logFailures logs the frames of b that did not decode (the client has
// counted them in appview_jetstream_decode_errors_total), each class at
// logBurst lines per logPeriod.
func (c *consumer) logFailures(b *jetstream.Batch) {
	for _, f := range b.Failures {
		l, ok := c.frameLog[f.Class]
		if !ok {
			l = c.sampled
		}
		e := l.Warn().Str("class", string(f.Class)).Int64("size", f.Size).Str("url", b.URL)
		if f.TimeUS > 0 {
			e = e.Int64("time_us", f.TimeUS)
		}
		e.Err(logval.Error(f.Err)).Msg("undecodable Jetstream frame skipped")
	}
}

// Metrics are the consumer's Prometheus collectors.
type Metrics struct {
	batches   prometheus.Counter
	events    prometheus.Counter
	commit    prometheus.Histogram
	cursorLag prometheus.Gauge
	cursorTS  prometheus.Gauge
}

// NewMetrics registers on reg: appview_consumer_batches_total,
// appview_consumer_events_total (committed), appview_consumer_commit_seconds
// (one batch: apply, enqueue, cursor, commit), appview_jetstream_cursor_lag_seconds
// (wall clock minus the committed cursor) and
// appview_jetstream_cursor_timestamp_seconds (the committed cursor as a
// Unix time in seconds; it replaces appview_jetstream_cursor_time_us,
// whose unit promlint refuses).
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
		cursorLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "appview_jetstream_cursor_lag_seconds", Help: "Wall clock minus the committed Jetstream cursor, in seconds.",
		}),
		cursorTS: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "appview_jetstream_cursor_timestamp_seconds", Help: "The committed Jetstream cursor (time_us) as a Unix time in seconds.",
		}),
	}
	for _, col := range []prometheus.Collector{m.batches, m.events, m.commit, m.cursorLag, m.cursorTS} {
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
	m.cursorLag.Set(time.Since(time.UnixMicro(cursorUS)).Seconds())
}
