package jetstream

import (
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/logval"
)

// Upstream is where a Client stands, for a status report (the consumer's
// health, the status page): the endpoint it is on, dialling or waiting
// to dial, that endpoint's wire, the connection's state, why the last
// connection ended, and when an event last arrived.
type Upstream struct {
	// URL is the endpoint, redacted (logval.RedactURL); "" before Run.
	URL  string `json:"url,omitempty"`
	Wire Wire   `json:"wire,omitempty"`
	// State is StateConnecting, StateConnected or StateBackoff.
	State string `json:"state,omitempty"`
	// LastError is why the last connection ended (or its dial failed),
	// bounded; it stays after a later connection succeeds.
	LastError string `json:"last_error,omitempty"`
	// LastEvent is when any connection last delivered an event (zero:
	// none yet).
	LastEvent time.Time `json:"last_event,omitzero"`
}

// where is the Client's Upstream less LastEvent (kept apart, atomically,
// for the reader's sake).
type where struct {
	mu      sync.Mutex
	url     string
	state   string
	lastErr string
}

// Upstream reports where the client stands; safe from any goroutine.
func (c *Client) Upstream() Upstream {
	c.where.mu.Lock()
	raw := c.where.url
	u := Upstream{State: c.where.state, LastError: c.where.lastErr}
	c.where.mu.Unlock()
	if raw != "" {
		u.URL, u.Wire = logval.RedactURL(raw), WireOf(raw)
	}
	u.LastEvent = c.LastEvent()
	return u
}

// setState records that the client is at url in state st ("" : between
// two states, which keeps the last one) and sets the connection-state
// metrics (at "" : none).
func (c *Client) setState(url, st string) {
	c.opts.Metrics.state(c.opts.URLs, url, st)
	if url == "" || st == "" {
		return
	}
	c.where.mu.Lock()
	c.where.url, c.where.state = url, st
	c.where.mu.Unlock()
}

// setLastError records why the last connection ended.
func (c *Client) setLastError(err error) {
	if err == nil {
		return
	}
	c.where.mu.Lock()
	c.where.lastErr = logval.Err(err)
	c.where.mu.Unlock()
}
