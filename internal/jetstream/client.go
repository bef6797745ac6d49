package jetstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/cenkalti/backoff/v5"
	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"
)

// Client defaults (used when the ClientOptions field is zero).
const (
	// DefaultBatchSize is the most events (and failures) in one Batch.
	DefaultBatchSize = 100
	// DefaultBatchLinger is how long a partial batch waits for more frames
	// before it is delivered anyway.
	DefaultBatchLinger = 20 * time.Millisecond
	// DefaultStaleTimeout: a connection with no frame, ping or pong for
	// this long is dead (matches config jetstream.stale_timeout).
	DefaultStaleTimeout = 60 * time.Second
	// DefaultMinBackoff and DefaultMaxBackoff bound the reconnect delay,
	// which grows ×2 with ±50% jitter per failure and resets after a
	// healthy connection.
	DefaultMinBackoff = 500 * time.Millisecond
	DefaultMaxBackoff = 30 * time.Second
)

// Client timings.
const (
	// handshakeTimeout bounds a dial plus the websocket upgrade.
	handshakeTimeout = 10 * time.Second
	// writeWait bounds writing an options_update or a ping.
	writeWait = 10 * time.Second
	// closeFrameWait bounds the courtesy close frame on shutdown, so Close
	// stays fast against a server that does not read.
	closeFrameWait = 10 * time.Millisecond
	// pingsPerStaleTimeout: the client pings this often per staleness
	// window, so a healthy but quiet server (a narrow collection filter
	// can mean minutes without an event) proves itself alive with pongs.
	pingsPerStaleTimeout = 3
	// minPingInterval keeps a tiny StaleTimeout from turning the pinger
	// into a busy loop.
	minPingInterval = 10 * time.Millisecond
	// backoffMultiplier and backoffJitter shape the reconnect delay.
	backoffMultiplier = 2
	backoffJitter     = 0.5
	// minHealthyLife: a connection that brought no event newer than any
	// before it must stay up this long (or MaxBackoff, if shorter) to reset
	// the backoff, so a server that closes every connection right after a
	// frame (on a resumed connection, the cursor's own event again) is not
	// redialled at MinBackoff forever. One that made progress resets it
	// whatever it lasted: a server that drops slow subscribers every few
	// thousand events must be redialled at once, or the consumer falls
	// behind.
	minHealthyLife = 10 * time.Second
)

// ErrClientClosed is returned by Run on a Client that was closed, and by a
// second Run.
var ErrClientClosed = errors.New("jetstream client closed")

// MaxFutureSkew is how far ahead of this host's clock an event's time_us
// may be. Jetstream stamps time_us with its own clock when it receives an
// event, so a later one is a broken server or a forged frame: the Client
// skips it (ClassInvalidEvent) rather than let it order records after every
// real event or carry the cursor into the future (a cursor from the future
// makes Jetstream live-tail). A day is far beyond any clock error of a host
// that can still speak TLS, so no real event is refused.
const MaxFutureSkew = 24 * time.Hour

// ClientOptions configures a Client. Zero values take the defaults above.
type ClientOptions struct {
	// URLs are Jetstream /subscribe endpoints (ws:// or wss://), tried in
	// order: a failed dial, or a connection that dies before its first
	// frame, moves to the next; a healthy connection that drops is retried
	// on the same URL first. Required.
	URLs []string
	// Collections are sent as repeated wantedCollections (NSIDs or
	// "prefix.*"); empty means every collection.
	Collections []string
	// Cursor is called before every connect and reconnect and returns the
	// Unix-microsecond time_us to replay from (inclusive); 0 means live
	// tail. nil means always live tail. Ignored when CursorFor is set.
	Cursor func() int64
	// CursorFor is Cursor told which endpoint (one of URLs, as given) is
	// about to be dialled. Jetstream instances stamp time_us
	// independently, so a cursor read from one instance needs a rewind of
	// a few seconds on another (and on a first connect, when the instance
	// it came from is unknown); on the instance the cursor was read from,
	// the cursor itself resumes exactly (inclusive: the last event is
	// delivered again, so process idempotently). Batch.URL says which
	// endpoint each batch came from.
	CursorFor func(url string) int64
	// Compress asks for zstd binary frames (compress=true): about half the
	// bytes on the wire for a little CPU.
	Compress bool
	// MaxMessageBytes is the largest frame the client accepts, in bytes as
	// received; the same bound applies to the JSON after decompression.
	// Larger frames are skipped and reported, not fatal (see the package
	// documentation). 0 means DefaultMaxEventBytes.
	MaxMessageBytes int64
	// StaleTimeout: no frame, ping or pong for this long reconnects.
	StaleTimeout time.Duration
	// BatchSize and BatchLinger shape deliveries: a Batch is delivered when
	// it holds BatchSize entries, or BatchLinger after its first entry.
	BatchSize   int
	BatchLinger time.Duration
	// MinBackoff and MaxBackoff bound the reconnect delay.
	MinBackoff, MaxBackoff time.Duration
	// Metrics receives the client's counters; nil records nothing.
	Metrics *Metrics
	// Log receives connection events (connected; lost, with the delay
	// before the next attempt as retry_in_ms). The zero Logger discards
	// them. Decode failures are counted (Metrics) but not logged here: they
	// are delivered in batches for the handler to log.
	Log zerolog.Logger
	// Dialer overrides the websocket dialer (proxies, TLS); nil uses a
	// dialer with a 10 s handshake timeout and the environment's proxy.
	Dialer *websocket.Dialer
}

// Batch is a run of consecutive frames, in stream order.
type Batch struct {
	// URL is the endpoint (one of ClientOptions.URLs, as given) the frames
	// were read from.
	URL string
	// Events are the frames that decoded, in stream order.
	Events []Event
	// Failures are the frames in this run that did not decode, in stream
	// order; they have been counted (decode_errors_total) and are skipped.
	// Their position among Events is not kept: a failure has no cursor.
	Failures []*DecodeError
}

// Len is the number of frames the batch covers.
func (b *Batch) Len() int { return len(b.Events) + len(b.Failures) }

// Handler processes one Batch. It runs on the Client's Run goroutine and
// the client reads no further than its small buffer until it returns: that
// is the backpressure. ctx ends when the client stops; a handler blocked
// on anything must give up when it does. Returning an error stops the
// client: Run returns it. The Batch and its slices belong to the handler.
// A handler must not call Close (Close waits for the handler); it may call
// UpdateOptions.
type Handler func(ctx context.Context, b Batch) error

// Client subscribes to Jetstream and delivers decoded events, in order and
// in batches, to a blocking Handler. It reconnects by itself, resuming from
// ClientOptions.Cursor, until Close or the context passed to Run ends.
type Client struct {
	opts    ClientOptions
	handler Handler
	dec     *Decoder

	// writeMu serialises options_update writes, and orders them with the
	// collections they carry (taken before mu).
	writeMu sync.Mutex

	mu          sync.Mutex
	collections []string
	// newestUS is the largest time_us any connection delivered: only the
	// reader goroutine (one connection at a time) touches it.
	newestUS int64
	// filter is collections, parsed, for the reader: a commit outside it
	// is skipped (ClassUnwantedCollection). Set with collections.
	filter  atomic.Pointer[collectionFilter]
	conn    *websocket.Conn // the live connection, nil between connections
	cancel  context.CancelFunc
	running bool
	closed  bool

	done      chan struct{}
	closeOnce sync.Once
}

// NewClient validates opts and returns a Client ready to Run. Errors name
// the offending option.
func NewClient(opts ClientOptions, h Handler) (*Client, error) {
	if h == nil {
		return nil, errors.New("jetstream client: nil handler")
	}
	if len(opts.URLs) == 0 {
		return nil, errors.New("jetstream client: no URLs")
	}
	for _, raw := range opts.URLs {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
			return nil, fmt.Errorf("jetstream client: URL %q: want ws:// or wss://HOST/...", raw)
		}
	}
	filter, err := newCollectionFilter(opts.Collections)
	if err != nil {
		return nil, fmt.Errorf("jetstream client: %w", err)
	}
	switch {
	case opts.MaxMessageBytes < 0, opts.StaleTimeout < 0, opts.BatchSize < 0, opts.BatchLinger < 0,
		opts.MinBackoff < 0, opts.MaxBackoff < 0:
		return nil, errors.New("jetstream client: negative size, count or duration option")
	}
	opts.URLs = slices.Clone(opts.URLs)
	if opts.CursorFor == nil {
		cursor := opts.Cursor
		if cursor == nil {
			cursor = func() int64 { return 0 }
		}
		opts.CursorFor = func(string) int64 { return cursor() }
	}
	if opts.MaxMessageBytes == 0 {
		opts.MaxMessageBytes = DefaultMaxEventBytes
	}
	if opts.StaleTimeout == 0 {
		opts.StaleTimeout = DefaultStaleTimeout
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.BatchLinger == 0 {
		opts.BatchLinger = DefaultBatchLinger
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff = DefaultMinBackoff
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = DefaultMaxBackoff
	}
	opts.MaxBackoff = max(opts.MaxBackoff, opts.MinBackoff)
	if opts.Dialer == nil {
		opts.Dialer = &websocket.Dialer{HandshakeTimeout: handshakeTimeout, Proxy: http.ProxyFromEnvironment}
	}
	dec, err := NewDecoder(opts.MaxMessageBytes)
	if err != nil {
		return nil, err
	}
	c := &Client{
		opts:        opts,
		handler:     h,
		dec:         dec,
		collections: slices.Clone(opts.Collections),
		done:        make(chan struct{}),
	}
	c.filter.Store(&filter)
	return c, nil
}

// Run connects and delivers batches to the handler until ctx ends or Close
// is called (it then returns nil), or the handler returns an error (Run
// returns it, wrapped). Connection failures are not errors: Run reconnects
// with backoff for as long as it runs. Run may be called once.
func (c *Client) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.closed || c.running {
		c.mu.Unlock()
		return ErrClientClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	c.cancel, c.running = cancel, true
	c.mu.Unlock()
	defer close(c.done)
	defer cancel()

	bo := &backoff.ExponentialBackOff{
		InitialInterval:     c.opts.MinBackoff,
		RandomizationFactor: backoffJitter,
		Multiplier:          backoffMultiplier,
		MaxInterval:         c.opts.MaxBackoff,
	}
	bo.Reset()
	at := 0
	for {
		endpoint := c.opts.URLs[at]
		end := c.session(ctx, endpoint)
		if ctx.Err() != nil {
			return nil
		}
		if end.handlerErr != nil {
			return fmt.Errorf("jetstream handler: %w", end.handlerErr)
		}
		if end.progressed || (end.healthy && end.lasted >= min(c.opts.MaxBackoff, minHealthyLife)) {
			bo.Reset()
		} else if !end.healthy {
			at = (at + 1) % len(c.opts.URLs)
		}
		wait := bo.NextBackOff()
		c.opts.Metrics.reconnect(end.reason)
		c.opts.Log.Warn().Err(logval.Error(end.err)).Str("url", endpoint).Str("reason", end.reason).
			Str("next_url", c.opts.URLs[at]).Int64("retry_in_ms", wait.Milliseconds()).Msg("jetstream connection lost")
		if !sleepCtx(ctx, wait) {
			return nil
		}
	}
}

// Close stops the client: it ends the context the handler sees, closes the
// socket and waits for Run to return (as soon as the handler honours its
// context; the client itself never blocks longer than closeFrameWait).
// Safe to call more than once, and before or without Run.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	cancel, running := c.cancel, c.running
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if running {
		<-c.done
	}
	c.closeOnce.Do(c.dec.Close)
	return nil
}

// UpdateOptions replaces the collection filter: on the live connection at
// once, with an options_update message, and on every later connection in
// the subscribe URL. Commits already in flight for a collection the new
// filter leaves out are skipped as ClassUnwantedCollection. An error means
// the message could not be written (the connection is failing); the new
// filter still applies from the next connection.
func (c *Client) UpdateOptions(collections []string) error {
	filter, err := newCollectionFilter(collections)
	if err != nil {
		return fmt.Errorf("jetstream options_update: %w", err)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	c.collections = slices.Clone(collections)
	c.filter.Store(&filter)
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		return nil
	}
	return writeOptionsUpdate(conn, collections)
}

// writeOptionsUpdate sends an options_update; the caller holds writeMu.
func writeOptionsUpdate(conn *websocket.Conn, collections []string) error {
	msg, err := encodeOptionsUpdate(collections)
	if err != nil {
		return fmt.Errorf("jetstream options_update: %w", err)
	}
	conn.SetWriteDeadline(time.Now().Add(writeWait))
	if err := conn.WriteMessage(websocket.TextMessage, msg); err != nil {
		return fmt.Errorf("jetstream options_update: %w", err)
	}
	return nil
}

// attach publishes conn as the live connection. If UpdateOptions changed
// the filter after the subscribe URL was built from sent, the server is
// told now, so no update is lost between dial and attach.
func (c *Client) attach(conn *websocket.Conn, sent []string, hello bool) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	c.conn = conn
	now := slices.Clone(c.collections)
	c.mu.Unlock()
	if slices.Equal(now, sent) && !hello {
		return nil
	}
	return writeOptionsUpdate(conn, now)
}

// subscribeURL adds the subscription to a configured endpoint URL.
func subscribeURL(base string, collections []string, cursor int64, compress bool) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Del("wantedCollections")
	q.Del("cursor")
	q.Del("compress")
	for _, col := range collections {
		q.Add("wantedCollections", col)
	}
	if cursor > 0 {
		q.Set("cursor", strconv.FormatInt(cursor, 10))
	}
	if compress {
		q.Set("compress", "true")
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// requiresHello reports whether an endpoint URL asks Jetstream to wait for
// an options_update before it sends anything (requireHello=true).
func requiresHello(base string) bool {
	u, err := url.Parse(base)
	return err == nil && u.Query().Get("requireHello") == "true"
}

// sessionEnd is how one connection ended.
type sessionEnd struct {
	err        error
	reason     string // a Reason* constant
	healthy    bool   // the server sent at least one frame or pong
	progressed bool   // it sent an event newer than any the client had seen
	lasted     time.Duration
	handlerErr error
}

// item is one frame as read: an event or the reason it was skipped.
type item struct {
	ev   Event
	fail *DecodeError
}

// session runs one connection: dial, read on its own goroutine, deliver on
// this one, and tear down. It returns when the connection fails, ctx ends
// or the handler fails, after every goroutine it started has finished.
func (c *Client) session(ctx context.Context, base string) sessionEnd {
	c.mu.Lock()
	sent := slices.Clone(c.collections)
	c.mu.Unlock()
	cursor := c.opts.CursorFor(base)
	target, err := subscribeURL(base, sent, cursor, c.opts.Compress)
	if err != nil {
		return sessionEnd{err: err, reason: ReasonDial}
	}
	conn, _, err := c.opts.Dialer.DialContext(ctx, target, nil)
	if err != nil {
		return sessionEnd{err: fmt.Errorf("dial %s: %w", base, err), reason: ReasonDial}
	}
	connected := time.Now()
	c.opts.Metrics.setConnected(true)
	c.opts.Log.Info().Str("url", base).Int64("cursor", cursor).Strs("collections", sent).
		Bool("compress", c.opts.Compress).Msg("jetstream connected")

	items := make(chan item, c.opts.BatchSize)
	stop := make(chan struct{})
	var healthy, progressed atomic.Bool
	var readErr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(items)
		readErr = c.read(conn, items, stop, &healthy, &progressed)
	}()
	go func() {
		defer wg.Done()
		c.ping(conn, stop)
	}()

	var handlerErr error
	if err := c.attach(conn, sent, requiresHello(base)); err != nil {
		c.opts.Log.Warn().Err(logval.Error(err)).Msg("jetstream: filter changed while connecting and could not be sent; reconnecting")
		conn.Close()
	}
	handlerErr = c.deliver(ctx, base, items)

	close(stop)
	// Not attach: an options_update stuck writing to a dead socket holds
	// writeMu, and teardown must not wait for it (conn.Close frees it).
	c.mu.Lock()
	c.conn = nil
	c.mu.Unlock()
	if ctx.Err() != nil || handlerErr != nil {
		// We are the ones leaving: say so, briefly.
		_ = conn.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(closeFrameWait))
	}
	conn.Close()
	wg.Wait()
	c.opts.Metrics.setConnected(false)

	end := sessionEnd{err: readErr, healthy: healthy.Load(), progressed: progressed.Load(), handlerErr: handlerErr, lasted: time.Since(connected)}
	var ne net.Error
	var ce *websocket.CloseError
	switch {
	case errors.As(readErr, &ne) && ne.Timeout():
		end.reason = ReasonStale
		end.err = fmt.Errorf("no frame, ping or pong for %v: %w", c.opts.StaleTimeout, readErr)
	case errors.As(readErr, &ce) && ce.Code != websocket.CloseAbnormalClosure:
		end.reason = ReasonServerClose
	default:
		end.reason = ReasonReadError
	}
	return end
}

// read is the connection's reader goroutine: it reads frames, decodes them
// and queues them in order until the connection fails or stop closes.
//
// Deadlines: the read deadline is StaleTimeout from the start of every
// wait for a frame, and pings and pongs received while waiting push it
// back. Once a frame has started, only its own arrival counts: a frame
// (say an endless oversized one) must complete within StaleTimeout.
//
// Oversized frames are read to io.Discard without being buffered, counted,
// and queued as a ClassOversized failure; the connection carries on with
// the next frame. See the package documentation for why this is not
// websocket.Conn.SetReadLimit.
func (c *Client) read(conn *websocket.Conn, items chan<- item, stop <-chan struct{}, healthy, progressed *atomic.Bool) error {
	stale := c.opts.StaleTimeout
	limit := c.opts.MaxMessageBytes
	inFrame := false // only touched on this goroutine (handlers run inside reads)
	alive := func() {
		healthy.Store(true)
		if !inFrame {
			conn.SetReadDeadline(time.Now().Add(stale))
		}
	}
	conn.SetPongHandler(func(string) error { alive(); return nil })
	conn.SetPingHandler(func(data string) error {
		alive()
		// A failed pong is not a read error; if the connection is really
		// gone the next read says so.
		_ = conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(writeWait))
		return nil
	})
	var buf bytes.Buffer
	for {
		inFrame = false
		conn.SetReadDeadline(time.Now().Add(stale))
		typ, r, err := conn.NextReader()
		if err != nil {
			return err
		}
		inFrame = true
		healthy.Store(true)
		conn.SetReadDeadline(time.Now().Add(stale))
		buf.Reset()
		n, err := buf.ReadFrom(io.LimitReader(r, limit+1))
		if err != nil {
			return err
		}
		var it item
		if n > limit {
			rest, err := io.Copy(io.Discard, r)
			if err != nil {
				return err
			}
			n += rest
			it.fail = &DecodeError{Class: ClassOversized, Size: n,
				Err: fmt.Errorf("frame exceeds the %d-byte limit; skipped", limit)}
		} else if ev, err := c.dec.Decode(buf.Bytes(), typ == websocket.BinaryMessage); err != nil {
			if !errors.As(err, &it.fail) {
				it.fail = &DecodeError{Class: ClassMalformedJSON, Size: n, Err: err}
			}
		} else if limit := time.Now().Add(MaxFutureSkew).UnixMicro(); ev.TimeUS > limit {
			it.fail = &DecodeError{Class: ClassInvalidEvent, Size: n, TimeUS: ev.TimeUS,
				Err: fmt.Errorf("time_us %d is more than %s ahead of this host's clock", ev.TimeUS, MaxFutureSkew)}
		} else if ev.Commit != nil && !c.filter.Load().wants(ev.Commit.Collection) {
			it.fail = &DecodeError{Class: ClassUnwantedCollection, Size: n, TimeUS: ev.TimeUS,
				Err: fmt.Errorf("collection %q is not in wantedCollections", ev.Commit.Collection)}
		} else {
			it.ev = ev
			if ev.TimeUS > c.newestUS {
				c.newestUS = ev.TimeUS
				progressed.Store(true)
			}
		}
		c.opts.Metrics.frame(n)
		if it.fail != nil {
			c.opts.Metrics.decoded(nil, it.fail)
		} else {
			c.opts.Metrics.decoded(&it.ev, nil)
		}
		select {
		case items <- it:
		case <-stop:
			return nil
		}
	}
}

// ping is the connection's pinger goroutine.
func (c *Client) ping(conn *websocket.Conn, stop <-chan struct{}) {
	t := time.NewTicker(max(c.opts.StaleTimeout/pingsPerStaleTimeout, minPingInterval))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			// Failure shows up as a stale read; nothing to do here.
			_ = conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeWait))
		}
	}
}

// deliver batches items and calls the handler until items closes (the
// connection ended: what was read is still delivered), ctx ends (a partial
// batch is dropped; the cursor replays it) or the handler fails.
func (c *Client) deliver(ctx context.Context, endpoint string, items <-chan item) error {
	var b Batch
	var linger *time.Timer
	var lingerC <-chan time.Time
	defer func() {
		if linger != nil {
			linger.Stop()
		}
	}()
	flush := func() error {
		if linger != nil {
			linger.Stop()
			linger, lingerC = nil, nil
		}
		if b.Len() == 0 {
			return nil
		}
		out := b
		out.URL = endpoint
		b = Batch{}
		return c.handler(ctx, out)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case it, ok := <-items:
			if !ok {
				return flush()
			}
			if it.fail != nil {
				b.Failures = append(b.Failures, it.fail)
			} else {
				b.Events = append(b.Events, it.ev)
			}
			if b.Len() >= c.opts.BatchSize {
				if err := flush(); err != nil {
					return err
				}
			} else if linger == nil {
				linger = time.NewTimer(c.opts.BatchLinger)
				lingerC = linger.C
			}
		case <-lingerC:
			if err := flush(); err != nil {
				return err
			}
		}
	}
}
