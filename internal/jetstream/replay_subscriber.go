package jetstream

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"
)

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

func (s *ReplayServer) handleSubscribe(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	compress := q.Get("compress") == "true" || strings.Contains(r.Header.Get("Socket-Encoding"), "zstd")
	s.subscribe(w, r, subscription{wire: WireLegacy, collections: q["wantedCollections"], compress: compress})
}

// subscription is what a subscriber asked for, beyond what both wires
// read alike from the query (cursor, wantedDids, maxMessageSizeBytes).
type subscription struct {
	wire        Wire
	collections []string
	// compress: zstd binary frames with the dictionary (the v1 one, which
	// is also the one the v2 path serves).
	compress bool
	cursor   int64
}

// subscribe upgrades r and streams the capture to it on sub's wire.
func (s *ReplayServer) subscribe(w http.ResponseWriter, r *http.Request, sub subscription) {
	q := r.URL.Query()
	maxBytes := 0
	if v := q.Get("maxMessageSizeBytes"); v != "" {
		// Jetstream reads a bad or negative value as "no limit".
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			maxBytes = n
		}
	}
	if v := q.Get("cursor"); v != "" {
		var err error
		if sub.cursor, err = strconv.ParseInt(v, 10, 64); err != nil {
			http.Error(w, fmt.Sprintf("invalid cursor: %s", v), http.StatusBadRequest)
			return
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &replayConn{ctx: ctx, cancel: cancel}
	if err := c.setOptions(optionsUpdate{WantedCollections: sub.collections, WantedDIDs: q["wantedDids"], MaxMessageSizeBytes: maxBytes}); err != nil {
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
	log.Info().Str("wire", string(sub.wire)).Int64("cursor", sub.cursor).Bool("compress", sub.compress).Strs("collections", sub.collections).
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
	sent, err := s.stream(c, ws, sub)
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

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// stream sends the capture to one subscriber, then holds the connection
// open until it ends. It returns how many events it sent.
func (s *ReplayServer) stream(c *replayConn, ws *websocket.Conn, sub subscription) (int, error) {
	cursor, compress, v2 := sub.cursor, sub.compress, sub.wire == WireV2
	msgType := websocket.TextMessage
	if compress {
		msgType = websocket.BinaryMessage
	}
	// A capture whose every line is numbered is served like a Jetstream
	// v2 server: a cursor below CursorSeqMax is a sequence number,
	// replayed from inclusively in file order (not looped). The v2 wire
	// serves only such a capture, and never loops it: its sequence
	// numbers would repeat.
	bySeq := s.numbered && cursor > 0 && cursor < CursorSeqMax
	var loop int64
	if s.opts.Loop && !bySeq && !v2 && cursor > s.maxT {
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
			if v2 {
				frame = e.v2Frame(compress)
			}
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
		if !s.opts.Loop || bySeq || v2 {
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
