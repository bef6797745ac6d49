package jetstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"
	"github.com/cenkalti/backoff/v5"
	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"
)

// Client defaults (used when the ClientOptions field is zero).
const (
	// DefaultBatchSize is the most events (and failures) in one Batch.
	// While the consumer catches up, a batch is one transaction, cut
	// short by the consumer's commit budget (which bounds how long one
	// holds the write lock) and by DefaultBatchBytes: fewer, larger
	// transactions write each hot page to the WAL once per commit, not
	// once per thousand events. A replay through serve ran 12-14k
	// events/s with 1,000, 16-19k with 3,000 or 5,000 (docs/performance.md,
	// sixth pass), and 1,000 had been 1.5x as fast as 100. Live, batches
	// stay small: a partial batch waits only DefaultBatchLinger.
	DefaultBatchSize = 5000
	// DefaultBatchBytes is the most frame bytes (as decoded, before
	// parsing) in one Batch; the client also holds at most twice this in
	// frames read and not yet handled (plus one frame), so memory stays
	// bounded when frames are large.
	DefaultBatchBytes = 8 << 20
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
	// keptReadBuffer is the largest read buffer kept from one frame to the
	// next; a larger frame's buffer is dropped after it (frames of the
	// real network are a few KiB).
	keptReadBuffer = 256 << 10
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
	// URLs are Jetstream endpoints (ws:// or wss://; the path picks the
	// wire, see WireOf), tried in order: a failed dial, or a connection that dies before its first
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
	// about to be dialled; it returns a sequence number of that host (below
	// CursorSeqMax: only ever one read from that host, see HostOf) or a
	// Unix-microsecond time. A seq resumes exactly: the event at the
	// cursor, replayed by Jetstream, is dropped. A time replays from that
	// time inclusive (process idempotently); each Jetstream instance stamps
	// its own times, so a time from another instance needs a margin.
	// Batch.URL says which endpoint each batch came from.
	CursorFor func(url string) int64
	// SeqTimeFor, when set, is asked after CursorFor gave a sequence
	// number: the time_us of the event at that number as it was read
	// (0: unknown). A host's sequence numbers outlive neither its store
	// nor a crash (Jetstream v2 restarts from the last number it saved
	// and numbers what it reads again anew), so the connection checks
	// that the host replays that very event first: the cursor's number
	// first, stamped with this time. Anything else ends the connection
	// with ErrSeqReset (the host is resumed by time): resuming from a
	// number that now names another event would skip the events
	// renumbered below it. With 0, only a first number below the cursor
	// ends it.
	SeqTimeFor func(url string) int64
	// Compress asks for zstd binary frames (compress=true): about half the
	// bytes on the wire for a little CPU.
	Compress bool
	// MaxMessageBytes is the largest frame the client accepts, in bytes as
	// received; the same bound applies to the JSON after decompression.
	// Larger frames are skipped and reported, not fatal (see the package
	// documentation). 0 means DefaultMaxEventBytes.
	MaxMessageBytes int64
	// StaleTimeout: no event for this long (pings and pongs do not count)
	// leaves the URL for the next one.
	StaleTimeout time.Duration
	// BatchSize, BatchBytes and BatchLinger shape deliveries: a Batch is
	// delivered when it holds BatchSize entries or frames of BatchBytes
	// bytes in all, or BatchLinger after its first entry. The client reads
	// ahead at most BatchSize entries and 2 x BatchBytes bytes (one frame
	// more when a single frame is larger) beyond what its handler has
	// returned from. 0 means DefaultBatchSize, DefaultBatchBytes,
	// DefaultBatchLinger.
	BatchSize   int
	BatchBytes  int64
	BatchLinger time.Duration
	// MinBackoff and MaxBackoff bound the reconnect delay.
	MinBackoff, MaxBackoff time.Duration
	// FailbackInterval: while connected to any URL but the first, the
	// client probes the URLs before it this often, and one that takes a
	// connection and sends a frame within StaleTimeout is switched back to
	// (the live connection is closed at once; what it had read is still
	// delivered, and the next connection resumes from the handler's
	// position). 0 never probes: a URL that delivers is kept, however far
	// down the list.
	FailbackInterval time.Duration
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
	// HTTPClient fetches the v2 wire's zstd dictionary; nil uses a client
	// with a 10 s timeout.
	HTTPClient *http.Client
	// OnCursorTooOld is told when a host refused a sequence cursor below
	// its lookback floor (v2 wire, CursorTooOld): the events between
	// cursor and floor are gone from that host. The client then resumes
	// that host from floor (its oldest event) on the next dial. nil: only
	// logged and counted.
	OnCursorTooOld func(url string, cursor, floor int64)
	// OnOutdatedCursor is told when a v2 host clamped a time cursor to
	// its oldest event and said so (#info OutdatedCursor): the events
	// between cursorUS (the time cursor sent, Unix µs) and firstUS (the
	// time of the first event the host sent after the advisory) are gone
	// from that host; firstSeq is that event's sequence number (0 on a
	// wire without one). It runs on the connection's reader goroutine,
	// once per connection, before that event is queued; an advisory
	// followed by no later event (the connection ended first) is told
	// nothing. nil: only logged and counted.
	OnOutdatedCursor func(url string, cursorUS, firstUS, firstSeq int64)
	// OnSeqReset is told (on the Run goroutine, before the next dial) that
	// url's host numbers its events below the seq cursor it was given
	// (ErrSeqReset): CursorFor must not give that host a seq again before
	// it has delivered new ones. nil: the client would redial with the
	// same cursor.
	OnSeqReset func(url string)
	// Prepare, when set, is called with every event that will be delivered,
	// on the goroutine that reads the connection, before the event is
	// queued: work on one event that needs no database (decoding and
	// validating its record) then runs alongside the Handler's commits of
	// the batches before it, on another core. It may set Event.Prepared
	// and must not keep ev.
	Prepare func(ev *Event)
}

// Batch is a run of consecutive frames, in stream order.
type Batch struct {
	// URL is the endpoint (one of ClientOptions.URLs, as given) the frames
	// were read from.
	URL string
	// MaxSeq is the largest sequence number among the batch's frames,
	// failures included (0 when the server sends none): everything up to
	// it on this host has been delivered, so a position may move there.
	MaxSeq int64
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
	filter atomic.Pointer[collectionFilter]
	conn   *websocket.Conn // the live connection, nil between connections
	connV2 bool            // conn speaks the v2 wire (no options_update)
	// resumeFloor: a host that refused a cursor as too old is dialled
	// from its floor next (URL → seq), once.
	resumeFloor map[string]int64
	// dicts caches the v2 decoders by host (each host serves its own
	// dictionary); noDict marks hosts that have no usable dictionary,
	// which are then read uncompressed; dictRetry, hosts whose dictionary
	// fetch failed for a transient reason, read uncompressed until the
	// time given. Run goroutine only.
	dicts     map[string]*Decoder
	noDict    map[string]bool
	dictRetry map[string]time.Time
	// lastEvent is when any connection last delivered an event (Unix ns).
	lastEvent atomic.Int64
	cancel    context.CancelFunc
	running   bool
	closed    bool

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
			return nil, fmt.Errorf("jetstream client: URL %q: want ws:// or wss://HOST/...", logval.MaskURL(raw))
		}
	}
	filter, err := newCollectionFilter(opts.Collections)
	if err != nil {
		return nil, fmt.Errorf("jetstream client: %w", err)
	}
	switch {
	case opts.MaxMessageBytes < 0, opts.StaleTimeout < 0, opts.BatchSize < 0, opts.BatchBytes < 0, opts.BatchLinger < 0,
		opts.MinBackoff < 0, opts.MaxBackoff < 0, opts.FailbackInterval < 0:
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
	if opts.BatchBytes == 0 {
		opts.BatchBytes = DefaultBatchBytes
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
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: handshakeTimeout}
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
		resumeFloor: map[string]int64{},
		dicts:       map[string]*Decoder{},
		noDict:      map[string]bool{},
		dictRetry:   map[string]time.Time{},
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

	// Each URL has its own backoff, so a host that keeps failing is paced
	// without holding back the next one.
	hosts := make([]upstream, len(c.opts.URLs))
	for i := range hosts {
		hosts[i].bo = &backoff.ExponentialBackOff{
			InitialInterval:     c.opts.MinBackoff,
			RandomizationFactor: backoffJitter,
			Multiplier:          backoffMultiplier,
			MaxInterval:         c.opts.MaxBackoff,
		}
		hosts[i].bo.Reset()
	}
	c.opts.Metrics.state(c.opts.URLs, "", "")
	at := 0
	for {
		endpoint := c.opts.URLs[at]
		if wait := time.Until(hosts[at].notBefore); wait > 0 {
			c.opts.Metrics.state(c.opts.URLs, endpoint, StateBackoff)
			if !sleepCtx(ctx, wait) {
				return nil
			}
		}
		c.opts.Metrics.state(c.opts.URLs, endpoint, StateConnecting)
		back := c.sessionWithFailback(ctx, endpoint, hosts[:at])
		end := back.end
		c.opts.Metrics.state(c.opts.URLs, endpoint, "")
		if ctx.Err() != nil {
			return nil
		}
		if end.handlerErr != nil {
			return fmt.Errorf("jetstream handler: %w", end.handlerErr)
		}
		h := &hosts[at]
		if back.to >= 0 {
			// Left on purpose, for an earlier URL that answers again: no
			// failure of this one, and the earlier one is dialled now.
			h.bo.Reset()
			c.opts.Metrics.reconnect(ReasonFailback)
			c.opts.Log.Info().Str("url", logval.RedactURL(endpoint)).Str("reason", ReasonFailback).Str("next_url", logval.RedactURL(c.opts.URLs[back.to])).
				Int64("retry_in_ms", 0).Msg("jetstream switching back to an earlier URL, which answers again")
			at = back.to
			hosts[at].notBefore = time.Time{}
			continue
		}
		if end.progressed || (end.healthy && end.lasted >= min(c.opts.MaxBackoff, minHealthyLife)) {
			h.bo.Reset()
		}
		wait := max(h.bo.NextBackOff(), end.hold)
		if end.retryNow {
			wait = 0
		}
		now := time.Now()
		h.notBefore = now.Add(wait)
		// A host that sent no event (refused, silent, or dead before its
		// first event) is left for the next; one that was delivering is
		// retried first.
		if (!end.healthy || end.reason == ReasonStale) && !end.retryNow {
			at = (at + 1) % len(c.opts.URLs)
		}
		next := c.opts.URLs[at]
		c.opts.Metrics.reconnect(end.reason)
		c.opts.Log.Warn().Err(logval.Error(end.err)).Str("url", logval.RedactURL(endpoint)).Str("reason", end.reason).
			Str("next_url", logval.RedactURL(next)).Int64("retry_in_ms", max(0, hosts[at].notBefore.Sub(now).Milliseconds())).Msg("jetstream connection lost")
	}
}

// failbackCloseRetry is how often a prober that found an earlier URL
// looks again for the session's connection to close while it is still
// being dialled.
const failbackCloseRetry = 10 * time.Millisecond

// failbackEnd is how a session with failback probing ended: end, and to,
// the index of the earlier URL to switch back to (-1: none).
type failbackEnd struct {
	end sessionEnd
	to  int
}

// sessionWithFailback runs one session on base. When earlier (the URLs
// before base in the list) is not empty and FailbackInterval is set, a
// prober runs beside it: every FailbackInterval it probes each earlier URL
// whose backoff has passed, in order, and when one answers it closes the
// live connection, ending the session (everything already read is still
// delivered).
func (c *Client) sessionWithFailback(ctx context.Context, base string, earlier []upstream) failbackEnd {
	if len(earlier) == 0 || c.opts.FailbackInterval <= 0 {
		return failbackEnd{end: c.session(ctx, base), to: -1}
	}
	notBefore := make([]time.Time, len(earlier))
	for i := range earlier {
		notBefore[i] = earlier[i].notBefore
	}
	pctx, stop := context.WithCancel(ctx)
	found := make(chan int, 1)
	go func() {
		t := time.NewTimer(c.opts.FailbackInterval)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				close(found)
				return
			case <-t.C:
			}
			for i, nb := range notBefore {
				if time.Now().Before(nb) {
					continue
				}
				ok, hold, why := c.probe(pctx, c.opts.URLs[i])
				if !ok {
					// A refusal's Retry-After holds the probes too: a
					// limiter counting refused attempts would otherwise
					// be kept spent by them.
					notBefore[i] = time.Now().Add(hold)
					c.opts.Log.Debug().Str("url", logval.RedactURL(c.opts.URLs[i])).Str("why", why).Int64("retry_in_ms", hold.Milliseconds()).
						Msg("jetstream failback probe: the earlier URL does not answer yet")
					continue
				}
				found <- i
				close(found)
				// The session's connection may still be dialling: close
				// it once it is published (c.conn), or give up when the
				// session ends by itself (pctx).
				for {
					c.mu.Lock()
					conn := c.conn
					c.mu.Unlock()
					if conn != nil {
						conn.Close()
						return
					}
					t.Reset(failbackCloseRetry)
					select {
					case <-pctx.Done():
						return
					case <-t.C:
					}
				}
			}
			t.Reset(c.opts.FailbackInterval)
		}
	}()
	end := c.session(ctx, base)
	stop()
	to, ok := <-found
	if !ok {
		to = -1
	}
	return failbackEnd{end: end, to: to}
}

// probe reports whether the URL base takes a connection and sends a data
// frame within StaleTimeout. It asks for no cursor (a live tail) and no
// compression, and closes the connection as soon as the frame is read.
// When not, hold is what a refusal asked (refusalHold, 0 for none) and
// why says what happened.
func (c *Client) probe(ctx context.Context, base string) (ok bool, hold time.Duration, why string) {
	c.mu.Lock()
	cols := slices.Clone(c.collections)
	c.mu.Unlock()
	var target string
	var err error
	if WireOf(base) == WireV2 {
		target, err = subscribeURLV2(base, cols, 0, 0)
	} else {
		target, err = subscribeURL(base, cols, 0, false)
	}
	if err != nil {
		return false, 0, err.Error()
	}
	dctx, cancel := context.WithTimeout(ctx, c.opts.StaleTimeout)
	defer cancel()
	conn, resp, err := outbound.DialWebsocket(dctx, c.opts.Dialer, target, nil)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		if resp != nil {
			hold = refusalHold(resp, time.Now())
			err = fmt.Errorf("%w (HTTP %s)", err, resp.Status)
		}
		return false, hold, err.Error()
	}
	defer conn.Close()
	stopWatch := context.AfterFunc(dctx, func() { conn.Close() })
	defer stopWatch()
	conn.SetReadLimit(c.opts.MaxMessageBytes)
	if d, ok := dctx.Deadline(); ok {
		conn.SetReadDeadline(d)
	}
	for {
		kind, _, err := conn.ReadMessage()
		if err != nil {
			return false, 0, "connected, but no frame: " + err.Error()
		}
		if kind == websocket.TextMessage || kind == websocket.BinaryMessage {
			_ = conn.WriteControl(websocket.CloseMessage,
				websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(closeFrameWait))
			return true, 0, ""
		}
	}
}

// upstream is the Run loop's view of one configured URL.
type upstream struct {
	bo *backoff.ExponentialBackOff
	// notBefore is when the URL may be dialled again.
	notBefore time.Time
}

// LastEvent is when a connection last delivered an event (zero before the
// first); safe from any goroutine. The consumer's health report uses it.
func (c *Client) LastEvent() time.Time {
	ns := c.lastEvent.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
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
	conn, v2 := c.conn, c.connV2
	c.mu.Unlock()
	if conn == nil {
		return nil
	}
	if v2 {
		// The v2 wire takes no client frames: the new filter needs a new
		// connection (resumed from the position, so nothing is lost).
		return conn.Close()
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
func (c *Client) attach(conn *websocket.Conn, sent []string, hello, v2 bool) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	c.conn, c.connV2 = conn, v2
	now := slices.Clone(c.collections)
	c.mu.Unlock()
	if slices.Equal(now, sent) && !hello {
		return nil
	}
	if v2 {
		return errors.New("filter changed while connecting (v2 wire: reconnecting)")
	}
	return writeOptionsUpdate(conn, now)
}

// subscribeURLV2 adds the subscription to a configured v2 endpoint URL:
// repeated collections (they constrain commits only, so identity, account
// and sync events arrive whatever the filter), cursor (a sequence number
// below CursorSeqMax, else a time) and zstdDictionary=<id> when dict > 0.
func subscribeURLV2(base string, collections []string, cursor int64, dict uint32) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	q := u.Query()
	for _, k := range []string{"collections", "cursor", "zstdDictionary", "wantedCollections", "compress"} {
		q.Del(k)
	}
	for _, col := range collections {
		q.Add("collections", col)
	}
	if cursor > 0 {
		q.Set("cursor", strconv.FormatInt(cursor, 10))
	}
	if dict > 0 {
		q.Set("zstdDictionary", strconv.FormatUint(uint64(dict), 10))
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
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
	// retryNow: dial the same URL again at once (a refusal the client
	// answered by changing the request: a cursor floor, a new dictionary).
	retryNow bool
	// hold is the least wait before the URL is dialled again that the
	// server asked for (refusalHold); 0 for none.
	hold time.Duration
}

// item is one frame as read: an event or the reason it was skipped.
type item struct {
	ev   Event
	fail *DecodeError
	// size is the frame's length in bytes, counted against the read-ahead
	// bound (readAhead) until the batch holding it has been handled.
	size int64
}

// readAhead bounds the bytes of frames read and not yet handled: the
// reader takes (wait) before it queues a frame and deliver gives back
// (done) once the handler has returned from the batch holding it.
type readAhead struct {
	limit   int64
	held    atomic.Int64
	settled chan struct{} // a token whenever done gives bytes back
}

func newReadAhead(limit int64) *readAhead {
	return &readAhead{limit: limit, settled: make(chan struct{}, 1)}
}

// wait blocks until n more bytes fit under the limit (any n fits when
// nothing is held, so one frame larger than the limit still passes), then
// holds them. It returns false when stop closes first.
func (r *readAhead) wait(n int64, stop <-chan struct{}) bool {
	for {
		held := r.held.Load()
		if held == 0 || held+n <= r.limit {
			r.held.Add(n)
			return true
		}
		select {
		case <-r.settled:
		case <-stop:
			return false
		}
	}
}

// done gives back n bytes.
func (r *readAhead) done(n int64) {
	if n == 0 {
		return
	}
	r.held.Add(-n)
	select {
	case r.settled <- struct{}{}:
	default:
	}
}

// connState is one connection's reading state.
type connState struct {
	conn *websocket.Conn
	v2   bool
	dec  *Decoder
	// seen is the highest sequence number this connection has accounted
	// for: an event at it is a replay of the one the cursor named
	// (dropped); a frame below it, or another frame under it, ends the
	// connection (ErrSeqReset).
	seen int64
	// resumed: the connection was dialled with a seq cursor and has not
	// yet delivered a numbered frame (see ErrSeqReset). replayed: the
	// cursor's own event is expected first (a seq cursor, not a floor),
	// stamped seenUS when that is known (ClientOptions.SeqTimeFor).
	// After the first frame, seenUS is the time of the event numbered
	// seen (0 when that frame did not decode).
	// seenHash is the hash of the frame numbered seen (seenHashed: known).
	resumed    bool
	replayed   bool
	seenUS     int64
	seenHash   uint64
	seenHashed bool
	// timeCursor is the time cursor (Unix µs) the connection was dialled
	// with, 0 for none or a seq; outdated: the host announced it clamped
	// it (OutdatedCursor) and no event has come since.
	timeCursor int64
	outdated   bool
}

// infoOutdatedCursor is the v2 #info advisory of a clamped time cursor.
const infoOutdatedCursor = "OutdatedCursor"

// ErrSeqReset ends a connection resumed from a sequence number whose first
// event is numbered below it: the host no longer knows that number (its
// store was reset, or another instance answers under the same name), and
// a future cursor only makes Jetstream live-tail. It also ends one whose
// first event is not the cursor's own, replayed (the host renumbered its
// events after a crash: see ClientOptions.SeqTimeFor), and one that
// carries a frame numbered below an earlier one, or two different frames
// under one number. The client tells
// OnSeqReset and dials again at once; the consumer then resumes that host
// by time.
var ErrSeqReset = errors.New("jetstream: the host's sequence numbers restarted below the resume cursor")

// frameSeed seeds the hashes that tell an exact repeat of a frame.
var frameSeed = maphash.MakeSeed()

// errSeqRegressed marks an ErrSeqReset found after the first frame: a
// frame numbered below one the same connection carried. The host is
// dialled again after its backoff, not at once, so a host that keeps
// doing it is not dialled in a loop.
var errSeqRegressed = errors.New("a frame numbered below an earlier one")

// session runs one connection: dial, read on its own goroutine, deliver on
// this one, and tear down. It returns when the connection fails, ctx ends
// or the handler fails, after every goroutine it started has finished.
func (c *Client) session(ctx context.Context, base string) sessionEnd {
	c.mu.Lock()
	sent := slices.Clone(c.collections)
	floor, fromFloor := c.resumeFloor[base]
	delete(c.resumeFloor, base)
	c.mu.Unlock()
	cs := connState{v2: WireOf(base) == WireV2, dec: c.dec}
	cursor := c.opts.CursorFor(base)
	if fromFloor {
		cursor = floor
	}
	if cursor > 0 && cursor < CursorSeqMax {
		// Inclusive replay: the cursor's own event was delivered before
		// (a floor's was not).
		cs.seen, cs.resumed = cursor, true
		if fromFloor {
			cs.seen = cursor - 1
		} else {
			cs.replayed = true
			if c.opts.SeqTimeFor != nil {
				cs.seenUS = c.opts.SeqTimeFor(base)
			}
		}
	} else if cursor >= CursorSeqMax {
		cs.timeCursor = cursor
	}
	var target string
	var err error
	var dictID uint32
	freshDict := false
	if cs.v2 {
		if c.opts.Compress {
			cs.dec, dictID, freshDict = c.v2Decoder(ctx, base)
		}
		target, err = subscribeURLV2(base, sent, cursor, dictID)
	} else {
		target, err = subscribeURL(base, sent, cursor, c.opts.Compress)
	}
	if err != nil {
		return sessionEnd{err: err, reason: ReasonDial}
	}
	conn, resp, err := outbound.DialWebsocket(ctx, c.opts.Dialer, target, nil)
	if err != nil {
		return c.refused(base, cursor, dictID, freshDict, resp, err)
	}
	cs.conn = conn
	connected := time.Now()
	c.opts.Metrics.setConnected(true)
	c.opts.Metrics.state(c.opts.URLs, base, StateConnected)
	c.opts.Log.Info().Str("url", logval.RedactURL(base)).Str("wire", string(WireOf(base))).Int64("cursor", cursor).Strs("collections", sent).
		Bool("compress", c.opts.Compress && (!cs.v2 || dictID > 0)).Msg("jetstream connected")

	items := make(chan item, c.opts.BatchSize)
	ahead := newReadAhead(2 * c.opts.BatchBytes)
	stop := make(chan struct{})
	var healthy, progressed atomic.Bool
	var readErr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(items)
		readErr = c.read(&cs, base, items, ahead, stop, &healthy, &progressed)
	}()
	go func() {
		defer wg.Done()
		c.ping(conn, stop)
	}()

	var handlerErr error
	if err := c.attach(conn, sent, !cs.v2 && requiresHello(base), cs.v2); err != nil {
		c.opts.Log.Warn().Err(logval.Error(err)).Msg("jetstream: filter changed while connecting and could not be sent; reconnecting")
		conn.Close()
	}
	handlerErr = c.deliver(ctx, base, items, ahead)

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
	var se *ServerError
	switch {
	case errors.Is(readErr, ErrSeqReset):
		end.reason, end.retryNow = ReasonSeqReset, !errors.Is(readErr, errSeqRegressed)
		c.opts.Log.Error().Err(readErr).Str("url", logval.RedactURL(base)).Msg("jetstream: the host's sequence numbers restarted; resuming it by time")
		if c.opts.OnSeqReset != nil {
			c.opts.OnSeqReset(base)
		}
	case errors.As(readErr, &se):
		end.reason = ReasonErrorFrame
		c.opts.Metrics.serverError(se.Name)
	case errors.As(readErr, &ne) && ne.Timeout():
		end.reason = ReasonStale
		end.err = fmt.Errorf("no event for %v (pings and pongs do not count): %w", c.opts.StaleTimeout, readErr)
	case errors.As(readErr, &ce) && ce.Code != websocket.CloseAbnormalClosure:
		end.reason = ReasonServerClose
	default:
		end.reason = ReasonReadError
	}
	return end
}

// maxRefusalBody bounds the XRPC error body of a refused upgrade we read.
const maxRefusalBody = 16 << 10

// Bounds of the hold a refused upgrade puts on its URL.
const (
	// minRateLimitHold is the least a 429 holds the URL, whatever it
	// said: Retry-After: 0, or a reset already past on this host's clock,
	// would otherwise be dialled again at MinBackoff into a spent limit.
	minRateLimitHold = time.Second
	// maxRefusalHold bounds what a Retry-After or RateLimit-Reset can
	// ask: an hour-long hold would leave the stream down without a word
	// once every URL was held. The other URLs are tried meanwhile.
	maxRefusalHold = 5 * time.Minute
)

// refusalHold is how long a refused upgrade asks its URL to be left
// alone: for a 429 or a 503, its Retry-After, else its RateLimit-Reset
// (package retryafter), a 429 at least minRateLimitHold; at most
// maxRefusalHold. 0 for any other answer: the URL's backoff applies.
// Jetstream's own HTTP client honours both headers the same way for a
// throttling CDN (segment fetches); the hold is the larger of this and
// the URL's backoff.
func refusalHold(resp *http.Response, now time.Time) time.Duration {
	d, _ := outbound.RetryRefusal(resp, now)
	if resp.StatusCode == http.StatusTooManyRequests {
		d = max(d, minRateLimitHold)
	}
	return min(d, maxRefusalHold)
}

// maxRefusalExcerpt bounds the part of a refusal's body quoted in its
// error.
const maxRefusalExcerpt = 200

// describeRefusal says what a refused upgrade answered: the status, a
// redirect's Location (credentials masked) and the start of the body on
// one line.
func describeRefusal(resp *http.Response, body []byte) string {
	s := "HTTP " + resp.Status
	if resp.Status == "" {
		s = "HTTP " + strconv.Itoa(resp.StatusCode)
	}
	if loc := resp.Header.Get("Location"); loc != "" {
		s += ", Location " + bounded(logval.MaskURL(loc)) + " (redirects are not followed: configure that URL)"
	}
	excerpt := body[:min(len(body), maxRefusalExcerpt)]
	if text := strings.Join(strings.Fields(strings.ToValidUTF8(string(excerpt), "")), " "); text != "" {
		if len(body) > maxRefusalExcerpt {
			text += "…"
		}
		s += ": " + text
	}
	return s
}

// httpErrorName is the server_errors_total name of a refusal that carries
// no XRPC error: "HTTP_" and its status.
func httpErrorName(status int) string { return "HTTP_" + strconv.Itoa(status) }

// floorInMessage finds the floor sequence number in a CursorTooOld
// message ("... below lookback floor N; ...").
var floorInMessage = regexp.MustCompile(`floor (\d+)`)

// refused turns a failed dial into a sessionEnd, acting on the XRPC
// refusals it can answer: CursorTooOld (resume from the floor, after
// telling OnCursorTooOld) and UnknownZstdDictionary (fetch the dictionary
// again, or read uncompressed if the fresh one was refused too).
func (c *Client) refused(base string, cursor int64, dictID uint32, freshDict bool, resp *http.Response, err error) sessionEnd {
	end := sessionEnd{err: fmt.Errorf("dial %s: %w", logval.RedactURL(base), err), reason: ReasonDial}
	if resp == nil {
		return end
	}
	end.hold = refusalHold(resp, time.Now())
	var body struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxRefusalBody))
	if resp.StatusCode < 400 || atproto.Unmarshal(raw, &body) != nil || body.Error == "" {
		// Not an XRPC refusal (a redirect, which gorilla does not
		// follow; a proxy's or CDN's 429 or 502 page; a v1 host's plain
		// text 400): gorilla says only "bad handshake", so the status,
		// the Location and the start of the body are added here.
		end.err = fmt.Errorf("dial %s: %w (%s)", logval.RedactURL(base), err, describeRefusal(resp, raw))
		if resp.StatusCode >= 400 {
			end.reason = ReasonRefused
			c.opts.Metrics.serverError(httpErrorName(resp.StatusCode))
		}
		return end
	}
	se := &ServerError{Name: bounded(body.Error), Message: bounded(body.Message), Status: resp.StatusCode}
	end.err, end.reason = se, ReasonRefused
	c.opts.Metrics.serverError(se.Name)
	host := HostOf(base)
	switch body.Error {
	case ErrNameCursorTooOld:
		m := floorInMessage.FindStringSubmatch(body.Message)
		if m == nil || cursor <= 0 || cursor >= CursorSeqMax {
			return end
		}
		floor, perr := strconv.ParseInt(m[1], 10, 64)
		if perr != nil || floor <= cursor {
			return end
		}
		c.opts.Metrics.cursorTooOld(floor - cursor)
		c.opts.Log.Error().Str("url", logval.RedactURL(base)).Int64("cursor", cursor).Int64("floor", floor).Int64("gap_events", floor-cursor).
			Msg("jetstream: cursor too old; the events between cursor and floor are gone from this host: resuming from its oldest event")
		if c.opts.OnCursorTooOld != nil {
			c.opts.OnCursorTooOld(base, cursor, floor)
		}
		c.mu.Lock()
		c.resumeFloor[base] = floor
		c.mu.Unlock()
		end.retryNow = true
	case ErrNameUnknownZstdDictionary:
		if dictID == 0 {
			return end
		}
		if d := c.dicts[host]; d != nil {
			d.Close()
			delete(c.dicts, host)
		}
		if freshDict {
			// The dictionary it just served is refused: compression is an
			// optimisation, carry on without it.
			c.noDict[host] = true
			c.opts.Log.Warn().Str("url", logval.RedactURL(base)).Msg("jetstream: the host refuses its own zstd dictionary; reading uncompressed")
		}
		end.retryNow = true
	}
	return end
}

// maxDictBytes bounds a fetched zstd dictionary (Jetstream's is 64 KiB).
const maxDictBytes = 4 << 20

// v2Decoder returns the decoder for base's v2 compressed frames and the
// dictionary ID to ask for, fetching the host's dictionary on first use
// (fresh is then true). Any failure degrades to uncompressed frames
// (c.dec, 0), logged: compression must never stop the stream.
func (c *Client) v2Decoder(ctx context.Context, base string) (dec *Decoder, id uint32, fresh bool) {
	host := HostOf(base)
	if c.noDict[host] {
		return c.dec, 0, false
	}
	if d := c.dicts[host]; d != nil {
		return d, d.dictID, false
	}
	if time.Now().Before(c.dictRetry[host]) {
		return c.dec, 0, false
	}
	d, err := c.fetchDictionary(ctx, base)
	var te *transientDictError
	switch {
	case errors.As(err, &te):
		// The host (or the way to it) is failing now, as it may at the
		// moment a failover dials it: read it uncompressed for now and
		// ask again later.
		c.dictRetry[host] = time.Now().Add(dictRetryAfter)
		c.opts.Log.Warn().Err(err).Str("url", logval.RedactURL(base)).Int64("retry_in_ms", dictRetryAfter.Milliseconds()).
			Msg("jetstream: zstd dictionary not fetched; reading this host uncompressed for now")
		return c.dec, 0, false
	case err != nil:
		c.noDict[host] = true
		c.opts.Log.Warn().Err(err).Str("url", logval.RedactURL(base)).Msg("jetstream: no zstd dictionary; reading this host uncompressed")
		return c.dec, 0, false
	}
	delete(c.dictRetry, host)
	c.dicts[host] = d
	return d, d.dictID, true
}

// dictRetryAfter is how long a host whose dictionary could not be fetched
// for a transient reason is read uncompressed before the fetch is tried
// again.
const dictRetryAfter = time.Minute

// transientDictError is a dictionary fetch that failed for a reason that
// may pass: no answer, a 429 or a 5xx, a body cut short. Any other failure
// (the host has no dictionary endpoint, or serves something that is not a
// zstd dictionary) is for good.
type transientDictError struct{ err error }

func (e *transientDictError) Error() string { return e.err.Error() }
func (e *transientDictError) Unwrap() error { return e.err }

func (c *Client) fetchDictionary(ctx context.Context, base string) (*Decoder, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	u.Scheme = map[string]string{"ws": "http", "wss": "https"}[u.Scheme]
	// The URL's own parameters (a proxy's token) go with the request, as
	// they do with the subscription; the subscription's do not.
	q := u.Query()
	for _, k := range []string{"collections", "cursor", "zstdDictionary", "wantedCollections", "compress", "requireHello"} {
		q.Del(k)
	}
	u.Path, u.RawQuery = PathZstdDictionary, q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return nil, &transientDictError{fmt.Errorf("fetch zstd dictionary: %w", err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("fetch zstd dictionary: HTTP %d", resp.StatusCode)
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
			return nil, &transientDictError{err}
		}
		return nil, err
	}
	dict, err := io.ReadAll(io.LimitReader(resp.Body, maxDictBytes+1))
	if err != nil {
		return nil, &transientDictError{fmt.Errorf("fetch zstd dictionary: %w", err)}
	}
	if len(dict) > maxDictBytes {
		return nil, fmt.Errorf("zstd dictionary larger than %d bytes", maxDictBytes)
	}
	id, err := DictionaryIDOf(dict)
	if err != nil {
		return nil, err
	}
	d, err := NewDecoderDict(c.dec.max, dict)
	if err != nil {
		return nil, err
	}
	d.dictID = id
	return d, nil
}

// read is the connection's reader goroutine: it reads frames, decodes them
// and queues them in order until the connection fails or stop closes.
//
// Deadlines: a connection must bring an event (any data frame but a v2
// #info) within StaleTimeout of the previous one (or of connecting);
// pings and pongs prove the socket, not the stream, and do not count. A
// frame that has started must complete within StaleTimeout.
//
// Oversized frames are read to io.Discard without being buffered, counted,
// and queued as a ClassOversized failure; the connection carries on with
// the next frame. See the package documentation for why this is not
// websocket.Conn.SetReadLimit.
func (c *Client) read(cs *connState, base string, items chan<- item, ahead *readAhead, stop <-chan struct{}, healthy, progressed *atomic.Bool) error {
	conn := cs.conn
	stale := c.opts.StaleTimeout
	limit := c.opts.MaxMessageBytes
	conn.SetPingHandler(func(data string) error {
		// A failed pong is not a read error; if the connection is really
		// gone the next read says so.
		_ = conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(writeWait))
		return nil
	})
	lastEvent := time.Now()
	var buf bytes.Buffer
	for {
		conn.SetReadDeadline(lastEvent.Add(stale))
		typ, r, err := conn.NextReader()
		if err != nil {
			return err
		}
		conn.SetReadDeadline(time.Now().Add(stale))
		buf.Reset()
		n, err := buf.ReadFrom(io.LimitReader(r, limit+1))
		if err != nil {
			return err
		}
		var it item
		info := false
		if n > limit {
			rest, err := io.Copy(io.Discard, r)
			if err != nil {
				return err
			}
			n += rest
			it.fail = &DecodeError{Class: ClassOversized, Size: n,
				Err: fmt.Errorf("frame exceeds the %d-byte limit; skipped", limit)}
		} else if cs.v2 {
			d, err := cs.dec.decodeV2(buf.Bytes(), typ == websocket.BinaryMessage)
			switch {
			case err != nil:
				if !errors.As(err, &it.fail) {
					it.fail = &DecodeError{Class: ClassMalformedJSON, Size: n, Err: err}
				}
			case d.err != nil:
				c.opts.Metrics.frame(n)
				return d.err
			case d.info != nil:
				info = true
				if d.info.Name == infoOutdatedCursor && cs.timeCursor > 0 {
					cs.outdated = true
				}
				c.opts.Metrics.info(d.info.Name)
				c.opts.Log.Warn().Str("url", logval.RedactURL(base)).Str("name", bounded(d.info.Name)).Str("message", bounded(d.info.Message)).
					Msg("jetstream #info advisory")
			default:
				it.ev = d.ev
			}
		} else if ev, err := cs.dec.Decode(buf.Bytes(), typ == websocket.BinaryMessage); err != nil {
			if !errors.As(err, &it.fail) {
				it.fail = &DecodeError{Class: ClassMalformedJSON, Size: n, Err: err}
			}
		} else {
			it.ev = ev
		}
		c.opts.Metrics.frame(n)
		// The frame's own bytes tell an exact repeat from another frame
		// under the same number (see the duplicate check below).
		var frameHash uint64
		if max(it.ev.Seq, failSeq(it.fail)) > 0 { // only numbered frames are compared
			frameHash = maphash.Bytes(frameSeed, buf.Bytes())
		}
		if buf.Cap() > keptReadBuffer {
			// A large frame grew the buffer (to up to twice the frame
			// limit): let it go instead of holding it for every frame
			// after. Nothing decoded refers to it.
			buf = bytes.Buffer{}
		}
		if info {
			continue
		}
		lastEvent = time.Now()
		healthy.Store(true)
		if seq := max(it.ev.Seq, failSeq(it.fail)); cs.resumed && seq > 0 {
			cs.resumed = false
			switch {
			case seq < cs.seen:
				return fmt.Errorf("%w: first seq %d, cursor %d", ErrSeqReset, seq, cs.seen)
			case cs.replayed && cs.seenUS > 0 && seq > cs.seen:
				return fmt.Errorf("%w: first seq %d, not the cursor's own %d replayed (the host renumbered its events, or no longer sends that one)",
					ErrSeqReset, seq, cs.seen)
			case cs.replayed && cs.seenUS > 0 && it.fail == nil && it.ev.TimeUS != cs.seenUS:
				return fmt.Errorf("%w: the event at the cursor's seq %d is stamped %d, not %d as read before (the host renumbered its events)",
					ErrSeqReset, seq, it.ev.TimeUS, cs.seenUS)
			}
		} else if seq > 0 && seq < cs.seen {
			// Numbered below a frame this connection already carried: one
			// of the two numbers is wrong (a frame numbered far ahead, a
			// host renumbering), and which cannot be told. Dropping every
			// frame until the stream caught up with the higher number
			// lost them all, and the position stayed on it. The host is
			// resumed by time instead, like a reset at the first frame:
			// what it sends again is applied idempotently. The frame is
			// counted as ClassSeqRegression.
			err := fmt.Errorf("%w: %w: seq %d after seq %d on the same connection", ErrSeqReset, errSeqRegressed, seq, cs.seen)
			c.opts.Metrics.decoded(nil, &DecodeError{Class: ClassSeqRegression, Size: n, TimeUS: it.ev.TimeUS, Seq: seq, Err: err})
			return err
		} else if seq > 0 && seq == cs.seen && (it.fail != nil || !cs.seenHashed || frameHash != cs.seenHash) {
			// The number of the frame before it, on another frame: one of
			// the two is not what the host numbers so (a bogus frame just
			// before a real one took its number, even its DID and time,
			// and dropping the second as a duplicate lost the real event
			// for good). Only a byte-for-byte repeat of a decoded event is
			// a duplicate; anything else resumes the host by time, as
			// above.
			err := fmt.Errorf("%w: %w: seq %d twice on the same connection, on different frames", ErrSeqReset, errSeqRegressed, seq)
			c.opts.Metrics.decoded(nil, &DecodeError{Class: ClassSeqRegression, Size: n, TimeUS: it.ev.TimeUS, Seq: seq, Err: err})
			return err
		}
		if it.fail == nil {
			before := cs.seen
			c.check(&it, n, cs, progressed)
			if cs.seen != before {
				cs.seenHash, cs.seenHashed = frameHash, true
			}
		} else if it.fail.Seq > cs.seen {
			cs.seen = it.fail.Seq // delivered, if undecodable: later seqs must be above it
			cs.seenUS, cs.seenHashed = 0, false
		}
		if it.fail == nil && it.ev.Kind == "" {
			continue // a replay of an event already delivered
		}
		if cs.outdated && it.fail == nil {
			cs.outdated = false
			if it.ev.TimeUS > cs.timeCursor && c.opts.OnOutdatedCursor != nil {
				c.opts.OnOutdatedCursor(base, cs.timeCursor, it.ev.TimeUS, it.ev.Seq)
			}
		}
		if it.fail != nil {
			c.opts.Metrics.decoded(nil, it.fail)
		} else {
			c.lastEvent.Store(lastEvent.UnixNano())
			c.opts.Metrics.decoded(&it.ev, nil)
			if c.opts.Prepare != nil {
				c.opts.Prepare(&it.ev)
			}
		}
		if it.fail == nil {
			it.size = n // a failure keeps none of its frame
		}
		if !ahead.wait(it.size, stop) {
			return nil
		}
		select {
		case items <- it:
		case <-stop:
			return nil
		}
	}
}

// check applies the client's rules to a decoded event: not stamped far
// in the future, in a wanted collection, and in sequence. A replay of the
// event the cursor named (inclusive replay) is blanked (Kind "") for the
// caller to drop.
func (c *Client) check(it *item, n int64, cs *connState, progressed *atomic.Bool) {
	ev := &it.ev
	if ev.Seq > 0 {
		switch {
		case ev.Seq == cs.seen:
			*ev = Event{}
			return
		}
		cs.seen, cs.seenUS = ev.Seq, ev.TimeUS
	}
	if limit := time.Now().Add(MaxFutureSkew).UnixMicro(); ev.TimeUS > limit {
		it.fail = &DecodeError{Class: ClassInvalidEvent, Size: n, TimeUS: ev.TimeUS, Seq: ev.Seq,
			Err: fmt.Errorf("time_us %d is more than %s ahead of this host's clock", ev.TimeUS, MaxFutureSkew)}
		return
	}
	if ev.Commit != nil && !c.filter.Load().wants(ev.Commit.Collection) {
		it.fail = &DecodeError{Class: ClassUnwantedCollection, Size: n, TimeUS: ev.TimeUS, Seq: ev.Seq,
			Err: fmt.Errorf("collection %q is not in wantedCollections", ev.Commit.Collection)}
		return
	}
	if ev.TimeUS > c.newestUS || ev.Seq > 0 {
		c.newestUS = max(c.newestUS, ev.TimeUS)
		progressed.Store(true)
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
func (c *Client) deliver(ctx context.Context, endpoint string, items <-chan item, ahead *readAhead) error {
	var b Batch
	var size int64 // of b's frames
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
		for i := range out.Events {
			out.MaxSeq = max(out.MaxSeq, out.Events[i].Seq)
		}
		for _, f := range out.Failures {
			out.MaxSeq = max(out.MaxSeq, f.Seq)
		}
		held := size
		b, size = Batch{}, 0
		err := c.handler(ctx, out)
		ahead.done(held)
		return err
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
			size += it.size
			if b.Len() >= c.opts.BatchSize || size >= c.opts.BatchBytes {
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

func failSeq(f *DecodeError) int64 {
	if f == nil {
		return 0
	}
	return f.Seq
}
