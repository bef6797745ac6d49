package jetstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"
)

// DefaultReplayListen is the address `appview jetstream-replay` listens on
// without --listen (6008 is Jetstream's own default port).
const DefaultReplayListen = "127.0.0.1:6008"

// Replay server timings.
const (
	// replayHeaderTimeout bounds reading the HTTP upgrade request.
	replayHeaderTimeout = 10 * time.Second
	// replayCloseWait bounds writing the close frame on shutdown: a client
	// that does not read must not hold the server up.
	replayCloseWait = 100 * time.Millisecond
	// replayShutdownWait bounds waiting for HTTP requests that have not
	// become websockets yet.
	replayShutdownWait = time.Second
	// replayIdleLoopWait is the pause between looped passes that sent
	// nothing.
	replayIdleLoopWait = 100 * time.Millisecond
	// replayReadLimit caps a subscriber message (bytes); options_update
	// payloads are small.
	replayReadLimit = 1 << 20
)

// ErrReplayClosed is returned by Serve on a ReplayServer already closed.
var ErrReplayClosed = errors.New("jetstream replay server closed")

// ReplayOptions configures a ReplayServer. Each field is one flag of
// `appview jetstream-replay`.
type ReplayOptions struct {
	// File is the JSONL capture to serve (--file): one Jetstream v1 event
	// a line, as Jetstream sent it. Blank lines are skipped; any other line
	// that does not Decode is refused at load, naming its line number.
	File string
	// Listen is the TCP address to listen on (--listen); "" means
	// DefaultReplayListen.
	Listen string
	// Rate paces every connection to at most this many events per second
	// (--rate), counting events sent, not filtered ones; 0 sends as fast as
	// the client reads. A positive rate is at least MinReplayRate.
	Rate float64
	// Loop replays the file again after its last event, forever (--loop).
	// Loop n (from 0) adds n × (max time_us − min time_us + 1) to every
	// time_us, so each loop starts after the previous one ended and a cursor
	// names one point of the endless stream.
	Loop bool
	// DropAfter closes each connection abruptly, with no close frame, after
	// it has sent this many events (--drop-after); 0 never does. A test
	// hook for resumption, like DropConnections.
	DropAfter int
}

// ReplayServer serves a JSONL capture as a Jetstream v1 /subscribe endpoint:
// cursor replay (inclusive: every event with time_us >= cursor, in file
// order), wantedCollections with prefix.* (identity and account events
// always pass), wantedDids, maxMessageSizeBytes, compress=true (binary
// frames, zstd with the Jetstream dictionary), options_update messages
// applied mid-stream, pacing and looping. After the file it keeps the
// connection open, as a live tail with nothing new to say, unless looping.
//
// A capture whose every line carries a "cursor" (sequence number) is
// served like a Jetstream v2 server's legacy wire: a cursor below
// CursorSeqMax replays from that sequence number, inclusively.
//
// Unlike a real Jetstream it serves the file's order as is, including the
// time_us inversions real captures contain (a real server's replay comes
// from its time-ordered store), and it does not ping (clients that need
// liveness ping it; it answers). requireHello is not supported.
type ReplayServer struct {
	opts   ReplayOptions
	log    zerolog.Logger
	events []replayEvent
	// minT and maxT bound time_us over the file; span = maxT - minT + 1 is
	// the time_us shift between loops.
	minT, maxT, span int64
	// numbered: every line carries a sequence number ("cursor"), so a
	// cursor below CursorSeqMax is one of them (see stream).
	numbered bool

	upgrader websocket.Upgrader
	mux      *http.ServeMux

	mu        sync.Mutex
	srv       *http.Server
	ln        net.Listener
	conns     map[*replayConn]struct{}
	closed    bool
	listening chan struct{}
	handlers  sync.WaitGroup

	accepted atomic.Int64
}

// replayEvent is one line of the capture, ready to send.
type replayEvent struct {
	timeUS int64
	// seq is the line's "cursor" field (a v2 server's sequence number on
	// the legacy wire), 0 when it has none.
	seq        int64
	did        string
	collection string
	// raw is the line as captured; compressed is raw as a binary frame,
	// built the first time a compressed subscription sends it (once).
	// Lazily, event by event: compressing a large capture up front
	// (seconds to minutes) would keep the first subscriber waiting with
	// nothing on the wire, and a client counts that as a silent host.
	raw, compressed []byte
	once            sync.Once
	// prefix and suffix surround the digits of the top-level time_us in
	// raw, so a looped copy is the same bytes with another number.
	prefix, suffix []byte
}

// MinReplayRate is the slowest pace ReplayOptions.Rate may set (events per
// second): one event in about 11.6 days. Below about 1.2e-10 the interval
// between events no longer fits a time.Duration, and overflowed, it turned
// negative and the pacing off.
const MinReplayRate = 1e-6

// NewReplayServer loads opts.File and returns a server ready to Serve. It
// refuses a missing file and one without a single good event. A line that
// is not a Jetstream event (bad JSON, no kind, no integer top-level
// time_us) is logged at warn with its number and the bounded decode error,
// and skipped: one bad line of a long capture does not cost the rest.
func NewReplayServer(opts ReplayOptions, log zerolog.Logger) (*ReplayServer, error) {
	switch {
	case opts.File == "":
		return nil, errors.New("jetstream replay: no capture file (--file)")
	case math.IsNaN(opts.Rate) || math.IsInf(opts.Rate, 0):
		return nil, fmt.Errorf("jetstream replay: --rate %v: must be a finite number of events per second", opts.Rate)
	case opts.Rate < 0:
		return nil, fmt.Errorf("jetstream replay: --rate %v: must not be negative", opts.Rate)
	case opts.Rate > 0 && opts.Rate < MinReplayRate:
		return nil, fmt.Errorf("jetstream replay: --rate %v: must be 0 (unpaced) or at least %v events per second", opts.Rate, MinReplayRate)
	case opts.DropAfter < 0:
		return nil, fmt.Errorf("jetstream replay: --drop-after %d: must not be negative", opts.DropAfter)
	}
	if opts.Listen == "" {
		opts.Listen = DefaultReplayListen
	}
	f, err := os.Open(opts.File)
	if err != nil {
		return nil, fmt.Errorf("jetstream replay: %w", err)
	}
	defer f.Close()
	skipped := 0
	events, err := loadCapture(opts.File, f, func(lineNo int, err error) {
		skipped++
		if skipped <= maxSkipLogs {
			log.Warn().Str("file", opts.File).Int("line", lineNo).Str("error", logval.Err(err)).
				Msg("jetstream replay: not an event; line skipped")
		}
	})
	if skipped > 0 {
		log.Warn().Str("file", opts.File).Int("skipped", skipped).Int("events", len(events)).
			Msg("jetstream replay: lines skipped (only the first are logged one by one)")
	}
	if err != nil {
		return nil, err
	}
	s := &ReplayServer{
		opts:      opts,
		log:       log,
		events:    events,
		minT:      events[0].timeUS,
		maxT:      events[0].timeUS,
		conns:     map[*replayConn]struct{}{},
		listening: make(chan struct{}),
		// Jetstream accepts any origin: subscribers are not browsers
		// acting for a user.
		upgrader: websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }},
	}
	s.numbered = true
	for i := range events {
		s.minT = min(s.minT, events[i].timeUS)
		s.maxT = max(s.maxT, events[i].timeUS)
		s.numbered = s.numbered && events[i].seq > 0
	}
	s.span = s.maxT - s.minT + 1
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("/subscribe", s.handleSubscribe)
	return s, nil
}

// maxSkipLogs bounds the per-line warnings of skipped capture lines.
const maxSkipLogs = 20

// loadCapture reads a JSONL capture; name is only for error messages. A
// line that is not an event is passed to skip (its 1-based number and why)
// and left out; it fails on a read error or when no line is an event.
func loadCapture(name string, r io.Reader, skip func(lineNo int, err error)) ([]replayEvent, error) {
	br := bufio.NewReader(r)
	var events []replayEvent
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("jetstream replay: %s:%d: %w", name, lineNo, err)
		}
		if lineNo == 1 {
			// A UTF-8 byte-order mark, as some editors write one, is not
			// part of the first event (RFC 8259 §8.1 lets a parser ignore
			// it).
			line = bytes.TrimPrefix(line, []byte("\ufeff"))
		}
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			ev, derr := Decode(trimmed)
			var prefix, suffix []byte
			if derr == nil {
				prefix, suffix, derr = splitAtTimeUS(trimmed)
			}
			if derr != nil {
				skip(lineNo, derr)
				if errors.Is(err, io.EOF) {
					break
				}
				continue
			}
			raw := append([]byte(nil), trimmed...)
			events = append(events, replayEvent{
				timeUS:     ev.TimeUS,
				seq:        ev.Seq,
				did:        ev.DID,
				collection: ev.Collection(),
				raw:        raw,
				prefix:     prefix,
				suffix:     suffix,
			})
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if len(events) == 0 {
		return nil, fmt.Errorf("jetstream replay: %s: no events", name)
	}
	return events, nil
}

// splitAtTimeUS returns the bytes of an event object before and after the
// digits of its top-level "time_us" value (the last one, as encoding/json
// keeps the last of duplicate keys). It walks the top level with a tokenizer
// so a "time_us" inside a record cannot be mistaken for it.
func splitAtTimeUS(obj []byte) (prefix, suffix []byte, err error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if _, err := dec.Token(); err != nil { // the opening brace; Decode checked the shape
		return nil, nil, err
	}
	start, end := -1, -1
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		keyEnd := int(dec.InputOffset())
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, nil, err
		}
		if tok == "time_us" {
			valueEnd := int(dec.InputOffset())
			i := bytes.IndexAny(obj[keyEnd:valueEnd], "-0123456789")
			if i < 0 || !bytes.Equal(obj[keyEnd+i:keyEnd+i+len(value)], value) {
				return nil, nil, fmt.Errorf("time_us %s is not an integer literal", value)
			}
			start, end = keyEnd+i, keyEnd+i+len(value)
		}
	}
	if start < 0 {
		return nil, nil, errors.New("no top-level time_us")
	}
	return append([]byte(nil), obj[:start]...), append([]byte(nil), obj[end:]...), nil
}

// frame is event e with time_us shifted by shift, as a text or binary frame
// payload.
func (e *replayEvent) frame(shift int64, compress bool) []byte {
	if shift == 0 {
		if compress {
			e.once.Do(func() { e.compressed = Compress(nil, e.raw) })
			return e.compressed
		}
		return e.raw
	}
	line := make([]byte, 0, len(e.prefix)+20+len(e.suffix))
	line = append(line, e.prefix...)
	line = strconv.AppendInt(line, e.timeUS+shift, 10)
	line = append(line, e.suffix...)
	if compress {
		return Compress(nil, line)
	}
	return line
}

// ListenAndServe listens on opts.Listen and serves until ctx is cancelled
// (then it closes the server, like Close, and returns nil) or serving fails.
func (s *ReplayServer) ListenAndServe(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.opts.Listen)
	if err != nil {
		return fmt.Errorf("jetstream replay: listen %s: %w", s.opts.Listen, err)
	}
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-ctx.Done():
			s.Close()
		case <-stop:
		}
	}()
	err = s.Serve(ln)
	close(stop)
	<-watched
	if ctx.Err() != nil {
		return nil
	}
	s.Close()
	return err
}

// Serve accepts connections on l until Close. It returns nil after Close,
// ErrReplayClosed if the server was closed before, or the listener's error.
func (s *ReplayServer) Serve(l net.Listener) error {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		if l != nil {
			l.Close()
		}
		return ErrReplayClosed
	case s.srv != nil:
		s.mu.Unlock()
		return errors.New("jetstream replay: already serving")
	}
	s.ln = l
	s.srv = &http.Server{Handler: s.mux, ReadHeaderTimeout: replayHeaderTimeout}
	srv := s.srv
	close(s.listening)
	s.mu.Unlock()
	s.log.Info().Str("addr", l.Addr().String()).Str("file", s.opts.File).Int("events", len(s.events)).
		Float64("rate", s.opts.Rate).Bool("loop", s.opts.Loop).Msg("jetstream replay: serving")
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("jetstream replay: %w", err)
	}
	return nil
}

// Listening is closed once the server has a listener (Addr is then set).
func (s *ReplayServer) Listening() <-chan struct{} { return s.listening }

// Addr is the address the server listens on, or nil before Serve.
func (s *ReplayServer) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// URL is the ws:// URL of the /subscribe endpoint, or "" before Serve.
func (s *ReplayServer) URL() string {
	a := s.Addr()
	if a == nil {
		return ""
	}
	return "ws://" + a.String() + "/subscribe"
}

// Connections is how many websocket connections the server has accepted
// since it started (a reconnecting client adds one per connection).
func (s *ReplayServer) Connections() int64 { return s.accepted.Load() }

// DropConnections closes every open connection abruptly (no close frame,
// like a network failure) and returns how many it dropped. New connections
// are accepted as before.
func (s *ReplayServer) DropConnections() int {
	s.mu.Lock()
	conns := make([]*replayConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.cancel()
	}
	return len(conns)
}

// Close stops accepting, sends every subscriber a going-away close frame,
// closes the connections and waits for their goroutines to finish.
func (s *ReplayServer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.handlers.Wait()
		return nil
	}
	s.closed = true
	srv := s.srv
	conns := make([]*replayConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()

	var err error
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), replayShutdownWait)
		// Shutdown closes the listener and waits for requests that are not
		// websockets yet; hijacked connections are ours to close.
		if serr := srv.Shutdown(ctx); serr != nil {
			err = srv.Close()
		}
		cancel()
	}
	// In parallel: each close frame may wait replayCloseWait on a client
	// that does not read, and there may be many.
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(c.goAway)
	}
	wg.Wait()
	s.handlers.Wait()
	return err
}

// replayConn is one subscriber.
type replayConn struct {
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	ws     *websocket.Conn
	filter collectionFilter
	dids   map[string]bool
	// maxBytes skips events larger than this as sent; 0 = no limit.
	maxBytes int
}

// track registers a connection before its upgrade, so Close either sees it
// or the handler sees the server closed; never neither.
func (s *ReplayServer) track(c *replayConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	s.handlers.Add(1)
	return true
}

func (s *ReplayServer) untrack(c *replayConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.handlers.Done()
}

func (c *replayConn) setOptions(u optionsUpdate) error {
	f, err := newCollectionFilter(u.WantedCollections)
	if err != nil {
		return err
	}
	if len(u.WantedDIDs) > maxWantedDIDs {
		return fmt.Errorf("%d wantedDids, at most %d", len(u.WantedDIDs), maxWantedDIDs)
	}
	dids := map[string]bool{}
	for _, d := range u.WantedDIDs {
		if !validDID(d) {
			return fmt.Errorf("invalid DID %q", d)
		}
		dids[d] = true
	}
	c.mu.Lock()
	c.filter, c.dids, c.maxBytes = f, dids, max(u.MaxMessageSizeBytes, 0)
	c.mu.Unlock()
	return nil
}

// wants applies the subscriber's collection and DID filters to e.
func (c *replayConn) wants(e *replayEvent) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.filter.wants(e.collection) && (len(c.dids) == 0 || c.dids[e.did])
}

// fits applies maxMessageSizeBytes to a frame payload of n bytes.
func (c *replayConn) fits(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxBytes == 0 || n <= c.maxBytes
}

func (c *replayConn) goAway() {
	c.mu.Lock()
	ws := c.ws
	c.mu.Unlock()
	if ws != nil {
		// Best effort: a client that is not reading must not delay shutdown.
		_ = ws.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseGoingAway, "replay server shutting down"),
			time.Now().Add(replayCloseWait))
	}
	c.cancel()
}

func (s *ReplayServer) handleSubscribe(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	maxBytes := 0
	if v := q.Get("maxMessageSizeBytes"); v != "" {
		// Jetstream reads a bad or negative value as "no limit".
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			maxBytes = n
		}
	}
	var cursor int64
	if v := q.Get("cursor"); v != "" {
		var err error
		if cursor, err = strconv.ParseInt(v, 10, 64); err != nil {
			http.Error(w, fmt.Sprintf("invalid cursor: %s", v), http.StatusBadRequest)
			return
		}
	}
	compress := q.Get("compress") == "true" || strings.Contains(r.Header.Get("Socket-Encoding"), "zstd")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &replayConn{ctx: ctx, cancel: cancel}
	if err := c.setOptions(optionsUpdate{WantedCollections: q["wantedCollections"], WantedDIDs: q["wantedDids"], MaxMessageSizeBytes: maxBytes}); err != nil {
		http.Error(w, "invalid subscriber options: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !s.track(c) {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	defer s.untrack(c)
	ws, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // Upgrade has answered the request
	}
	ws.SetReadLimit(replayReadLimit)
	c.mu.Lock()
	c.ws = ws
	c.mu.Unlock()
	n := s.accepted.Add(1)
	log := s.log.With().Int64("conn", n).Str("remote", r.RemoteAddr).Logger()
	log.Info().Int64("cursor", cursor).Bool("compress", compress).Strs("collections", q["wantedCollections"]).
		Msg("jetstream replay: subscriber connected")

	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		ws.Close()
	}()
	go func() {
		defer wg.Done()
		defer cancel()
		s.readSubscriber(c, ws, log)
	}()
	sent, err := s.stream(c, ws, cursor, compress)
	cancel()
	wg.Wait()
	log.Info().Int("sent", sent).AnErr("error", err).Msg("jetstream replay: subscriber gone")
}

// readSubscriber applies options_update messages until the socket fails.
// Reading is also what answers the client's pings.
func (s *ReplayServer) readSubscriber(c *replayConn, ws *websocket.Conn, log zerolog.Logger) {
	for {
		typ, msg, err := ws.ReadMessage()
		if err != nil {
			return
		}
		if typ != websocket.TextMessage {
			continue
		}
		var m subscriberMessage
		var u optionsUpdate
		err = json.Unmarshal(msg, &m)
		if err == nil && m.Type != messageTypeOptionsUpdate {
			log.Warn().Str("type", logval.String(m.Type)).Msg("jetstream replay: ignoring unknown subscriber message")
			continue
		}
		if err == nil {
			err = json.Unmarshal(m.Payload, &u)
		}
		if err == nil {
			err = c.setOptions(u)
		}
		if err != nil {
			// As Jetstream does: a bad update ends the subscription.
			log.Warn().Err(logval.Error(err)).Msg("jetstream replay: bad options_update")
			_ = ws.WriteControl(websocket.CloseMessage,
				websocket.FormatCloseMessage(websocket.ClosePolicyViolation, truncate("bad options_update: "+err.Error(), 120)),
				time.Now().Add(replayCloseWait))
			return
		}
		log.Info().Strs("collections", u.WantedCollections).Int("dids", len(u.WantedDIDs)).Msg("jetstream replay: options updated")
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// stream sends the capture to one subscriber, then holds the connection
// open until it ends. It returns how many events it sent.
func (s *ReplayServer) stream(c *replayConn, ws *websocket.Conn, cursor int64, compress bool) (int, error) {
	msgType := websocket.TextMessage
	if compress {
		msgType = websocket.BinaryMessage
	}
	// A capture whose every line is numbered is served like a Jetstream
	// v2 server's legacy wire: a cursor below CursorSeqMax is a sequence
	// number, replayed from inclusively in file order (not looped).
	bySeq := s.numbered && cursor > 0 && cursor < CursorSeqMax
	var loop int64
	if s.opts.Loop && !bySeq && cursor > s.maxT {
		// The first loop whose last event reaches the cursor.
		loop = (cursor - s.maxT + s.span - 1) / s.span
	}
	p := pacer{rate: s.opts.Rate}
	sent := 0
	for ; ; loop++ {
		shift := loop * s.span
		sentBefore := sent
		for i := range s.events {
			e := &s.events[i]
			if bySeq && e.seq < cursor || !bySeq && e.timeUS+shift < cursor || !c.wants(e) {
				continue
			}
			frame := e.frame(shift, compress)
			if !c.fits(len(frame)) {
				continue
			}
			if err := p.wait(c.ctx); err != nil {
				return sent, nil
			}
			// No write deadline: a blocked write is the backpressure of a
			// client that reads slowly. Close and drops unblock it.
			if err := ws.WriteMessage(msgType, frame); err != nil {
				return sent, err
			}
			sent++
			if s.opts.DropAfter > 0 && sent >= s.opts.DropAfter {
				c.cancel()
				return sent, nil
			}
		}
		if !s.opts.Loop || bySeq {
			break
		}
		if sent == sentBefore {
			// Nothing in the file passes the filters; looping at full speed
			// would only burn CPU until an options_update widens them.
			if !sleepCtx(c.ctx, replayIdleLoopWait) {
				return sent, nil
			}
		}
	}
	<-c.ctx.Done()
	return sent, nil
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

// pacer spaces sends 1/rate seconds apart. A late sender does not catch up
// with a burst: the schedule restarts from now.
type pacer struct {
	rate float64 // events per second; 0 = unpaced
	next time.Time
}

func (p *pacer) wait(ctx context.Context) error {
	if p.rate <= 0 {
		return ctx.Err()
	}
	now := time.Now()
	if p.next.After(now) {
		if !sleepCtx(ctx, p.next.Sub(now)) {
			return ctx.Err()
		}
	} else {
		p.next = now
	}
	p.next = p.next.Add(time.Duration(float64(time.Second) / p.rate))
	return nil
}
