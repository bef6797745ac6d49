package jetstream

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"
	"github.com/gorilla/websocket"
)

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
