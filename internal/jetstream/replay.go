package jetstream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
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
// served as a Jetstream v2 server serves it: on /subscribe with those
// numbers, and on the v2 wire (PathV2, replay_v2.go); a cursor below
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
	s.mux.HandleFunc(PathV2, s.handleSubscribeV2)
	s.mux.HandleFunc(PathZstdDictionary, handleDictionary)
	return s, nil
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
