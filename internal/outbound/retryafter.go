// This file reads how long an HTTP peer asks to be left alone
// after refusing a request: Retry-After (RFC 9110 §10.2.3) and
// RateLimit-Reset (the IETF draft "RateLimit header fields for HTTP",
// draft-ietf-httpapi-ratelimit-headers, as the reference AT Protocol PDS
// sends it). The backfill's XRPC client, the Jetstream consumer's
// handshake and the webhook deliveries all read them here, so a peer is
// understood the same way whichever worker it refuses.

package outbound

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// EpochFloor separates the two forms of RateLimit-Reset: the draft's is
// delta-seconds, the reference PDS sends an absolute Unix time (seconds).
// A value above EpochFloor (2001-09-09) is a Unix time, anything smaller
// a delay.
const EpochFloor = 1_000_000_000

// maxSeconds clamps a delay in seconds: a century.
const maxSeconds = 100 * 365 * 24 * 3600

// ParseRetryAfter reads a Retry-After value: delay-seconds (a non-negative integer)
// or an HTTP-date, as a delay from now (0 for a date already past). ok is
// false when v is empty or neither form.
func ParseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		if secs < 0 {
			return 0, false
		}
		// Clamped well below time.Duration's range (292 years); more
		// digits than an int64 holds is as long a wait as can be.
		return time.Duration(min(secs, maxSeconds)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// RateLimitReset returns when the peer's window resets according to h: Retry-After
// when it parses, else RateLimit-RateLimitReset (Unix seconds above EpochFloor, else
// delta-seconds). The reference PDS (atproto xrpc-server,
// rate-limiter-http.ts) sends both on a 429: Retry-After relative to now
// and RateLimit-RateLimitReset as an instant on its own clock, so Retry-After is
// the one a clock skew between the hosts cannot move. The reference
// floors its Unix reset to the second, so one second is added to it: a
// retry at the floored second would only be refused again. ok is false
// when neither header parses.
func RateLimitReset(h http.Header, now time.Time) (at time.Time, ok bool) {
	if d, ok := ParseRetryAfter(h.Get("Retry-After"), now); ok {
		return now.Add(d), true
	}
	v, err := strconv.ParseInt(strings.TrimSpace(h.Get("RateLimit-Reset")), 10, 64)
	switch {
	case err != nil || v < 0:
		return time.Time{}, false
	case v > EpochFloor:
		return time.Unix(v+1, 0), true
	default:
		return now.Add(time.Duration(min(v, maxSeconds)) * time.Second), true
	}
}

// RetryRefusal is the wait a refused response asked for: for a 429 (Too Many
// Requests) or a 503 (Service Unavailable), Delay of its headers. ok is
// false for any other status, and when neither header parses.
func RetryRefusal(resp *http.Response, now time.Time) (time.Duration, bool) {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		return 0, false
	}
	return RetryDelay(resp.Header, now)
}

// RetryDelay is Reset as a wait from now, at least 0. ok is false when neither
// header parses.
func RetryDelay(h http.Header, now time.Time) (time.Duration, bool) {
	at, ok := RateLimitReset(h, now)
	if !ok {
		return 0, false
	}
	return max(at.Sub(now), 0), true
}
