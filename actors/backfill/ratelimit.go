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

// windowMargin is how long after a window's end, as worked out from the
// answer that opened it (hostLimiter.opened), the next request is sent.
// The reference PDS's in-memory limiter (rate-limiter-flexible) ends a
// window with a timer: a request that lands after the window's time but
// before the timer has fired still counts in the spent window, and is
// refused. Its event loop may run that timer late while it is busy.
const windowMargin = 50 * time.Millisecond

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
	// limit is RateLimit-Limit and window the window of RateLimit-Policy
	// ("3000;w=300"); 0 when not stated.
	limit  int
	window time.Duration
}

// parseRateLimit reads RateLimit-Remaining, RateLimit-Limit, the window
// of RateLimit-Policy, and the reset from Retry-After, else
// RateLimit-Reset (outbound.Reset).
func parseRateLimit(h http.Header, now time.Time) rateLimitHeaders {
	out := rateLimitHeaders{remaining: -1, window: policyWindow(h.Get("RateLimit-Policy"))}
	if v, err := strconv.Atoi(strings.TrimSpace(h.Get("RateLimit-Remaining"))); err == nil && v >= 0 {
		out.remaining = v
	}
	if v, err := strconv.Atoi(strings.TrimSpace(h.Get("RateLimit-Limit"))); err == nil && v > 0 {
		out.limit = v
	}
	if at, ok := outbound.RateLimitReset(h, now); ok {
		out.reset = at
	}
	return out
}

// policyWindow is the window of the first policy of a RateLimit-Policy
// value ("25;w=5": 5 s), 0 when it states none.
func policyWindow(v string) time.Duration {
	first, _, _ := strings.Cut(v, ",")
	_, params, _ := strings.Cut(first, ";")
	for _, p := range strings.Split(params, ";") {
		k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
		if k != "w" {
			continue
		}
		if secs, err := strconv.Atoi(strings.TrimSpace(val)); err == nil && secs > 0 && secs <= 86400 {
			return time.Duration(secs) * time.Second
		}
	}
	return 0
}

// hostLimiter paces the requests to one host: at most perHost in flight,
// none before notBefore (set when the host said its window is spent), and,
// while few requests remain in the window, one at a time, the rest spread
// over what is left of it.
type hostLimiter struct {
	slots chan struct{}
	// turn (capacity 1) is held by the one request in flight while the
	// host is paced, so that each sees the answer to the one before: two
	// requests released together by one notBefore took two of the last
	// point, and one was refused.
	turn chan struct{}

	mu        sync.Mutex
	notBefore time.Time
	// paced: the last answer left few requests in the window, or none.
	paced bool
	// inflight counts the requests sent and not yet released: an answer's
	// RateLimit-Remaining is shared with those still on their way.
	inflight int
	// opened is when the window open now ends at the latest: the answer
	// that opened it (RateLimit-Remaining one below RateLimit-Limit)
	// came back then less the policy's window, and the peer counted the
	// request before it answered. Zero until such an answer came.
	opened time.Time
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
		hl = &hostLimiter{slots: make(chan struct{}, l.perHost), turn: make(chan struct{}, 1)}
		l.hosts[h] = hl
	}
	return hl
}

// acquire takes one of the host's slots and waits until the host may be
// asked again (and, while it is paced, for its turn). It returns how long
// it waited for the rate limit (not for a slot) and a release function,
// to be called once the answer was observed, or ctx's error.
func (l *rateLimits) acquire(ctx context.Context, host string) (time.Duration, func(), error) {
	hl := l.host(host)
	select {
	case hl.slots <- struct{}{}:
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	}
	turn := false
	free := func() {
		if turn {
			<-hl.turn
		}
		<-hl.slots
	}
	var waited time.Duration
	for {
		hl.mu.Lock()
		d := hl.notBefore.Sub(l.now())
		if d <= 0 && (turn || !hl.paced) {
			hl.inflight++
			hl.mu.Unlock()
			return waited, func() {
				hl.mu.Lock()
				hl.inflight--
				hl.mu.Unlock()
				free()
			}, nil
		}
		hl.mu.Unlock()
		if d <= 0 { // paced: one request at a time; then look again
			began := time.Now()
			select {
			case hl.turn <- struct{}{}:
				turn = true
				waited += time.Since(began)
				continue
			case <-ctx.Done():
				free()
				return waited, nil, ctx.Err()
			}
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			free()
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
//
// The reset is the window's end as this host saw it open (windowEnd) when
// an answer said so: the reference floors RateLimit-Reset to the second
// (outbound.RateLimitReset adds one), which with a 5 s window left up to
// a fifth of the allowance unused, and a reset that fell just after the
// real end sent the next request into the spent window. A 429 keeps the
// peer's own word (Retry-After).
func (l *rateLimits) observe(host string, status int, rl rateLimitHeaders) {
	now := l.now()
	hl := l.host(host)
	if status == http.StatusTooManyRequests && !rl.reset.IsZero() {
		rl.reset = latest(rl.reset, now.Add(minRateLimitHold))
	} else if end, ok := hl.windowEnd(now, rl); ok && !rl.reset.IsZero() {
		rl.reset = end
	}
	if rl.reset.IsZero() || !rl.reset.After(now) {
		return
	}
	// What is left for the requests not yet sent: the others in flight
	// (this one is counted until it is released) take theirs first.
	hl.mu.Lock()
	left := rl.remaining - max(hl.inflight-1, 0)
	hl.mu.Unlock()
	var next time.Time
	switch {
	case status == http.StatusTooManyRequests || (rl.remaining >= 0 && left <= 0):
		next = rl.reset
	case rl.remaining > 0 && left <= 2*l.perHost:
		next = now.Add(rl.reset.Sub(now) / time.Duration(left+1))
	default:
		hl.mu.Lock()
		hl.paced = false
		hl.mu.Unlock()
		return
	}
	asked := next.Sub(now)
	if l.maxHold > 0 && asked > l.maxHold {
		next = now.Add(l.maxHold)
	}
	hl.mu.Lock()
	hl.paced = true
	wasHeld := hl.notBefore.After(now)
	if next.After(hl.notBefore) {
		hl.notBefore = next
	}
	hl.mu.Unlock()
	if !wasHeld && l.onHold != nil && (status == http.StatusTooManyRequests || left <= 0) {
		l.onHold(host, asked, next.Sub(now))
	}
}

// windowEnd notes a window opened by the answer rl (received at now) and
// returns when the window rl was counted in ends, plus windowMargin, when
// known: the window opened last, while its end is still ahead (a window
// cannot end before it; a later one opening shows as its own opening
// answer). ok is false when no opening answer was seen for it (another
// client of the same limit opened it, or the peer states no policy).
func (hl *hostLimiter) windowEnd(now time.Time, rl rateLimitHeaders) (time.Time, bool) {
	hl.mu.Lock()
	defer hl.mu.Unlock()
	if rl.limit > 0 && rl.window > 0 && rl.remaining == rl.limit-1 {
		hl.opened = now.Add(rl.window)
	}
	if !hl.opened.After(now) {
		return time.Time{}, false
	}
	return hl.opened.Add(windowMargin), true
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
