package jetstream

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
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
	// While the consumer catches up, a batch is one transaction, cut
	// short by the consumer's commit budget (which bounds how long one
	// holds the write lock) and by DefaultBatchBytes: fewer, larger
	// transactions write each hot page to the WAL once per commit, not
	// once per thousand events. A replay through serve ran 12-14k
	// events/s with 1,000, 16-19k with 3,000 or 5,000 (appview-dev bench
	// --only replay-serve), and 1,000 had been 1.5x as fast as 100. A batch never
	// waits to fill: it is what had arrived when the handler was free
	// (see deliver), so live a lone frame is a batch of its own and a
	// catch-up's batches fill while the one before commits.
	DefaultBatchSize = 5000
	// DefaultBatchBytes is the most frame bytes (as decoded, before
	// parsing) in one Batch; the client also holds at most twice this in
	// frames read and not yet handled (plus one frame), so memory stays
	// bounded when frames are large.
	DefaultBatchBytes = 8 << 20
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
	// BatchSize, BatchBytes and BatchLinger shape deliveries: a Batch
	// holds what has arrived, delivered as soon as the handler is free,
	// and at most BatchSize entries or frames of BatchBytes bytes in all;
	// a BatchLinger above 0 makes a partial batch wait that long after
	// its first entry for more. The client reads ahead at most BatchSize
	// entries and 2 x BatchBytes bytes (one frame more when a single
	// frame is larger) beyond what its handler has returned from. 0 means
	// DefaultBatchSize, DefaultBatchBytes, and no linger.
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
	// Received[i] is when the frame of Events[i] began to be read off the
	// socket, on this host's clock: where a frame's time to its commit
	// starts (appview_jetstream_event_commit_seconds). Nil in a batch not
	// read from a connection.
	Received []time.Time
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
	// where is the rest of Upstream.
	where   where
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
	c.setState("", "")
	at := 0
	// failing: the last connection delivered nothing. A run of such
	// failures (every host unreachable) is logged at warn once, then at
	// debug until a connection delivers again: the consumer says it is
	// unhealthy, once, and a line every retry would say nothing more.
	failing := false
	for {
		endpoint := c.opts.URLs[at]
		if wait := time.Until(hosts[at].notBefore); wait > 0 {
			c.setState(endpoint, StateBackoff)
			if !sleepCtx(ctx, wait) {
				return nil
			}
		}
		c.setState(endpoint, StateConnecting)
		back := c.sessionWithFailback(ctx, endpoint, hosts[:at])
		end := back.end
		c.setState(endpoint, "")
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
		c.setLastError(end.err)
		c.opts.Metrics.reconnect(end.reason)
		ev := c.opts.Log.Warn()
		if failing && !end.healthy {
			ev = c.opts.Log.Debug()
		}
		failing = !end.healthy
		ev.Err(logval.Error(end.err)).Str("url", logval.RedactURL(endpoint)).Str("reason", end.reason).
			Str("next_url", logval.RedactURL(next)).Int64("retry_in_ms", max(0, hosts[at].notBefore.Sub(now).Milliseconds())).Msg("jetstream connection lost")
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

// sleepCtx waits d or until ctx ends; it reports whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
