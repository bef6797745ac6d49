package consumer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
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
	DB      *database.DB
	Custody fence.Custody
	Log     zerolog.Logger
	// Jetstream is the jetstream section: urls, collections, compress,
	// rewind, stale_timeout, max_message_bytes, commit_budget (0: a
	// batch is applied in one transaction, however long it takes).
	Jetstream config.Jetstream
	// Processor applies the events; share one per process.
	Processor *processor.Processor
	// DrainBudget bounds a graceful stop's wait for the webhook
	// dispatcher's deliveries in flight; 0 means workers.DrainBudget.
	// The worker sets it to at most half of shutdown_timeout, so the
	// release still lands within the stop.
	DrainBudget time.Duration
	// Dispatcher configures the webhook dispatcher child (its Custody is
	// set to Custody here).
	Dispatcher webhooks.DispatcherOptions
	// Stats builds the StatsCache child that this grant's per-hold stats
	// are sent to (statscache.New); nil runs without one.
	Stats processor.StatsProps
	// ClientMetrics and Metrics may be nil.
	ClientMetrics *jetstream.Metrics
	Metrics       *Metrics
	// BatchSize and BatchLinger shape the client's batches (0: the
	// jetstream defaults); MinBackoff and MaxBackoff its reconnect delay.
	BatchSize              int
	BatchLinger            time.Duration
	MinBackoff, MaxBackoff time.Duration
	// Health is the worker's self-report (workers.Spec.Health): unhealthy
	// while no upstream delivered an event for jetstream.unhealthy_after.
	// nil: not reported.
	Health *workers.Health
	// Resync re-reads repositories a #sync names; nil disables re-reads
	// (they stay queued in repo_resyncs).
	Resync *Resyncer

	// enqueue replaces webhooks.EnqueueTx in tests.
	enqueue enqueueFunc
}

// NewProps returns the props of the consumer actor for one grant of custody.
func NewProps(o Options) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return newConsumer(o) }, actor.WithSupervisor(escalate))
}

// newConsumer is the consumer actor of one grant of custody, before it
// starts: its loggers and its pipeline.
func newConsumer(o Options) *consumer {
	o.Dispatcher.Custody = o.Custody
	log := o.Log.With().Str("component", "consumer").Str("custody", o.Custody.String()).Logger()
	c := &consumer{o: o, log: log, sampled: sampled(log, "consumer warnings"), frameLog: map[jetstream.ErrorClass]zerolog.Logger{}}
	for _, class := range jetstream.ErrorClasses {
		c.frameLog[class] = sampled(log, "undecodable Jetstream frame skipped ("+string(class)+")")
	}
	c.pipe = newPipeline(o, c.sampled)
	return c
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

// sampled limits l to logBurst lines per logPeriod and reports, in a
// later line, how many lines of what it held back (logval.Sampled).
func sampled(l zerolog.Logger, what string) zerolog.Logger {
	return logval.Sampled(l, logBurst, logPeriod, what)
}

// runEnded reports that the client's Run returned.
type runEnded struct{ err error }

type consumer struct {
	o Options
	// pipe takes each batch to the database; every write goes through it.
	pipe *pipeline
	log  zerolog.Logger
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
	// cursor is the time_us of the last committed batch (for metrics).
	cursor atomic.Int64
	// pos is the stored position as this incarnation last wrote it
	// (loaded at start). Only the client's Run goroutine touches it after
	// start (the handler and CursorFor both run there).
	pos Position
	// bg is closed to stop the health and resync goroutines; bgDone
	// counts them.
	bg     chan struct{}
	bgDone sync.WaitGroup
	// resumeURL and resumeUS are where this incarnation left off: the
	// endpoint its last committed batch was read from and that batch's
	// last time_us (see resumeAt). Only the client's Run goroutine touches
	// them (the handler and CursorFor both run there).
	resumeURL string
	resumeUS  int64
	// highUS is the largest time_us this incarnation committed; dialHighUS
	// is what it was when the current connection was dialled.
	highUS, dialHighUS int64
	// anchored: this incarnation stored the position it began at
	// (pipeline.anchor); it reads the live tail until its first event.
	anchored bool
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
	pos, anchored, err := c.pipe.anchor(context.Background(), time.Now())
	if err != nil {
		panic(err)
	}
	c.anchored = anchored
	c.pos = pos
	stored := pos.TimeUS
	c.cursor.Store(stored)
	c.o.Metrics.following(stored)
	if c.o.Stats != nil {
		c.stats = ctx.Spawn(c.o.Stats(c.o.Custody))
	}
	c.disp = ctx.Spawn(webhooks.NewDispatcherProps(c.o.Dispatcher))
	js := c.o.Jetstream
	client, err := jetstream.NewClient(jetstream.ClientOptions{
		URLs:             js.URLs,
		Collections:      js.Collections,
		CursorFor:        c.resumeAt,
		SeqTimeFor:       c.seqTimeAt,
		Compress:         js.Compress,
		MaxMessageBytes:  js.MaxMessageBytes,
		StaleTimeout:     js.StaleTimeout,
		FailbackInterval: js.FailbackInterval,
		BatchSize:        c.o.BatchSize,
		BatchLinger:      c.o.BatchLinger,
		MinBackoff:       c.o.MinBackoff,
		MaxBackoff:       c.o.MaxBackoff,
		Metrics:          c.o.ClientMetrics,
		Log:              c.o.Log.With().Str("component", "jetstream").Logger(),
		OnCursorTooOld:   c.cursorTooOld,
		OnOutdatedCursor: c.outdatedCursor,
		OnSeqReset:       c.seqReset,
		// Records are decoded on the reading goroutine, beside the commits.
		Prepare: processor.Prepare,
	}, c.handle)
	if err != nil {
		panic(fmt.Errorf("jetstream client: %w", err))
	}
	c.client = client
	c.bg = make(chan struct{})
	c.bgDone.Add(1)
	go func() {
		defer c.bgDone.Done()
		c.reportHealth(client)
	}()
	if c.o.Resync != nil {
		c.bgDone.Add(1)
		go func() {
			defer c.bgDone.Done()
			c.o.Resync.Run(c.bg, c.o.Custody)
		}()
	}
	c.runDone = make(chan struct{})
	go func() {
		defer close(c.runDone)
		err := client.Run(context.Background())
		c.root.Send(c.self, &runEnded{err: err})
	}()
	c.log.Info().Int64("cursor", stored).Str("host", pos.Host).Int64("seq", pos.Seq).Int64("shared_us", pos.SharedUS).Msg("consumer started")
}

// drainGrace is added to webhooks.timeout to bound a drain of the
// dispatcher, itself bounded by workers.DrainBudget: a webhooks.timeout
// longer than that (a receiver that hangs) would keep the consumer from
// stopping, and the whole instance's stop past shutdown_timeout. A
// delivery still in flight then is cancelled when the dispatcher stops
// and sent again by the next holder (at least once).
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
	budget := c.o.DrainBudget
	if budget <= 0 {
		budget = workers.DrainBudget
	}
	bound := min(c.o.Dispatcher.Config.Timeout+drainGrace, budget)
	if _, err := c.root.RequestFuture(c.disp, &webhooks.Drain{}, bound).Result(); err != nil {
		c.log.Warn().Err(logval.Error(err)).Msg("webhook dispatcher did not drain; deliveries in flight are resent by the next holder")
	}
}

// stop closes the socket and waits for the Run goroutine and the
// background goroutines: after it returns, no batch or re-read is in
// flight and nothing more is written.
func (c *consumer) stop() {
	if c.client == nil {
		return
	}
	close(c.bg)
	_ = c.client.Close()
	<-c.runDone
	c.bgDone.Wait()
	c.client = nil
	c.o.Metrics.following(0)
}

// handle commits one batch (the jetstream Handler, on the client's Run
// goroutine; the client reads no further until it returns): it hands the
// batch to the pipeline, in as many transactions as
// jetstream.commit_budget needs, and after each moves the consumer on by
// what committed (advance). An error ends Run.
func (c *consumer) handle(ctx context.Context, b jetstream.Batch) error {
	c.logFailures(&b)
	host := jetstream.HostOf(b.URL)
	if len(b.Events) == 0 && (b.MaxSeq == 0 || (host == c.pos.Host && b.MaxSeq <= c.pos.Seq)) {
		return nil // only undecodable frames without a position: the next event moves it past them
	}
	rest, received := b.Events, b.Received
	if len(received) != len(rest) {
		received = nil // a batch built by hand: no arrival times
	}
	for {
		start := time.Now()
		// high: the newest time_us this incarnation committed on host's
		// stream, which this part continues (see positionOf).
		p := part{host: host, events: rest, maxSeq: b.MaxSeq}
		if host == c.pos.Host && c.pos.Seq == 0 {
			p.high = c.highUS
		}
		out, err := c.pipe.commit(ctx, p)
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopping: the batch is rolled back and replayed by the next holder
			}
			return fmt.Errorf("commit batch of %d events: %w", len(rest), err)
		}
		var arrived []time.Time
		if received != nil {
			arrived, received = received[:out.n], received[out.n:]
		}
		c.advance(&b, rest[:out.n], arrived, out, out.at.Sub(start))
		rest = rest[out.n:]
		if len(rest) == 0 {
			return nil
		}
	}
}

// advance moves the in-memory position, the metrics and the StatsCache,
// dispatcher and re-reader on by what one commit of batch b did: events
// (whose frames arrived at arrived, nil when unknown), in took.
func (c *consumer) advance(b *jetstream.Batch, events []jetstream.Event, arrived []time.Time, out committed, took time.Duration) {
	pos := out.pos
	if pos.host != c.pos.Host || (pos.seq > 0 && pos.seq > c.pos.Seq) || (pos.seq == 0 && pos.last > 0 && pos.reached >= c.pos.TimeUS) {
		if acceptShared(c.pos, pos.host, pos.shared) {
			c.pos.SharedUS = pos.shared
		}
		if pos.checkSeq > 0 {
			c.pos.CheckSeq, c.pos.CheckUS = pos.checkSeq, pos.checkUS
		} else if pos.host != c.pos.Host {
			c.pos.CheckSeq, c.pos.CheckUS = 0, 0
		}
		c.pos.Host, c.pos.Seq = pos.host, pos.seq
		if pos.last > 0 {
			c.pos.TimeUS = pos.last
		}
	}
	last, newest := pos.last, pos.newest
	if pos.reached >= c.cursor.Load() || pos.seq > 0 {
		if last > 0 {
			c.cursor.Store(last)
		}
	}
	if last > 0 {
		c.resumeURL, c.resumeUS = b.URL, last
		c.highUS = max(c.highUS, newest)
	}
	c.o.Metrics.committed(len(events), took, c.cursor.Load())
	c.o.Metrics.eventsCommitted(arrived, out.at)
	c.o.Metrics.screened(out.stale, out.future, out.syncs, pos.seq)
	if out.future > 0 {
		c.sampled.Warn().Int("commits", out.future).Str("last", logval.String(out.lastFuture)).
			Msg("commits with a rev more than 5 minutes ahead of this host's clock skipped (the reference relay refuses them too)")
	}
	if e := c.log.Debug(); e.Enabled() {
		var first int64
		if len(events) > 0 {
			first = events[0].Seq
		}
		e.Str("host", pos.host).Int64("first_seq", first).Int64("last_seq", pos.seq).Int("events", len(events)).
			Int("failures", len(b.Failures)).Int("stale", out.stale).Int("future_rev", out.future).
			Int64("committed_us", out.at.UnixMicro())
		if len(arrived) > 0 {
			e.Int64("arrived_us", arrived[0].UnixMicro()) // the first frame's, at the socket
		}
		e.Msg("jetstream batch committed")
	}
	c.o.Metrics.lifecycle(out.rereads, out.shed)
	if out.shed > 0 {
		c.sampled.Warn().Int("shed", out.shed).Int("limit", firstEventQueueMax).
			Msg("re-reads asked for by first events of unknown accounts not queued: the queue holds the most it may of them; a backfill run reads those repositories")
	}
	if (out.syncs > 0 || out.rereads > 0) && c.o.Resync != nil {
		c.o.Resync.Kick()
	}
	if len(out.res.HoldStats) > 0 && c.stats != nil {
		c.root.Send(c.stats, &processor.ObserveStats{Custody: c.o.Custody, Stats: out.res.HoldStats})
	}
	if out.enqueued > 0 {
		c.root.Send(c.disp, &webhooks.Kick{})
	}
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
		e := l.Warn().Str("class", string(f.Class)).Int64("size", f.Size).Str("url", logval.RedactURL(b.URL))
		if f.TimeUS > 0 {
			e = e.Int64("time_us", f.TimeUS)
		}
		e.Err(logval.Error(f.Err)).Msg("undecodable Jetstream frame skipped")
	}
}
