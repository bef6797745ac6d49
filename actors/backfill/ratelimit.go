package backfill

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/outbound"
)

// Rate limits as the reference PDS states them. Its XRPC server answers
// every rate-limited route with the headers of the IETF draft
// "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers):
//
//	RateLimit-Limit: 3000
//	RateLimit-Remaining: 0
//	RateLimit-Reset: 1767269105      (Unix seconds when the window resets)
//	RateLimit-Policy: 3000;w=300
//
// and, once the limit is spent, HTTP 429 RateLimitExceeded (0.5.x also
// sends Retry-After; earlier releases did not, so it is not relied on).
// Both forms of the reset are read by package outbound (RateLimitReset).

// Defaults of the rate-limit options.
const (
	perHostConcurrencyDefault = 2
	maxRateLimitWaitDefault   = 15 * time.Minute
)

// minRateLimitHold is the least a 429 holds its host, whatever reset it
// named: a reset already past on this host's clock (the peer's clock is
// behind ours, or Retry-After: 0) would otherwise send the request again
// at once, and again, until the peer's window really resets: thousands of
// requests a second into a spent limit.
const minRateLimitHold = time.Second

// rateLimitDeferral is a request the peer refused for its rate limit: it is
// not a failure of the peer and does not use up a retry; the request is
// made again once the host's window resets (hostLimiter.wait).
type rateLimitDeferral struct {
	xe   *xrpcError
	wait time.Duration
}

func (d *rateLimitDeferral) Error() string {
	return fmt.Sprintf("%v (deferred %s for the peer's rate limit)", d.xe, d.wait.Round(time.Millisecond))
}

func (d *rateLimitDeferral) Unwrap() error { return d.xe }

// rateLimitHeaders is what one response said about the peer's limit.
type rateLimitHeaders struct {
	// remaining is RateLimit-Remaining; -1 when absent.
	remaining int
	// reset is when the window resets (Retry-After, else RateLimit-Reset);
	// zero when neither was sent.
	reset time.Time
}

// parseRateLimit reads RateLimit-Remaining, and the reset from
// Retry-After, else RateLimit-Reset (outbound.Reset).
func parseRateLimit(h http.Header, now time.Time) rateLimitHeaders {
	out := rateLimitHeaders{remaining: -1}
	if v, err := strconv.Atoi(strings.TrimSpace(h.Get("RateLimit-Remaining"))); err == nil && v >= 0 {
		out.remaining = v
	}
	if at, ok := outbound.RateLimitReset(h, now); ok {
		out.reset = at
	}
	return out
}

// hostLimiter paces the requests to one host: at most perHost in flight,
// none before notBefore (set when the host said its window is spent), and,
// while few requests remain in the window, the rest spread over what is
// left of it.
type hostLimiter struct {
	slots chan struct{}

	mu        sync.Mutex
	notBefore time.Time
}

// rateLimits holds the hostLimiter of every host contacted.
type rateLimits struct {
	perHost int
	now     func() time.Time
	// maxHold bounds how long one response can hold a host (0: no
	// bound): the same cap as one request's wait (RetryPolicy.
	// MaxRetryAfter), so a RateLimit-Reset hours away cannot stall
	// every request to the host silently for hours.
	maxHold time.Duration
	// onHold, when set, is told when a host goes from free to held:
	// once per hold, with the wait the peer asked for and the wait
	// applied (at most maxHold).
	onHold func(host string, asked, held time.Duration)

	mu    sync.Mutex
	hosts map[string]*hostLimiter
}

func newRateLimits(perHost int, now func() time.Time) *rateLimits {
	return &rateLimits{perHost: perHost, now: now, hosts: map[string]*hostLimiter{}}
}

func (l *rateLimits) host(h string) *hostLimiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	hl, ok := l.hosts[h]
	if !ok {
		hl = &hostLimiter{slots: make(chan struct{}, l.perHost)}
		l.hosts[h] = hl
	}
	return hl
}

// acquire takes one of the host's slots and waits until the host may be
// asked again. It returns how long it waited for the rate limit (not for a
// slot) and a release function, or ctx's error.
func (l *rateLimits) acquire(ctx context.Context, host string) (time.Duration, func(), error) {
	hl := l.host(host)
	select {
	case hl.slots <- struct{}{}:
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	}
	release := func() { <-hl.slots }
	var waited time.Duration
	for {
		hl.mu.Lock()
		d := hl.notBefore.Sub(l.now())
		hl.mu.Unlock()
		if d <= 0 {
			return waited, release, nil
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			release()
			return waited, nil, ctx.Err()
		case <-t.C:
			waited += d
		}
	}
}

// observe applies what a response said: a spent window (a 429, or
// Remaining 0) holds the host until its reset; a nearly spent one spaces
// the next requests evenly over what is left of the window, so a backfill
// runs at the peer's pace instead of into its limit.
func (l *rateLimits) observe(host string, status int, rl rateLimitHeaders) {
	now := l.now()
	if status == http.StatusTooManyRequests && !rl.reset.IsZero() {
		rl.reset = latest(rl.reset, now.Add(minRateLimitHold))
	}
	if rl.reset.IsZero() || !rl.reset.After(now) {
		return
	}
	var next time.Time
	switch {
	case status == http.StatusTooManyRequests || rl.remaining == 0:
		next = rl.reset
	case rl.remaining > 0 && rl.remaining <= 2*l.perHost:
		next = now.Add(rl.reset.Sub(now) / time.Duration(rl.remaining+1))
	default:
		return
	}
	asked := next.Sub(now)
	if l.maxHold > 0 && asked > l.maxHold {
		next = now.Add(l.maxHold)
	}
	hl := l.host(host)
	hl.mu.Lock()
	wasHeld := hl.notBefore.After(now)
	if next.After(hl.notBefore) {
		hl.notBefore = next
	}
	hl.mu.Unlock()
	if !wasHeld && l.onHold != nil && (status == http.StatusTooManyRequests || rl.remaining == 0) {
		l.onHold(host, asked, next.Sub(now))
	}
}

// latest is the later of a and b.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// isDeferral reports whether err is a rate-limit deferral.
func isDeferral(err error) (*rateLimitDeferral, bool) {
	var d *rateLimitDeferral
	ok := errors.As(err, &d)
	return d, ok
}
