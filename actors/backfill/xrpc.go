package backfill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/outbound"
	"github.com/cenkalti/backoff/v5"
)

// XRPC methods the backfill calls (AT Protocol lexicons).
const (
	methodListRepos    = "com.atproto.sync.listReposByCollection"
	methodListAllRepos = "com.atproto.sync.listRepos"
	methodDescribeRepo = "com.atproto.repo.describeRepo"
	methodListRecords  = "com.atproto.repo.listRecords"
)

// maxResponseBytes bounds one XRPC response body (a page of 100 records
// is far below it).
const maxResponseBytes = 16 << 20

// userAgent identifies the backfill to relays and PDSes.
const userAgent = "atcr-appview-backfill"

// Error classes, the `class` label of appview_backfill_errors_total.
const (
	classRateLimited = "rate_limited"   // HTTP 429
	classServer      = "server"         // HTTP 5xx
	classClient      = "client"         // other HTTP 4xx, e.g. RepoNotFound
	classNetwork     = "network"        // no HTTP answer: refused, reset, timeout
	classDecode      = "decode"         // a 2xx whose body is not the expected JSON
	classResolve     = "resolve"        // the DID did not resolve to a PDS
	classProtocol    = "protocol"       // a peer's pagination cursors cycle (a cursor of the listing came back)
	classInvalid     = "invalid_record" // a record whose uri or value is unusable
	classRelay       = "relay"          // a relay failed; the next one is tried
	classDatabase    = "db_error"       // a record whose own transaction could not commit; skipped
)

var errorClasses = []string{
	classRateLimited, classServer, classClient, classNetwork, classDecode,
	classResolve, classProtocol, classInvalid, classRelay, classDatabase,
}

// xrpcError is a failed XRPC call: the HTTP status (0 when there was no
// answer) and the XRPC error body {error, message} when there was one.
type xrpcError struct {
	method  string
	host    string
	status  int
	code    string
	message string
	class   string
}

func (e *xrpcError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s on %s", e.method, e.host)
	if e.status != 0 {
		fmt.Fprintf(&b, ": HTTP %d", e.status)
	}
	if e.code != "" {
		fmt.Fprintf(&b, " %s", e.code)
	}
	if e.message != "" {
		fmt.Fprintf(&b, ": %s", e.message)
	}
	return b.String()
}

// errorClass returns the metrics class of an XRPC failure.
func errorClass(err error) string {
	var xe *xrpcError
	if errors.As(err, &xe) {
		return xe.class
	}
	return classNetwork
}

// RetryPolicy bounds the retries of one XRPC request. Zero fields take the
// defaults noted.
type RetryPolicy struct {
	// Initial and Max bound the exponential backoff between attempts
	// (jittered ±50%); defaults 500 ms and 30 s.
	Initial, Max time.Duration
	// MaxTries counts every attempt, the first included; default 5.
	MaxTries uint
	// MaxRetryAfter is the longest single wait honoured, whether a
	// Retry-After or a 429's RateLimit-Reset asks for it; a peer asking for
	// longer is given up on for this request (default 10 min: the
	// reference PDS's widest per-IP window is 5 min).
	MaxRetryAfter time.Duration
	// MaxRateLimitWait bounds the total time one request is deferred by
	// 429s that state when to come back (default 30 min). Such deferrals
	// do not use up MaxTries: the peer is healthy, only busy.
	MaxRateLimitWait time.Duration
	// PerHostConcurrency bounds the requests in flight to one host
	// (default 2), whatever Options.Concurrency is.
	PerHostConcurrency int
	// RequestTimeout bounds one attempt; default 30 s.
	RequestTimeout time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.Initial <= 0 {
		p.Initial = 500 * time.Millisecond
	}
	if p.Max <= 0 {
		p.Max = 30 * time.Second
	}
	if p.MaxTries == 0 {
		p.MaxTries = 5
	}
	if p.MaxRetryAfter <= 0 {
		p.MaxRetryAfter = 10 * time.Minute
	}
	if p.MaxRateLimitWait <= 0 {
		p.MaxRateLimitWait = maxRateLimitWaitDefault
	}
	if p.PerHostConcurrency <= 0 {
		p.PerHostConcurrency = perHostConcurrencyDefault
	}
	if p.RequestTimeout <= 0 {
		p.RequestTimeout = 30 * time.Second
	}
	return p
}

// xrpcClient makes XRPC GET calls with retries: 429 and 5xx (and no
// answer at all) are retried with exponential backoff, waiting as long as
// a Retry-After header asks; other 4xx and undecodable answers are not.
// Every call goes through the host's rate limiter (ratelimit.go): a 429
// that says when the window resets defers the request until then without
// using up a try, and the RateLimit-* headers of every answer pace the
// following requests to that host.
type xrpcClient struct {
	http    *http.Client
	policy  RetryPolicy
	limits  *rateLimits
	onRetry func(err error, wait time.Duration)
	// onDefer is told of each deferral (a 429 with a reset) and onWait of
	// each time a request waited for a host's window.
	onDefer func(host string, wait time.Duration)
	onWait  func(host string, waited time.Duration)
	// onAnswer is told of every attempt's outcome: the status code, 0
	// when no answer came.
	onAnswer func(host string, status int)
}

// get calls base/xrpc/method?params and decodes the JSON answer into out.
// The request carries ctx: cancelling it aborts the call in flight. Errors
// are an *xrpcError (possibly joined with a *backoff.RetryAfterError) or
// ctx's error.
func (c *xrpcClient) get(ctx context.Context, base, method string, params url.Values, out any) error {
	target := strings.TrimRight(base, "/") + "/xrpc/" + method + "?" + params.Encode()
	var deferred time.Duration
	for {
		err := c.getWithRetries(ctx, target, method, out)
		d, ok := isDeferral(err)
		if !ok {
			return err
		}
		deferred += d.wait
		if deferred > c.policy.MaxRateLimitWait {
			d.xe.message = strings.TrimSpace(d.xe.message + fmt.Sprintf(" (deferred %s in all for the rate limit, more than the %s allowed)",
				deferred.Round(time.Second), c.policy.MaxRateLimitWait))
			return d.xe
		}
		if c.onDefer != nil {
			c.onDefer(d.xe.host, d.wait)
		}
		// The next attempt waits in the host's limiter until the reset.
	}
}

func (c *xrpcClient) getWithRetries(ctx context.Context, target, method string, out any) error {
	bo := &backoff.ExponentialBackOff{
		InitialInterval:     c.policy.Initial,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         c.policy.Max,
	}
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		return struct{}{}, c.once(ctx, target, method, out)
	},
		backoff.WithBackOff(bo),
		backoff.WithMaxTries(c.policy.MaxTries),
		backoff.WithMaxElapsedTime(0), // bounded by MaxTries and MaxRetryAfter instead
		backoff.WithNotify(func(err error, wait time.Duration) {
			if c.onRetry != nil {
				c.onRetry(err, wait)
			}
		}))
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (c *xrpcClient) once(ctx context.Context, target, method string, out any) error {
	reqCtx, cancel := context.WithTimeout(ctx, c.policy.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, target, nil)
	if err != nil {
		return backoff.Permanent(fmt.Errorf("%s: %w", method, err))
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", userAgent)
	host := req.URL.Host
	if c.limits != nil {
		waited, release, err := c.limits.acquire(ctx, host)
		if err != nil {
			return backoff.Permanent(err)
		}
		defer release()
		if waited > 0 && c.onWait != nil {
			c.onWait(host, waited)
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return backoff.Permanent(ctx.Err())
		}
		if c.onAnswer != nil {
			c.onAnswer(host, 0)
		}
		xe := &xrpcError{method: method, host: host, message: err.Error(), class: classNetwork}
		if errors.Is(err, outbound.ErrRefused) {
			// The outbound guard refused the address: asking again
			// cannot change that.
			return backoff.Permanent(xe)
		}
		return xe
	}
	defer resp.Body.Close()
	now := time.Now()
	if c.onAnswer != nil {
		c.onAnswer(host, resp.StatusCode)
	}
	rl := parseRateLimit(resp.Header, now)
	if c.limits != nil {
		c.limits.observe(host, resp.StatusCode, rl)
	}
	body := io.LimitReader(resp.Body, maxResponseBytes)
	if resp.StatusCode/100 == 2 {
		if err := atproto.UnmarshalRead(body, out); err != nil {
			return backoff.Permanent(&xrpcError{method: method, host: host, status: resp.StatusCode,
				message: "decode response: " + err.Error(), class: classDecode})
		}
		return nil
	}
	xe := &xrpcError{method: method, host: host, status: resp.StatusCode}
	var xb struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	if atproto.UnmarshalRead(io.LimitReader(body, 64<<10), &xb) == nil {
		xe.code, xe.message = xb.Error, xb.Message
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		xe.class = classRateLimited
	case resp.StatusCode >= 500:
		xe.class = classServer
	default:
		xe.class = classClient
		return backoff.Permanent(xe)
	}
	if xe.class == classRateLimited && !rl.reset.IsZero() {
		wait := max(rl.reset.Sub(now), minRateLimitHold)
		if wait > c.policy.MaxRetryAfter {
			xe.message = strings.TrimSpace(xe.message + fmt.Sprintf(" (asked to wait %s, more than the %s honoured)", wait.Round(time.Second), c.policy.MaxRetryAfter))
			return backoff.Permanent(xe)
		}
		return backoff.Permanent(&rateLimitDeferral{xe: xe, wait: wait})
	}
	wait, ok := outbound.ParseRetryAfter(resp.Header.Get("Retry-After"), now)
	switch {
	case !ok:
		return xe
	case wait > c.policy.MaxRetryAfter:
		xe.message = strings.TrimSpace(xe.message + fmt.Sprintf(" (asked to wait %s, more than the %s honoured)", wait, c.policy.MaxRetryAfter))
		return backoff.Permanent(xe)
	default:
		return errors.Join(xe, &backoff.RetryAfterError{Duration: wait})
	}
}

// repoRef is one entry of listReposByCollection.
type repoRef struct {
	DID string `json:"did"`
}

// reposPage is the output of com.atproto.sync.listReposByCollection.
type reposPage struct {
	Repos  []repoRef `json:"repos"`
	Cursor string    `json:"cursor"`
}

// listedRepo is one entry of com.atproto.sync.listRepos: every repository
// the relay follows, with its hosting status (active false and a status
// such as "deactivated" or "takendown" for one that is not served).
type listedRepo struct {
	DID    string  `json:"did"`
	Active *bool   `json:"active"`
	Status *string `json:"status"`
}

// allReposPage is the output of com.atproto.sync.listRepos.
type allReposPage struct {
	Repos  []listedRepo `json:"repos"`
	Cursor string       `json:"cursor"`
}

// describedRepo is the part of com.atproto.repo.describeRepo the fallback
// reads: the collections the repository has records in.
type describedRepo struct {
	Collections []string `json:"collections"`
}

// methodMissing reports whether err says the peer does not implement the
// method: HTTP 404 (Bluesky's relay answers so to listReposByCollection,
// which it serves from a separate service), 501, or an XRPC
// MethodNotImplemented.
func methodMissing(err error) bool {
	var xe *xrpcError
	if !errors.As(err, &xe) {
		return false
	}
	return xe.status == http.StatusNotFound || xe.status == http.StatusNotImplemented ||
		xe.code == "MethodNotImplemented" || xe.code == "XRPCNotSupported"
}

// recordRef is one entry of listRecords.
type recordRef struct {
	URI   string          `json:"uri"`
	CID   string          `json:"cid"`
	Value json.RawMessage `json:"value"`
}

// recordsPage is the output of com.atproto.repo.listRecords.
type recordsPage struct {
	Records []recordRef `json:"records"`
	Cursor  string      `json:"cursor"`
}
