package jetstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"
	"github.com/gorilla/websocket"
)

// sessionEnd is how one connection ended.
type sessionEnd struct {
	err        error
	reason     string // a Reason* constant
	healthy    bool   // the server sent at least one data frame other than a v2 #info
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

// session runs one connection: dial, read on its own goroutine, deliver on
// this one, and tear down. It returns when the connection fails, ctx ends
// or the handler fails, after every goroutine it started has finished.
func (c *Client) session(ctx context.Context, base string) sessionEnd {
	c.mu.Lock()
	sent := slices.Clone(c.collections)
	floor, fromFloor := c.resumeFloor[base]
	delete(c.resumeFloor, base)
	c.mu.Unlock()
	cs := connState{base: base, v2: WireOf(base) == WireV2, dec: c.dec}
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
	c.setState(base, StateConnected)
	c.opts.Log.Info().Str("url", logval.RedactURL(base)).Str("wire", string(WireOf(base))).Int64("cursor", cursor).Strs("collections", sent).
		Bool("compress", c.opts.Compress && (!cs.v2 || dictID > 0)).Msg("jetstream connected")

	cs.items = make(chan item, c.opts.BatchSize)
	cs.ahead = newReadAhead(2 * c.opts.BatchBytes)
	cs.stop = make(chan struct{})
	var readErr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(cs.items)
		readErr = c.read(&cs)
	}()
	go func() {
		defer wg.Done()
		c.ping(conn, cs.stop)
	}()

	var handlerErr error
	if err := c.attach(conn, sent, !cs.v2 && requiresHello(base), cs.v2); err != nil {
		c.opts.Log.Warn().Err(logval.Error(err)).Msg("jetstream: filter changed while connecting and could not be sent; reconnecting")
		conn.Close()
	}
	handlerErr = c.deliver(ctx, &cs)

	close(cs.stop)
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

	end := sessionEnd{err: readErr, healthy: cs.healthy.Load(), progressed: cs.progressed.Load(), handlerErr: handlerErr, lasted: time.Since(connected)}
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
