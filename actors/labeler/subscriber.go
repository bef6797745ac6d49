package labeler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
	"github.com/cenkalti/backoff/v5"
	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"
)

// Timings and limits. The stale timeout comes from labeler.stale_timeout.
const (
	// DefaultStaleTimeout applies when Options.StaleTimeout is 0.
	DefaultStaleTimeout = 60 * time.Second
	// pingsPerStaleTimeout: a ping goes out every StaleTimeout/3, so two
	// lost pongs in a row are still not taken for a dead connection.
	pingsPerStaleTimeout = 3
	// reconnectMinDefault and reconnectMaxDefault bound the reconnect
	// delay; it doubles per failed attempt with ±50% jitter and starts over
	// once a connection has applied a frame.
	reconnectMinDefault = 1 * time.Second
	reconnectMaxDefault = 2 * time.Minute
	// handshakeTimeout bounds the websocket opening handshake.
	handshakeTimeout = 30 * time.Second
	// DefaultResolveEvery applies when Options.ResolveEvery is 0.
	DefaultResolveEvery = 5 * time.Second
	// maxFrameBytesDefault is the websocket read limit per frame (1 MiB).
	maxFrameBytesDefault = 1 << 20
	// skipLogBurst bad frames or labels are logged per skipLogPeriod; the
	// rest only counted.
	skipLogBurst  = 10
	skipLogPeriod = time.Minute
)

// Options configure a subscriber. DB and Endpoint are required.
type Options struct {
	// DB holds taken_down_subjects and labeler_cursors (migration 0004).
	DB *database.DB
	// Log receives the subscriber's events (JSON lines on stderr in serve).
	Log zerolog.Logger
	// Endpoint is the websocket URL of com.atproto.label.subscribeLabels,
	// as returned by SubscribeURL. It is also the key of the stored cursor.
	Endpoint string
	// StaleTimeout reconnects when neither a frame nor a pong has arrived
	// for this long. 0 means DefaultStaleTimeout.
	StaleTimeout time.Duration
	// Metrics are shared across grants of custody; nil builds unregistered ones.
	Metrics *Metrics
	// Dialer opens the websocket; nil uses one with a 30 s handshake timeout.
	Dialer *websocket.Dialer
	// ReconnectMin and ReconnectMax bound the jittered exponential
	// reconnect delay; 0 means 1 s and 2 min.
	ReconnectMin, ReconnectMax time.Duration
	// MaxFrameBytes is the read limit per websocket message; 0 means 1 MiB.
	MaxFrameBytes int64
	// ResolveEvery is how often takedowns of manifest or tag records that
	// were not indexed when their label arrived are looked up again (and
	// applied once their record is): the longest a takedown can trail its
	// record's indexing. 0 means DefaultResolveEvery.
	ResolveEvery time.Duration
	// AfterWrite, when set, runs after every committed database write (a
	// hook for tests and instrumentation: it proves when writes happen).
	AfterWrite func()
}

func (o Options) withDefaults() Options {
	if o.StaleTimeout <= 0 {
		o.StaleTimeout = DefaultStaleTimeout
	}
	if o.Metrics == nil {
		o.Metrics, _ = NewMetrics(nil) // unregistered: cannot fail
	}
	if o.Dialer == nil {
		o.Dialer = &websocket.Dialer{Proxy: websocket.DefaultDialer.Proxy, HandshakeTimeout: handshakeTimeout}
	}
	if o.ReconnectMin <= 0 {
		o.ReconnectMin = reconnectMinDefault
	}
	if o.ReconnectMax <= 0 {
		o.ReconnectMax = reconnectMaxDefault
	}
	if o.ReconnectMax < o.ReconnectMin {
		o.ReconnectMax = o.ReconnectMin
	}
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = maxFrameBytesDefault
	}
	if o.ResolveEvery <= 0 {
		o.ResolveEvery = DefaultResolveEvery
	}
	return o
}

// NewProps builds the subscriber actor for one grant of custody c of the
// labeler-subscriber lease. Every database write is fenced by c.
func NewProps(o Options, c fence.Custody) *actor.Props {
	o = o.withDefaults()
	return actor.PropsFromProducer(func() actor.Actor { return newSubscriber(o, c) })
}

// subscriber is the worker actor: it owns at most one session goroutine
// (one websocket connection) at a time and schedules reconnects.
type subscriber struct {
	o       Options
	custody fence.Custody
	store   *store
	log     zerolog.Logger
	skipLog zerolog.Logger
	backoff *backoff.ExponentialBackOff

	root  *actor.RootContext
	self  *actor.PID
	timer *scheduler.TimerScheduler

	cancelTimer    scheduler.CancelFunc
	cancelSession  context.CancelFunc
	cancelResolver context.CancelFunc
	// sessions counts the session goroutine and the resolver goroutine.
	sessions sync.WaitGroup
	stopping bool
}

// connect asks the subscriber to open a connection (sent by the reconnect timer).
type connect struct{}

// resolverFailed reports that the resolver goroutine found the custody
// superseded and stopped.
type resolverFailed struct{ err error }

// sessionEnded reports that a connection ended without the actor asking.
type sessionEnded struct {
	// progressed is true when the connection applied at least one frame.
	progressed bool
	err        error
}

func newSubscriber(o Options, c fence.Custody) *subscriber {
	log := o.Log.With().Str("worker", LeaseName).Str("lease", c.Lease).Int64("fence", c.Fence).
		Str("endpoint", o.Endpoint).Logger()
	skipLog := logval.Sampled(log, skipLogBurst, skipLogPeriod, "labeler frame skipped")
	bo := &backoff.ExponentialBackOff{
		InitialInterval:     o.ReconnectMin,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         o.ReconnectMax,
	}
	bo.Reset()
	return &subscriber{
		o:       o,
		custody: c,
		log:     log,
		skipLog: skipLog,
		backoff: bo,
		store: &store{
			db: o.DB, endpoint: o.Endpoint, custody: c,
			skipLog: skipLog, afterWrite: o.AfterWrite,
		},
	}
}

// Receive handles the actor's lifecycle and its two messages.
func (s *subscriber) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		s.self = ctx.Self()
		s.root = ctx.ActorSystem().Root
		// The root context may be used from the timer's goroutine; the
		// actor's own context may not.
		s.timer = scheduler.NewTimerScheduler(s.root)
		s.log.Info().Msg("labeler subscriber started")
		s.startResolver()
		s.connect()
	case *resolverFailed:
		s.lostCustody(msg.err)
	case *connect:
		s.cancelTimer = nil
		s.connect()
	case *sessionEnded:
		s.ended(msg)
	case *workers.Drain:
		// A graceful stop is coming: nothing is in flight that needs
		// custody after this frame's commit; Stopping ends the session.
	case *actor.Stopping:
		s.stop()
	case *actor.Restarting:
		s.stop()
	case *actor.Stopped:
		s.log.Info().Msg("labeler subscriber stopped")
	default:
		s.log.Warn().Str("message_type", fmt.Sprintf("%T", msg)).Msg("unexpected message ignored")
	}
}

// connect starts a session goroutine unless one is running or the actor is stopping.
func (s *subscriber) connect() {
	if s.stopping || s.cancelSession != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancelSession = cancel
	s.sessions.Add(1)
	go func() {
		defer s.sessions.Done()
		progressed, err := s.session(ctx)
		if ctx.Err() != nil {
			return // the actor cancelled it: it is stopping and not listening
		}
		s.root.Send(s.self, &sessionEnded{progressed: progressed, err: err})
	}()
}

func (s *subscriber) ended(msg *sessionEnded) {
	if s.cancelSession != nil {
		s.cancelSession()
		s.cancelSession = nil
	}
	if s.stopping {
		return
	}
	if errors.Is(msg.err, fence.ErrSuperseded) {
		s.lostCustody(msg.err)
	}
	if msg.progressed {
		s.backoff.Reset()
	}
	delay := s.backoff.NextBackOff()
	var held *heldRefusal
	if errors.As(msg.err, &held) {
		delay = max(delay, held.hold)
	}
	s.log.Warn().Err(logval.Error(msg.err)).Dur("retry_in", delay).Msg("labeler stream ended; reconnecting")
	s.cancelTimer = s.timer.SendOnce(delay, s.self, &connect{})
}

// lostCustody fails the actor like every leased worker does on a failed
// fence: the parent LeaseActor treats it as lost custody, and nothing here
// writes again (Stopping ends the goroutines).
func (s *subscriber) lostCustody(err error) {
	s.log.Error().Err(logval.Error(err)).Msg("labeler subscriber lost custody")
	panic(fmt.Errorf("labeler subscriber under %s: %w", s.custody, err))
}

// startResolver starts the goroutine that applies pending takedowns
// (store.resolvePending) at once and then every ResolveEvery, until the
// actor stops or the custody is found superseded.
func (s *subscriber) startResolver() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancelResolver = cancel
	s.sessions.Add(1)
	go func() {
		defer s.sessions.Done()
		t := time.NewTicker(s.o.ResolveEvery)
		defer t.Stop()
		for {
			n, err := s.store.resolvePending(ctx)
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, fence.ErrSuperseded):
				s.root.Send(s.self, &resolverFailed{err: err})
				return
			case err != nil:
				s.log.Warn().Err(logval.Error(err)).Dur("retry_in", s.o.ResolveEvery).Msg("pending takedowns not resolved")
			case n > 0:
				s.o.Metrics.Labels.WithLabelValues(outcomeResolved).Add(float64(n))
				s.log.Info().Int("labels", n).Msg("pending takedowns applied: their records are indexed now")
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// stop cancels the reconnect timer, the session and the resolver, and
// waits for their goroutines: once they return, nothing of this actor
// writes again.
func (s *subscriber) stop() {
	s.stopping = true
	if s.cancelResolver != nil {
		s.cancelResolver()
		s.cancelResolver = nil
	}
	if s.cancelTimer != nil {
		s.cancelTimer()
		s.cancelTimer = nil
	}
	if s.cancelSession != nil {
		s.cancelSession()
		s.cancelSession = nil
	}
	s.sessions.Wait()
}

// streamError is an error frame from the labeler (op -1).
type streamError struct {
	code, message string
}

func (e *streamError) Error() string {
	return fmt.Sprintf("labeler stream error %s: %s", e.code, e.message)
}

// maxRefusalHold bounds how long one refused dial's Retry-After holds the
// next one back.
const maxRefusalHold = 10 * time.Minute

// heldRefusal is a refused dial whose answer asked for the next one to wait
// hold (a 429 or 503 with Retry-After or RateLimit-Reset).
type heldRefusal struct {
	err  error
	hold time.Duration
}

func (e *heldRefusal) Error() string {
	return fmt.Sprintf("%v (asked to wait %s)", e.err, e.hold)
}

func (e *heldRefusal) Unwrap() error { return e.err }

// session runs one connection: dial from the stored cursor, apply frames
// until the stream ends, goes stale, sends an error frame, a write fails,
// or ctx is cancelled (then it closes the socket at once). progressed
// reports whether any #labels frame was applied.
func (s *subscriber) session(ctx context.Context) (progressed bool, err error) {
	seq, err := s.store.cursor(ctx)
	if err != nil {
		return false, err
	}
	target, err := withCursor(s.o.Endpoint, seq)
	if err != nil {
		return false, err
	}
	conn, resp, err := outbound.DialWebsocket(ctx, s.o.Dialer, target, nil)
	if err != nil {
		s.o.Metrics.Connections.WithLabelValues("failed").Inc()
		if resp != nil {
			err = fmt.Errorf("%w (HTTP %s)", err, resp.Status)
			// A 429 or 503 said when to come back (Retry-After, else
			// RateLimit-Reset): the next dial waits at least that.
			if d, ok := outbound.RetryRefusal(resp, time.Now()); ok && d > 0 {
				err = &heldRefusal{err: err, hold: min(d, maxRefusalHold)}
			}
		}
		return false, fmt.Errorf("connect to labeler %s: %w", target, err)
	}
	s.o.Metrics.Connections.WithLabelValues("connected").Inc()
	s.log.Info().Int64("cursor", seq).Msg("labeler stream connected")

	connCtx, cancel := context.WithCancel(ctx)
	var keepalive sync.WaitGroup
	keepalive.Add(1)
	go func() {
		defer keepalive.Done()
		s.keepalive(connCtx, conn)
	}()
	defer func() {
		cancel()
		keepalive.Wait()
		_ = conn.Close()
	}()

	conn.SetReadLimit(s.o.MaxFrameBytes)
	alive := func() { _ = conn.SetReadDeadline(time.Now().Add(s.o.StaleTimeout)) }
	alive()
	conn.SetPongHandler(func(string) error { alive(); return nil })
	last := seq // the seq of the last applied frame: later frames must be above it
	for {
		mt, data, err := conn.ReadMessage()
		if err != nil {
			if ctx.Err() != nil {
				return progressed, ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return progressed, fmt.Errorf("labeler stream stale: no frame or pong for %s", s.o.StaleTimeout)
			}
			return progressed, fmt.Errorf("read labeler stream: %w", err)
		}
		alive()
		applied, err := s.handle(ctx, mt, data, &last)
		progressed = progressed || applied
		if err != nil {
			return progressed, err
		}
	}
}

// keepalive pings every StaleTimeout/3 and closes the socket as soon as
// ctx is done, which unblocks the session's read at once.
func (s *subscriber) keepalive(ctx context.Context, conn *websocket.Conn) {
	every := s.o.StaleTimeout / pingsPerStaleTimeout
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = conn.Close()
			return
		case <-t.C:
			// A failed ping needs no handling: the read deadline notices.
			_ = conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(every))
		}
	}
}

// handle processes one websocket message. It returns applied true when a
// #labels frame was committed, and an error when the session must end: an
// error frame, a failed write, or lost custody. A bad frame is skipped, and
// so is a #labels frame whose seq is not above *last (the seq of the last
// applied frame, which handle moves): applying it would re-apply labels a
// later frame may have undone and move the stored cursor backwards.
func (s *subscriber) handle(ctx context.Context, mt int, data []byte, last *int64) (applied bool, err error) {
	m := s.o.Metrics
	if mt != websocket.BinaryMessage {
		m.Frames.WithLabelValues(frameMalformed).Inc()
		s.skipLog.Warn().Int("type", mt).Int("bytes", len(data)).Msg("labeler frame skipped: not a binary frame")
		return false, nil
	}
	f, err := decodeFrame(data)
	if err != nil {
		m.Frames.WithLabelValues(frameMalformed).Inc()
		s.skipLog.Warn().Err(logval.Error(err)).Int("bytes", len(data)).Msg("labeler frame skipped")
		return false, nil
	}
	switch f.kind {
	case kindLabels:
		if f.seq <= *last {
			m.Frames.WithLabelValues(frameSeqRegression).Inc()
			s.skipLog.Warn().Int64("seq", f.seq).Int64("last_seq", *last).Int("labels", len(f.labels)).
				Msg("labeler frame skipped: seq not above the last applied seq")
			return false, nil
		}
		outcomes, err := s.store.applyFrame(ctx, f)
		if err != nil {
			return false, err
		}
		*last = f.seq
		m.Frames.WithLabelValues(frameLabels).Inc()
		for outcome, n := range outcomes {
			m.Labels.WithLabelValues(outcome).Add(float64(n))
		}
		m.Cursor.Set(float64(f.seq))
		s.log.Debug().Int64("seq", f.seq).Int("labels", len(f.labels)).Msg("labels applied")
		return true, nil
	case kindInfo:
		m.Frames.WithLabelValues(frameInfo).Inc()
		ev := s.log.Info()
		if f.name == infoOutdatedCursorName {
			// The labeler no longer has every label after our cursor; it
			// streams from the oldest it has. Nothing to do but say so.
			ev = s.log.Warn()
		}
		ev.Str("name", logval.String(f.name)).Str("message", logval.String(f.message)).Msg("labeler info")
		return false, nil
	case kindError:
		m.Frames.WithLabelValues(frameError).Inc()
		m.StreamErrors.WithLabelValues(streamErrorCode(f.name)).Inc()
		serr := &streamError{code: f.name, message: f.message}
		switch f.name {
		case errFutureCursorName:
			// Our cursor is past the labeler's last seq: its sequence was
			// reset. Replaying its whole history is safe (idempotent), so
			// start over from 0 rather than retry a cursor it will refuse.
			if err := s.resetCursor(ctx); err != nil {
				return false, err
			}
			s.log.Error().Str("message", logval.String(f.message)).Msg("labeler cursor is in the labeler's future; replaying from seq 0")
		case errConsumerTooSlowName:
			s.log.Warn().Str("message", logval.String(f.message)).Msg("labeler dropped us as too slow; reconnecting from the stored cursor")
		default:
			s.log.Error().Str("error", logval.String(f.name)).Str("message", logval.String(f.message)).Msg("labeler stream error")
		}
		return false, serr
	default:
		m.Frames.WithLabelValues(frameUnknown).Inc()
		s.skipLog.Debug().Str("t", logval.String(f.t)).Msg("labeler frame of unknown type ignored")
		return false, nil
	}
}

// resetCursor sets the stored cursor to 0 unless it already is, so a
// labeler that keeps answering FutureCursor does not cost a write per try.
func (s *subscriber) resetCursor(ctx context.Context) error {
	cur, err := s.store.cursor(ctx)
	if err != nil || cur == 0 {
		return err
	}
	return s.store.resetCursor(ctx)
}

// withCursor adds ?cursor=SEQ to the subscribeLabels URL.
func withCursor(endpoint string, seq int64) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("labeler endpoint %q: %w", endpoint, err)
	}
	q := u.Query()
	q.Set("cursor", strconv.FormatInt(seq, 10))
	u.RawQuery = q.Encode()
	return u.String(), nil
}
