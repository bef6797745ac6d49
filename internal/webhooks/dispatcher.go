package webhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cenkalti/backoff/v5"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
)

// Dispatcher timing.
const (
	// claimGrace is added to webhooks.timeout when a claim pushes
	// next_attempt_at forward: time for building the body and recording the
	// outcome. A claim whose outcome never arrives (the holder died or lost
	// custody mid-request) becomes due again after timeout + claimGrace.
	claimGrace = 5 * time.Second
	// maxIdle caps how long the dispatcher sleeps without looking at the
	// table, however far away the next due delivery is, so a clock step or a
	// row written behind its back is noticed.
	maxIdle = time.Minute
	// scanRetryInitial and scanRetryMax bound the backoff after a scan that
	// failed with a database error.
	scanRetryInitial = 500 * time.Millisecond
	scanRetryMax     = 30 * time.Second
	// stuckRescan is how soon to look again when rows are due but a scan
	// took none of them (they changed under it).
	stuckRescan = time.Second
	// noisyBurst lines per noisyPeriod are logged about single deliveries.
	noisyBurst  = 20
	noisyPeriod = time.Minute
)

// Defaults applied by NewDispatcherProps to zero options.
const (
	// DefaultTimeout is docs/spec.md §9's bound on one attempt.
	DefaultTimeout = 10 * time.Second
	// DefaultConcurrency is how many deliveries are in flight at once.
	DefaultConcurrency = 4
	// DefaultPublicURL is the registry's public site.
	DefaultPublicURL = "https://atcr.io"
)

// Drain asks the dispatcher to claim nothing new and to finish the
// attempts in flight, recording their outcomes (custody is still held
// during a graceful stop); it answers *Drained when done. Send it with
// RequestFuture and bound the wait by webhooks.timeout.
type Drain struct{}

// Drained answers *Drain.
type Drained struct{}

// Kick prompts the dispatcher to look for due deliveries now. The consumer
// sends it after committing a transaction in which EnqueueTx added rows.
type Kick struct{}

// DispatcherOptions configure one dispatcher (one grant of custody).
type DispatcherOptions struct {
	// DB is the shared database.
	DB *database.DB
	// Custody is the consumer's grant (lease "jetstream-consumer"). Every
	// claim and outcome is a fence.Fenced write under it, and requests carry
	// it as X-Appview-Fence.
	Custody fence.Custody
	// Config is the webhooks section: retry_schedule (delays before each
	// attempt; its length is the number of attempts; empty means one
	// immediate attempt), timeout (0: DefaultTimeout), concurrency
	// (0: DefaultConcurrency), public_url ("": DefaultPublicURL), and
	// allow_private (used only when Client is nil).
	Config config.Webhooks
	// Client sends the requests; nil means NewClient(Guard{AllowPrivate:
	// Config.AllowPrivate}). Build it once per process and share it.
	Client *http.Client
	// Metrics are shared between dispatchers; nil means unregistered ones.
	Metrics *Metrics
	// Log receives the dispatcher's log lines.
	Log zerolog.Logger
	// Now is the clock of the webhook-timestamp header (the attempt's
	// time, signed); nil means time.Now. Tests set it to stand for a
	// delivery captured earlier and replayed now.
	Now func() time.Time
}

// NewDispatcherOptions builds what every dispatcher of this process shares,
// once, from the worker's Deps: the checked configuration, the guarded HTTP
// client and the metrics (registered with d.Metrics). The consumer copies
// the result and sets Custody for each grant before NewDispatcherProps.
// The configuration is assumed valid (config.Validate); errors are a
// metrics registration failure.
func NewDispatcherOptions(d workers.Deps) (DispatcherOptions, error) {
	m, err := NewMetrics(d.Metrics)
	if err != nil {
		return DispatcherOptions{}, fmt.Errorf("webhook metrics: %w", err)
	}
	return DispatcherOptions{
		DB:      d.DB,
		Config:  d.Config.Webhooks,
		Client:  NewClient(Guard{AllowPrivate: d.Config.Webhooks.AllowPrivate || d.Config.Network.AllowPrivate}),
		Metrics: m,
		Log:     d.Log.With().Str("component", "webhooks").Logger(),
	}, nil
}

// NewDispatcherProps builds the dispatcher actor, spawned as a child of the
// consumer worker with the consumer's fence.Custody. It drains due
// deliveries on start, on Kick and when the next one falls due. It fails
// (panics with an error wrapping fence.ErrSuperseded) when a claim or
// outcome write finds the custody superseded; its parent treats that as
// lost custody. Stopping cancels requests in flight and waits for them;
// nothing is written after it stopped.
func NewDispatcherProps(o DispatcherOptions) *actor.Props {
	o = withDefaults(o)
	return actor.PropsFromProducer(func() actor.Actor { return newDispatcher(o) })
}

func withDefaults(o DispatcherOptions) DispatcherOptions {
	c := &o.Config
	if len(c.RetrySchedule) == 0 {
		c.RetrySchedule = []time.Duration{0}
	}
	c.RetrySchedule = append([]time.Duration(nil), c.RetrySchedule...)
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.PublicURL == "" {
		c.PublicURL = DefaultPublicURL
	}
	if o.Client == nil {
		o.Client = NewClient(Guard{AllowPrivate: c.AllowPrivate})
	}
	if o.Metrics == nil {
		o.Metrics, _ = NewMetrics(nil)
	}
	o.Log = o.Log.With().Str("lease", o.Custody.Lease).Int64("fence", o.Custody.Fence).Logger()
	return o
}

// Messages the dispatcher sends itself from its goroutines and timer.
type (
	// wake: the timer fired (next due time, or a scan retry).
	wake struct{}
	// scanned: a scan finished.
	scanned struct {
		claimed []attempt
		// pending and next describe the table after the claims: how many
		// rows are pending, and how long until the earliest is due.
		pending int64
		next    time.Duration
		hasNext bool
		// progress: the scan claimed or gave up at least one row.
		progress bool
		err      error
	}
	// attempted: one attempt finished and its outcome was recorded (or not).
	attempted struct {
		a   attempt
		err error // from recording the outcome
	}
)

// dispatcher is the actor. All fields are owned by the actor goroutine;
// goroutines it starts only read o and report back with messages.
type dispatcher struct {
	o   DispatcherOptions
	log zerolog.Logger
	// noisy is log, rate-limited, for lines written once per delivery:
	// a receiver that is down must not flood the log.
	noisy zerolog.Logger
	self  *actor.PID
	root  *actor.RootContext

	// ctx ends when the actor stops (or fails): requests are cancelled and
	// fence.Fenced refuses to commit.
	ctx    context.Context
	cancel context.CancelFunc
	// wg counts the scan and send goroutines; Stopping waits for it.
	wg sync.WaitGroup

	inFlight int
	scanning bool
	// draining: no new scans; drained is answered once nothing is in flight.
	draining bool
	drained  *actor.PID
	// rescan: a reason to look again arrived while a scan was running.
	rescan bool
	timer  *time.Timer
	retry  *backoff.ExponentialBackOff
}

func newDispatcher(o DispatcherOptions) *dispatcher {
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = scanRetryInitial
	retry.MaxInterval = scanRetryMax
	retry.Reset()
	noisy := logval.Sampled(o.Log, noisyBurst, noisyPeriod, "webhook delivery warnings")
	return &dispatcher{o: o, log: o.Log, noisy: noisy, retry: retry}
}

// Receive handles one message on the actor goroutine.
func (d *dispatcher) Receive(c actor.Context) {
	switch msg := c.Message().(type) {
	case *actor.Started:
		d.self = c.Self()
		d.root = c.ActorSystem().Root
		d.ctx, d.cancel = context.WithCancel(context.Background())
		d.log.Debug().Msg("webhook dispatcher started")
		d.scan()
	case *Kick, *wake:
		d.scan()
	case *Drain:
		d.draining, d.drained = true, c.Sender()
		if d.timer != nil {
			d.timer.Stop()
		}
		d.maybeDrained()
	case *scanned:
		d.onScanned(msg)
	case *attempted:
		d.onAttempted(msg)
	case *actor.Stopping, *actor.Restarting:
		d.shutdown()
	case *actor.Stopped:
		d.log.Debug().Msg("webhook dispatcher stopped")
	default:
		d.log.Warn().Str("message_type", fmt.Sprintf("%T", msg)).Msg("unexpected message ignored")
	}
}

// scan starts a scan unless one is running (then it runs again after) or
// every slot is busy (a finishing attempt scans again).
func (d *dispatcher) scan() {
	if d.ctx.Err() != nil || d.draining {
		return
	}
	if d.scanning {
		d.rescan = true
		return
	}
	free := d.o.Config.Concurrency - d.inFlight
	if free <= 0 {
		return
	}
	d.scanning, d.rescan = true, false
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.root.Send(d.self, d.claimDue(d.ctx, free))
	}()
}

func (d *dispatcher) onScanned(s *scanned) {
	d.scanning = false
	defer d.maybeDrained()
	if s.err != nil {
		if d.ctx.Err() != nil {
			return
		}
		if errors.Is(s.err, fence.ErrSuperseded) {
			d.fail(s.err)
		}
		delay := d.retry.NextBackOff()
		d.log.Warn().Err(s.err).Dur("retry_in", delay).Msg("webhook scan failed")
		d.setTimer(delay)
		return
	}
	d.retry.Reset()
	d.o.Metrics.pending.Set(float64(s.pending))
	for _, a := range s.claimed {
		d.start(a) // claimed under this custody: sent even when draining
	}
	if d.draining {
		return
	}
	switch {
	case d.rescan:
		d.scan()
	case !s.hasNext:
		d.setTimer(maxIdle)
	case s.next > 0:
		d.setTimer(s.next)
	case d.inFlight >= d.o.Config.Concurrency:
		// More are due than there are slots: a finishing attempt scans again.
	case s.progress:
		d.scan()
	default:
		// Due rows this scan could not take: look again shortly rather
		// than spin.
		d.setTimer(stuckRescan)
	}
}

// start sends one claimed attempt in its own goroutine and records its
// outcome there; the actor hears back through attempted.
func (d *dispatcher) start(a attempt) {
	d.inFlight++
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		resp := send(d.ctx, d.o.Client, d.o.Custody, a, d.o.Config.Timeout, d.o.Now)
		err := d.record(d.ctx, a, resp)
		d.root.Send(d.self, &attempted{a: a, err: err})
	}()
}

func (d *dispatcher) onAttempted(m *attempted) {
	d.inFlight--
	if m.err != nil && d.ctx.Err() == nil {
		if errors.Is(m.err, fence.ErrSuperseded) {
			d.fail(m.err)
		}
		// The claim stays; the row is due again when it expires.
		d.noisy.Warn().Err(logval.Error(m.err)).Str("event_key", m.a.eventKey).Int64("webhook", m.a.webhookID).
			Msg("webhook outcome not recorded")
	}
	d.scan()
	d.maybeDrained()
}

// maybeDrained answers a Drain once no scan or attempt is in flight.
func (d *dispatcher) maybeDrained() {
	if d.draining && d.drained != nil && !d.scanning && d.inFlight == 0 {
		d.root.Send(d.drained, &Drained{})
		d.drained = nil
	}
}

func (d *dispatcher) setTimer(delay time.Duration) {
	if d.timer != nil {
		d.timer.Stop()
	}
	delay = min(delay, maxIdle)
	self, root := d.self, d.root
	d.timer = time.AfterFunc(delay, func() { root.Send(self, &wake{}) })
}

// fail stops all work and fails the actor with err (its parent decides;
// for ErrSuperseded the LeaseActor treats it as lost custody).
func (d *dispatcher) fail(err error) {
	d.log.Warn().Err(logval.Error(err)).Msg("webhook dispatcher superseded: stopping deliveries")
	d.cancel()
	if d.timer != nil {
		d.timer.Stop()
	}
	panic(fmt.Errorf("webhook dispatcher under %s: %w", d.o.Custody, err))
}

// shutdown cancels requests in flight and waits for every goroutine, so no
// claim or outcome is written once the actor has stopped. A goroutine stuck
// in a database call that ignores its context (go-libsql does) holds the
// stop up until the call returns; fence.Fenced then refuses to commit.
func (d *dispatcher) shutdown() {
	if d.cancel == nil {
		return
	}
	d.cancel()
	if d.timer != nil {
		d.timer.Stop()
	}
	d.wg.Wait()
	d.o.Metrics.pending.Set(0)
}

// dueSQL is the predicate of a due delivery: pending, its webhook still
// there, and next_attempt_at passed (plus, before the first attempt, the
// first delay of the schedule, ?1 ms; see enqueueSQL).
const dueSQL = `d.status = 'pending'
  AND d.next_attempt_at + CASE WHEN d.attempts = 0 THEN ?1 ELSE 0 END <= ` + database.NowMS

const (
	selectDueSQL = `SELECT d.id FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
WHERE ` + dueSQL + ` ORDER BY d.next_attempt_at, d.id LIMIT ?2`

	claimSQL = `UPDATE webhook_deliveries SET
  attempts = attempts + 1,
  next_attempt_at = ` + database.NowMS + ` + ?2,
  fence = ?3,
  payload = ?4,
  updated_at = ` + database.NowMS + `
WHERE id = ?1`

	giveUpSQL = `UPDATE webhook_deliveries SET status = 'failed', last_error = ?2, fence = ?3,
  updated_at = ` + database.NowMS + ` WHERE id = ?1`

	pendingSQL = `SELECT COUNT(*),
  MIN(d.next_attempt_at + CASE WHEN d.attempts = 0 THEN ?1 ELSE 0 END) - ` + database.NowMS + `
FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id WHERE d.status = 'pending'`

	deliveredSQL = `UPDATE webhook_deliveries SET status = 'delivered', last_status_code = ?3, last_error = '',
  updated_at = ` + database.NowMS + ` WHERE id = ?1 AND attempts = ?2 AND status = 'pending'`

	retrySQL = `UPDATE webhook_deliveries SET next_attempt_at = ` + database.NowMS + ` + ?5,
  last_status_code = ?3, last_error = ?4, updated_at = ` + database.NowMS + `
WHERE id = ?1 AND attempts = ?2 AND status = 'pending'`

	failedSQL = `UPDATE webhook_deliveries SET status = 'failed', last_status_code = ?3, last_error = ?4,
  updated_at = ` + database.NowMS + ` WHERE id = ?1 AND attempts = ?2 AND status = 'pending'`
)

// claimReadSQL reads a due delivery and its webhook; the TEXT values go
// through database.Text so a trigger or payload reaches Go unchanged.
var claimReadSQL = `SELECT d.webhook_id, ` + database.Text("d.event_key") + `, ` + database.Text("d.trigger_name") + `, ` +
	database.Text("d.trigger_data") + `, ` + database.Text("d.payload") + `, d.attempts, ` +
	database.Text("w.url") + `, ` + database.Text("w.secret") + `
FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
WHERE d.id = ?2 AND ` + dueSQL

// claimDue finds up to limit due deliveries and claims them in one fenced
// transaction. It runs off the actor goroutine.
func (d *dispatcher) claimDue(ctx context.Context, limit int) *scanned {
	db, cfg := d.o.DB, d.o.Config
	firstMS := cfg.RetrySchedule[0].Milliseconds()
	var out scanned
	ids, err := dueIDs(ctx, db, firstMS, limit)
	if err != nil {
		return &scanned{err: err}
	}
	if len(ids) > 0 {
		var gaveUp int
		err := fence.Fenced(ctx, db, d.o.Custody, func(tx *sql.Tx) error {
			out.claimed, gaveUp = nil, 0
			for _, id := range ids {
				a, claimed, err := d.claim(ctx, tx, id, firstMS)
				if err != nil {
					return err
				}
				if claimed {
					out.claimed = append(out.claimed, a)
				} else if a.id != 0 {
					gaveUp++
				}
			}
			return nil
		})
		if err != nil {
			return &scanned{err: err}
		}
		d.o.Metrics.deliveries.WithLabelValues(OutcomeFailed).Add(float64(gaveUp))
		out.progress = len(out.claimed) > 0 || gaveUp > 0
	}
	var next sql.NullInt64
	if err := db.QueryRowContext(ctx, pendingSQL, firstMS).Scan(&out.pending, &next); err != nil {
		return &scanned{claimed: out.claimed, err: fmt.Errorf("count pending webhook deliveries: %w", err)}
	}
	if next.Valid {
		out.hasNext, out.next = true, time.Duration(next.Int64)*time.Millisecond
	}
	return &out
}

func dueIDs(ctx context.Context, db *database.DB, firstMS int64, limit int) ([]int64, error) {
	rows, err := db.QueryContext(ctx, selectDueSQL, firstMS, limit)
	if err != nil {
		return nil, fmt.Errorf("find due webhook deliveries: %w", err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("find due webhook deliveries: %w", err)
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// claim takes one delivery for an attempt inside the fenced transaction:
// attempts+1, next_attempt_at pushed past the attempt timeout, this fence
// recorded, and on the first attempt the body built and stored. It returns
// claimed=false with a.id == 0 when the row is no longer due, and with
// a.id set when the row was given up instead (schedule already used up by
// attempts whose outcome was lost, or a body that cannot be built).
func (d *dispatcher) claim(ctx context.Context, tx *sql.Tx, id, firstMS int64) (attempt, bool, error) {
	var (
		a           attempt
		triggerData string
		payload     sql.NullString
		attempts    int
	)
	err := tx.QueryRowContext(ctx, claimReadSQL, firstMS, id).Scan(
		&a.webhookID, &a.eventKey, &a.trigger, &triggerData, &payload, &attempts, &a.url, &a.secret)
	if errors.Is(err, sql.ErrNoRows) {
		return attempt{}, false, nil
	}
	if err != nil {
		return attempt{}, false, fmt.Errorf("claim webhook delivery %d: %w", id, err)
	}
	a.id = id
	giveUp := func(reason string) (attempt, bool, error) {
		if _, err := tx.ExecContext(ctx, giveUpSQL, id, reason, d.o.Custody.Fence); err != nil {
			return attempt{}, false, fmt.Errorf("give up webhook delivery %d: %w", id, err)
		}
		d.noisy.Warn().Str("event_key", a.eventKey).Int64("webhook", a.webhookID).Str("reason", logval.String(reason)).
			Msg("webhook delivery failed")
		return a, false, nil
	}
	if attempts >= len(d.o.Config.RetrySchedule) {
		return giveUp(fmt.Sprintf("no outcome recorded for attempt %d of %d (custody ended mid-request)",
			attempts, len(d.o.Config.RetrySchedule)))
	}
	if payload.Valid {
		a.body = []byte(payload.String)
	} else {
		if a.trigger != TriggerPush {
			return giveUp(fmt.Sprintf("unknown trigger %q", a.trigger))
		}
		body, err := buildPushPayload(ctx, tx, triggerData, d.o.Config.PublicURL)
		if errors.Is(err, errBadTriggerData) {
			return giveUp("cannot build body: " + err.Error())
		}
		if err != nil {
			return attempt{}, false, fmt.Errorf("build webhook body %d: %w", id, err)
		}
		a.body = body
	}
	holdMS := (d.o.Config.Timeout + claimGrace).Milliseconds()
	if _, err := tx.ExecContext(ctx, claimSQL, id, holdMS, d.o.Custody.Fence, string(a.body)); err != nil {
		return attempt{}, false, fmt.Errorf("claim webhook delivery %d: %w", id, err)
	}
	a.number = attempts + 1
	return a, true, nil
}

// record writes the outcome of an attempt with a fenced write. An abandoned
// attempt (the dispatcher is stopping) writes nothing.
func (d *dispatcher) record(ctx context.Context, a attempt, r response) error {
	if r.result == resultAbandoned {
		return nil
	}
	d.o.Metrics.latency.Observe(r.elapsed.Seconds())
	schedule := d.o.Config.RetrySchedule
	var outcome string
	err := fence.Fenced(ctx, d.o.DB, d.o.Custody, func(tx *sql.Tx) error {
		var err error
		switch {
		case r.result == resultDelivered:
			outcome = OutcomeDelivered
			_, err = tx.ExecContext(ctx, deliveredSQL, a.id, a.number, r.status)
		case r.result == resultRefused:
			outcome = OutcomeRefused
			_, err = tx.ExecContext(ctx, failedSQL, a.id, a.number, r.status, r.message)
		case a.number < len(schedule):
			outcome = OutcomeRetried
			_, err = tx.ExecContext(ctx, retrySQL, a.id, a.number, r.status, r.message, max(schedule[a.number], r.retryAfter).Milliseconds())
		default:
			outcome = OutcomeFailed
			_, err = tx.ExecContext(ctx, failedSQL, a.id, a.number, r.status, r.message)
		}
		if err != nil {
			return fmt.Errorf("record webhook delivery %d attempt %d: %w", a.id, a.number, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	d.o.Metrics.deliveries.WithLabelValues(outcome).Inc()
	ev := d.noisy.Debug()
	if outcome == OutcomeFailed || outcome == OutcomeRefused {
		ev = d.noisy.Warn()
	}
	ev.Str("event_key", a.eventKey).Int64("webhook", a.webhookID).Int("attempt", a.number).
		Str("outcome", outcome).Int("status", r.status).Str("error", logval.String(r.message)).Msg("webhook attempt")
	return nil
}
