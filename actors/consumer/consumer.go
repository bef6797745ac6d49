package consumer

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
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
	DB      *sql.DB
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
	if o.enqueue == nil {
		o.enqueue = webhooks.EnqueueTx
	}
	o.Dispatcher.Custody = o.Custody
	return actor.PropsFromProducer(func() actor.Actor {
		log := o.Log.With().Str("component", "consumer").Str("custody", o.Custody.String()).Logger()
		c := &consumer{o: o, log: log, sampled: sampled(log, "consumer warnings"), frameLog: map[jetstream.ErrorClass]zerolog.Logger{}}
		for _, class := range jetstream.ErrorClasses {
			c.frameLog[class] = sampled(log, "undecodable Jetstream frame skipped ("+string(class)+")")
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

// sampled limits l to logBurst lines per logPeriod and reports, in a
// later line, how many lines of what it held back (logval.Sampled).
func sampled(l zerolog.Logger, what string) zerolog.Logger {
	return logval.Sampled(l, logBurst, logPeriod, what)
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
	// (anchorPosition); it reads the live tail until its first event.
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
	pos, anchored, err := anchorPosition(context.Background(), c.o.DB, c.o.Custody, time.Now())
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

// resumeAt is the cursor to (re)connect to url with: a sequence number
// (below jetstream.CursorSeqMax) or a Unix-microsecond time.
//
// By sequence number, only on the host the position came from: its seq
// there, exactly (Jetstream replays inclusively; the client drops that
// one event), with no rewind and no reordering window. A sequence number
// is never sent to another host: it means nothing there.
//
// By time everywhere else. On a host without sequence numbers (Jetstream
// v1) the position's own time_us is that host's clock: a reconnect of
// this incarnation resumes at the last event it delivered (see
// resumeAtTime), a first connect rewinds by jetstream.rewind. On another
// host (failover), or for a position stored before per-host positions,
// time_us is a foreign clock (a host that lagged stamps old events with
// late times), so the resume time is the position's shared time (commit
// rev / relay time, sharedTime) less jetstream.rewind, relying on
// idempotent apply for the overlap. The incarnation that found no
// position stored one (anchorPosition: an empty host, shared time = when it
// began) and reads the live tail until its first event arrives; after
// that, and for every successor, the anchor is a position in time like
// any other on the v2 wire, so a holder killed before its first commit
// hands on where it began instead of nothing. On the legacy wire an
// anchor alone means no cursor (see the comment inside).
//
// A time is capped at cursorLead ahead of this host's clock: a cursor
// from the future makes Jetstream live-tail and skip everything since.
func (c *consumer) resumeAt(url string) int64 {
	host := jetstream.HostOf(url)
	p := c.pos
	if p.Host == "" && p.TimeUS == 0 && p.SharedUS > 0 &&
		(jetstream.WireOf(url) != jetstream.WireV2 || (c.anchored && c.client.LastEvent().IsZero())) {
		// Only an anchor (nothing processed yet). The incarnation that
		// began it has received nothing: the live tail, as for a first
		// start. On the legacy wire, always: the anchor is this host's
		// wall clock, and a legacy endpoint may serve a capture whose
		// events are all older than that (appview jetstream-replay), so a
		// time cursor from it would skip them all, where no cursor replays
		// them. On the v2 wire a time cursor is translated against when the
		// server saw each event, so the anchor less the rewind is exact.
		return 0
	}
	if p.Host == host && p.Seq > 0 {
		c.dialHighUS = c.highUS
		if p.CheckSeq > 0 && p.CheckSeq <= p.Seq {
			return p.CheckSeq // its event is checked (seqTimeAt)
		}
		return p.Seq
	}
	if p.Host == host || (p.Host == "" && p.SharedUS == 0) {
		return c.resumeAtTime(url)
	}
	c.dialHighUS = c.highUS
	t := p.SharedUS
	if t == 0 {
		t = p.TimeUS
	}
	if t == 0 {
		return 0
	}
	limit := time.Now().Add(cursorLead).UnixMicro()
	return max(jetstream.CursorSeqMax, min(t, limit)-c.o.Jetstream.Rewind.Microseconds())
}

// seqTimeAt is the time_us read for the event at the seq resumeAt gave
// url's host (Position.CheckUS; 0 when unknown or the position is not
// in that host's seq space).
func (c *consumer) seqTimeAt(url string) int64 {
	if p := c.pos; p.Host == jetstream.HostOf(url) && p.Seq > 0 && p.CheckSeq > 0 && p.CheckSeq <= p.Seq {
		return p.CheckUS
	}
	return 0
}

// resumeAtTime is the time cursor for url on a host whose position is in
// time space (Jetstream v1).
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
// Otherwise (the first connect of an incarnation) it rewinds the
// committed cursor by jetstream.rewind.
func (c *consumer) resumeAtTime(url string) int64 {
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
		return max(jetstream.CursorSeqMax, min(at, limit))
	}
	cur := c.cursor.Load()
	if cur == 0 {
		return 0
	}
	return max(jetstream.CursorSeqMax, min(cur, limit)-c.o.Jetstream.Rewind.Microseconds())
}

// reorderWindow bounds how far out of time_us order Jetstream sends events
// on its live tail (up to 31 ms in the shared capture of real traffic; a
// loaded instance can do worse). See resumeAt and batchCursor.
const reorderWindow = time.Second

// liveTailLag: events stamped within this of the host's clock are taken
// to come from Jetstream's live tail (stamped as they arrive, out of
// order); older ones from a replay out of its time-ordered store.
const liveTailLag = time.Minute

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

// healthTick is how often the consumer re-evaluates its health report.
const healthTick = time.Second

// reportHealth keeps Options.Health current until bg closes: unhealthy
// while no event arrived from any upstream for jetstream.unhealthy_after
// (counted from the start of this incarnation before the first event).
func (c *consumer) reportHealth(client *jetstream.Client) {
	if c.o.Health == nil {
		return
	}
	started := time.Now()
	bound := c.o.Jetstream.UnhealthyAfter
	t := time.NewTicker(min(healthTick, max(bound/4, time.Millisecond)))
	defer t.Stop()
	for {
		last := client.LastEvent()
		if last.IsZero() {
			last = started
		}
		if silent := time.Since(last); bound > 0 && silent > bound {
			c.o.Health.Set(false, fmt.Sprintf("no Jetstream event from any upstream for %v (unreachable or silent)", silent.Truncate(time.Second)))
		} else {
			c.o.Health.Set(true, "")
		}
		select {
		case <-c.bg:
			return
		case <-t.C:
		}
	}
}

// cursorTooOld is told (on the client's Run goroutine) that host url
// refused cursor as older than its lookback, whose oldest event is floor:
// the events in between are gone from that host. The client resumes from
// floor. Here the gap is recorded (jetstream_gaps) and, in the same fenced
// transaction, a backfill run is requested: an unfinished backfill_runs
// row that the backfill worker resumes at its next run (the next
// backfill.interval tick, or the next grant of its lease with interval 0),
// re-reading every io.atcr.* record the gap may have hidden.
func (c *consumer) cursorTooOld(url string, cursor, floor int64) {
	c.log.Error().Str("url", logval.RedactURL(url)).Int64("cursor", cursor).Int64("floor", floor).Int64("gap_events", floor-cursor).
		Msg("Jetstream gap: events between the stored position and the host's oldest event are lost; resuming from the oldest and requesting a backfill run")
	c.recordGap(url, cursor, floor, nil)
}

// outdatedCursor is told (on the connection's reader goroutine) that host
// url clamped the time cursor cursorUS to its oldest event, the first one
// after the advisory being at firstUS (seq firstSeq): the events between
// are gone from that host, as with cursorTooOld, but measured in time.
// The gap is recorded with its times (from_seq 0: no seq was sent) and a
// backfill run requested, in one fenced transaction.
func (c *consumer) outdatedCursor(url string, cursorUS, firstUS, firstSeq int64) {
	c.log.Error().Str("url", logval.RedactURL(url)).Int64("cursor_us", cursorUS).Int64("first_us", firstUS).
		Dur("gap", time.Duration(firstUS-cursorUS)*time.Microsecond).
		Msg("Jetstream gap: the host no longer has events as old as the time cursor (OutdatedCursor); resuming from its oldest and requesting a backfill run")
	c.recordGap(url, 0, firstSeq, &[2]int64{cursorUS, firstUS})
}

// recordGap records a gap of host url, seqs fromSeq to toSeq and, when
// times is not nil, times[0] to times[1] (Unix µs), requests a backfill
// run (for repositories new here) and, with re-reads enabled, queues a
// re-read of every repository held here (for deletes the gap hid), in one
// fenced transaction; it logs a failure.
func (c *consumer) recordGap(url string, fromSeq, toSeq int64, times *[2]int64) {
	c.o.Metrics.gap()
	var queued int64
	var fromUS, toUS any
	if times != nil {
		fromUS, toUS = times[0], times[1]
	}
	err := fence.Fenced(context.Background(), c.o.DB, c.o.Custody, func(tx *sql.Tx) error {
		if _, err := tx.Exec(`INSERT INTO jetstream_gaps (host, from_seq, to_seq, detected_at, fence, from_time_us, to_time_us)
VALUES (?1, ?2, ?3, `+database.NowMS+`, ?4, ?5, ?6)`,
			jetstream.HostOf(url), fromSeq, toSeq, c.o.Custody.Fence, fromUS, toUS); err != nil {
			return fmt.Errorf("record gap: %w", err)
		}
		if _, err := tx.Exec(requestBackfillSQL, c.o.Custody.Fence, reasonGap); err != nil {
			return fmt.Errorf("request backfill run: %w", err)
		}
		if c.o.Resync == nil {
			return nil
		}
		r, err := tx.Exec(requestGapResyncsSQL, reasonGap)
		if err == nil {
			queued, err = r.RowsAffected()
		}
		if err != nil {
			return fmt.Errorf("queue re-reads: %w", err)
		}
		return nil
	})
	if err != nil {
		c.log.Error().Err(err).Msg("Jetstream gap not recorded; no backfill requested")
		return
	}
	if c.o.Resync != nil {
		c.log.Warn().Int64("repositories", queued).Msg("re-reads queued after a Jetstream gap: every repository held here, from its PDS")
		c.o.Resync.Kick()
	}
}

// requestGapResyncsSQL queues a re-read (reason ?1) of every repository
// the database holds a record of; one already queued keeps its place. A
// backfill run only adds what it lists, with no rev: a record deleted, or
// deleted and created again, while the events were lost would stay as it
// was. A re-read lists the repository at its rev and removes what it no
// longer holds (resync.go).
const requestGapResyncsSQL = `INSERT INTO repo_resyncs (did, reason, requested_at, next_at)
SELECT did, ?1, ` + database.NowMS + `, ` + database.NowMS + ` FROM (
  SELECT did FROM users UNION SELECT did FROM manifests UNION SELECT did FROM tags
  UNION SELECT did FROM stars UNION SELECT did FROM repo_pages UNION SELECT hold_did FROM hold_captains
  UNION SELECT hold_did FROM hold_crew UNION SELECT hold_did FROM repository_hold_stats
) WHERE true
ON CONFLICT (did) DO NOTHING`

// seqReset is told (on the client's Run goroutine) that url's host
// numbers its events below the stored seq: it forgot them. The stored
// position drops its seq (fenced), so the host is resumed by time (its
// time_us less jetstream.rewind) and the next batch from it writes its new
// numbering; events the host sent while it was behind our number are not
// lost, they are replayed by time.
func (c *consumer) seqReset(url string) {
	host := jetstream.HostOf(url)
	if c.pos.Host != host {
		return
	}
	c.pos.Seq, c.pos.CheckSeq, c.pos.CheckUS = 0, 0, 0
	c.resumeURL, c.resumeUS = "", 0
	err := fence.Fenced(context.Background(), c.o.DB, c.o.Custody, func(tx *sql.Tx) error {
		_, err := tx.Exec(`UPDATE jetstream_cursor SET seq = 0, check_seq = 0, check_us = 0 WHERE id = 1 AND host = ?1`, host)
		return err
	})
	if err != nil {
		c.log.Error().Err(err).Msg("Jetstream sequence reset not recorded")
	}
}

// requestBackfillSQL adds an unfinished backfill run unless one is
// already pending: the backfill worker resumes the latest unfinished run
// before anything else (actors/backfill claimRun).
const requestBackfillSQL = `INSERT INTO backfill_runs (started_at, fence, holder, updated_at)
SELECT ` + database.NowMS + `, ?1, ?2, ` + database.NowMS + `
WHERE NOT EXISTS (SELECT 1 FROM backfill_runs WHERE completed_at IS NULL)`

// handle commits one batch (the jetstream Handler, on the client's Run
// goroutine; the client reads no further until it returns), in as many
// transactions as jetstream.commit_budget needs (commitPrefixAt).
func (c *consumer) handle(ctx context.Context, b jetstream.Batch) error {
	c.logFailures(&b)
	host := jetstream.HostOf(b.URL)
	if len(b.Events) == 0 && (b.MaxSeq == 0 || (host == c.pos.Host && b.MaxSeq <= c.pos.Seq)) {
		return nil // only undecodable frames without a position: the next event moves it past them
	}
	rest := b.Events
	for {
		n, err := c.commitPart(ctx, b.URL, host, rest, b.MaxSeq, len(b.Failures))
		if err != nil {
			return err
		}
		rest = rest[n:]
		if len(rest) == 0 {
			return nil
		}
	}
}

// commitPart commits a prefix of events, the rest of one batch (all of it
// on the event-by-event fallback), and moves the in-memory position, the
// metrics and the StatsCache, dispatcher and re-reader on by what
// committed. It returns how many events it committed: at least one when
// events is not empty, all of them when ctx ended (the rest is replayed
// by the next holder).
func (c *consumer) commitPart(ctx context.Context, url, host string, events []jetstream.Event, maxSeq int64, failures int) (int, error) {
	start := time.Now()
	// high: the newest time_us this incarnation committed on host's
	// stream, which this part continues (see positionOf).
	var high int64
	if host == c.pos.Host && c.pos.Seq == 0 {
		high = c.highUS
	}
	out, n, err := commitPrefixAt(ctx, c.o.DB, c.o.Custody, c.o.Processor, c.o.enqueue, host, events, maxSeq, high, c.o.Jetstream.CommitBudget)
	if err != nil && isolable(ctx, err) {
		c.sampled.Warn().Err(logval.Error(err)).Int("events", len(events)).Msg("batch did not commit; retrying it event by event")
		n = len(events)
		out, err = commitEachAt(ctx, c.o.DB, c.o.Custody, c.o.Processor, c.o.enqueue, host, events, maxSeq, high, func(ev *jetstream.Event, err error) {
			c.o.Processor.ReportSkipped(ev, processor.ReasonDatabase, err)
		})
	}
	if err != nil {
		if ctx.Err() != nil {
			return len(events), nil // stopping: the batch is rolled back and replayed by the next holder
		}
		return 0, fmt.Errorf("commit batch of %d events: %w", len(events), err)
	}
	part := events[:n]
	var pos batchPosition
	if out.pos != nil {
		pos = *out.pos // what the transaction saved
	} else {
		pos = positionOf(host, part, prefixSeq(events, n, maxSeq), high)
	}
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
		c.resumeURL, c.resumeUS = url, last
		c.highUS = max(c.highUS, newest)
	}
	c.o.Metrics.committed(len(part), time.Since(start), c.cursor.Load())
	c.o.Metrics.screened(out.stale, out.future, out.syncs, pos.seq)
	if out.future > 0 {
		c.sampled.Warn().Int("commits", out.future).Str("last", logval.String(out.lastFuture)).
			Msg("commits with a rev more than 5 minutes ahead of this host's clock skipped (the reference relay refuses them too)")
	}
	if e := c.log.Debug(); e.Enabled() {
		var first int64
		if len(part) > 0 {
			first = part[0].Seq
		}
		e.Str("host", host).Int64("first_seq", first).Int64("last_seq", pos.seq).Int("events", len(part)).
			Int("failures", failures).Int("stale", out.stale).Int("future_rev", out.future).Msg("jetstream batch committed")
	}
	if out.syncs > 0 && c.o.Resync != nil {
		c.o.Resync.Kick()
	}
	if len(out.res.HoldStats) > 0 && c.stats != nil {
		c.root.Send(c.stats, &processor.ObserveStats{Custody: c.o.Custody, Stats: out.res.HoldStats})
	}
	if out.enqueued > 0 {
		c.root.Send(c.disp, &webhooks.Kick{})
	}
	return n, nil
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

// Metrics are the consumer's Prometheus collectors.
type Metrics struct {
	batches   prometheus.Counter
	events    prometheus.Counter
	commit    prometheus.Histogram
	cursorLag prometheus.GaugeFunc
	// cursorUS is the committed cursor (Unix µs) of the consumer running
	// in this process, 0 while none runs (a standby): what cursorLag is
	// computed from when scraped.
	cursorUS atomic.Int64
	cursorTS prometheus.Gauge
	seq      prometheus.Gauge
	stale    prometheus.Counter
	future   prometheus.Counter
	syncs    prometheus.Counter
	gaps     prometheus.Counter
}

// NewMetrics registers on reg: appview_consumer_batches_total,
// appview_consumer_events_total (committed), appview_consumer_commit_seconds
// (one batch: apply, enqueue, cursor, commit), appview_jetstream_cursor_lag_seconds
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
// events queued for a re-read) and appview_jetstream_gaps_total
// (CursorTooOld refusals that requested a backfill).
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
	}
	m.cursorLag = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "appview_jetstream_cursor_lag_seconds", Help: "Wall clock minus the committed Jetstream cursor, in seconds (0 while this instance runs no consumer).",
	}, m.lag)
	for _, col := range []prometheus.Collector{m.batches, m.events, m.commit, m.cursorLag, m.cursorTS, m.seq, m.stale, m.future, m.syncs, m.gaps} {
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
