package backfill

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/atcr-io/appview/internal/testsupport"
)

// referenceLimiter answers like the reference PDS's XRPC rate limiter: a
// fixed window of `window` allowing `limit` requests; every answer carries
// RateLimit-Limit, -Remaining, -Reset (Unix seconds) and -Policy; a
// request over the limit gets 429 RateLimitExceeded and no Retry-After.
// It also records the most requests it saw in flight at once.
type referenceLimiter struct {
	limit  int
	window time.Duration

	mu          sync.Mutex
	windowStart time.Time
	used        int
	refused     int
	inflight    atomic.Int32
	maxInflight atomic.Int32
	// headersOnSuccess false sends the headers only with the 429s.
	headersOnSuccess bool
}

func (l *referenceLimiter) intercept(w http.ResponseWriter, _ *http.Request, _ testsupport.Request) bool {
	n := l.inflight.Add(1)
	defer l.inflight.Add(-1)
	for {
		m := l.maxInflight.Load()
		if n <= m || l.maxInflight.CompareAndSwap(m, n) {
			break
		}
	}
	// Hold the request a moment so concurrent ones overlap visibly.
	time.Sleep(5 * time.Millisecond)
	now := time.Now()
	l.mu.Lock()
	start := now.Truncate(l.window)
	if !start.Equal(l.windowStart) {
		l.windowStart, l.used = start, 0
	}
	l.used++
	over := l.used > l.limit
	if over {
		l.refused++
	}
	remaining := max(l.limit-l.used, 0)
	l.mu.Unlock()
	// The reference floors the reset to the whole second.
	resetUnix := start.Add(l.window).Unix()
	if over || l.headersOnSuccess {
		w.Header().Set("RateLimit-Limit", strconv.Itoa(l.limit))
		w.Header().Set("RateLimit-Remaining", strconv.Itoa(remaining))
		w.Header().Set("RateLimit-Reset", strconv.FormatInt(resetUnix, 10))
		w.Header().Set("RateLimit-Policy", fmt.Sprintf("%d;w=%d", l.limit, int(l.window.Seconds())))
	}
	if over {
		testsupport.XRPCError(w, http.StatusTooManyRequests, "RateLimitExceeded", "Rate Limit Exceeded")
		return true
	}
	return false
}

func (l *referenceLimiter) refusals() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refused
}

// A PDS whose 429s carry only the RateLimit-* headers: on the old code the
// backfill retried within its backoff (here 3 tries in a few ms), long
// before the window reset, and marked the repositories failed.
func TestA429WithRateLimitResetIsWaitedOutNotCountedAsAFailure(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	dids := []string{"did:plc:r1", "did:plc:r2", "did:plc:r3", "did:plc:r4", "did:plc:r5", "did:plc:r6"}
	pds := e.pds(1, dids...)
	relay.Add(colManifest, dids...)
	lim := &referenceLimiter{limit: 2, window: time.Second}
	pds.Intercept(lim.intercept)
	o := e.options(relay.URL())
	o.Collections = []string{colManifest}
	o.Concurrency = 4
	o.Retry = RetryPolicy{Initial: time.Millisecond, Max: 2 * time.Millisecond, MaxTries: 3, MaxRetryAfter: 5 * time.Second}
	if err := e.backfiller(o).Run(context.Background(), e.acquire("instance-a")); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_repos WHERE state = 'failed'`); n != 0 {
		t.Fatalf("%d repositories failed on a PDS that was only rate limiting", n)
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled`); got != len(dids) {
		t.Fatalf("%d records, want %d", got, len(dids))
	}
	if lim.refusals() == 0 {
		t.Fatal("the fake never refused a request: the test did not exercise a 429")
	}
	host := pds.URL()[len("http://"):]
	if got := testutil.ToFloat64(e.metrics.Deferred.WithLabelValues(host)); got != float64(lim.refusals()) {
		t.Errorf("deferrals = %v, want the %d refusals", got, lim.refusals())
	}
	if got := testutil.ToFloat64(e.metrics.RateLimitWait.WithLabelValues(host)); got <= 0 {
		t.Errorf("rate-limit wait = %v s, want > 0", got)
	}
	if got := testutil.ToFloat64(e.metrics.Requests.WithLabelValues(host, "429")); got != float64(lim.refusals()) {
		t.Errorf("requests answered 429 = %v, want the %d refusals", got, lim.refusals())
	}
	if got := testutil.ToFloat64(e.metrics.Requests.WithLabelValues(host, "200")); got < float64(len(dids)) {
		t.Errorf("requests answered 200 = %v, want at least one per repository (%d)", got, len(dids))
	}
}

// A PDS answering every request with its RateLimit-* headers, as the
// reference does: the backfill paces itself by RateLimit-Remaining and
// never runs into the limit by more than its requests already in flight,
// and never has more than PerHostConcurrency requests in flight to the
// host, however high Concurrency is.
func TestBackfillPacesByRemainingAndBoundsRequestsPerHost(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	var dids []string
	for i := range 8 {
		dids = append(dids, fmt.Sprintf("did:plc:p%d", i))
	}
	pds := e.pds(1, dids...)
	relay.Add(colManifest, dids...)
	lim := &referenceLimiter{limit: 3, window: time.Second, headersOnSuccess: true}
	pds.Intercept(lim.intercept)
	o := e.options(relay.URL())
	o.Collections = []string{colManifest}
	o.Concurrency = 8
	o.RelayPageSize = 100
	o.Retry = RetryPolicy{Initial: time.Millisecond, Max: 2 * time.Millisecond, MaxTries: 3, MaxRetryAfter: 5 * time.Second, PerHostConcurrency: 2}
	if err := e.backfiller(o).Run(context.Background(), e.acquire("instance-a")); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_repos WHERE state = 'failed'`); n != 0 {
		t.Fatalf("%d repositories failed", n)
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled`); got != len(dids) {
		t.Fatalf("%d records, want %d", got, len(dids))
	}
	if m := lim.maxInflight.Load(); m > 2 {
		t.Errorf("%d requests in flight to one host, want at most 2", m)
	}
	// Only requests already in flight when Remaining reached 0 can be
	// refused; pacing keeps that to at most one per slot per window.
	if r := lim.refusals(); r > 2*len(dids)/lim.limit {
		t.Errorf("%d requests refused: the backfill did not pace by RateLimit-Remaining", r)
	}
}

func TestRateLimitHeadersTakeUnixOrDeltaResets(t *testing.T) {
	now := time.Unix(1_767_000_000, 0)
	h := http.Header{}
	h.Set("RateLimit-Remaining", "0")
	h.Set("RateLimit-Reset", "1767000042")
	// Unix seconds are floored by the reference: one second is added.
	if rl := parseRateLimit(h, now); rl.remaining != 0 || !rl.reset.Equal(now.Add(43*time.Second)) {
		t.Errorf("unix reset: %+v", rl)
	}
	h.Set("RateLimit-Reset", "7")
	if rl := parseRateLimit(h, now); !rl.reset.Equal(now.Add(7 * time.Second)) {
		t.Errorf("delta reset: %+v", rl)
	}
	h = http.Header{}
	h.Set("Retry-After", "3")
	if rl := parseRateLimit(h, now); rl.remaining != -1 || !rl.reset.Equal(now.Add(3*time.Second)) {
		t.Errorf("retry-after only: %+v", rl)
	}
	if rl := parseRateLimit(http.Header{}, now); rl.remaining != -1 || !rl.reset.IsZero() {
		t.Errorf("no headers: %+v", rl)
	}
	// Both, as the reference sends them on a 429, from a peer whose clock
	// is 3 s behind: Retry-After, relative, is the one skew cannot move.
	h = http.Header{}
	h.Set("RateLimit-Reset", "1766999997")
	h.Set("Retry-After", "30")
	if rl := parseRateLimit(h, now); !rl.reset.Equal(now.Add(30 * time.Second)) {
		t.Errorf("retry-after and a skewed unix reset: %+v, want the reset 30 s from now", rl)
	}
}

// A 429 whose reset is already past here (a peer clock behind ours,
// Retry-After: 0, a delta of 0) was retried at once, and again: thousands
// of requests a second into a spent limit until the peer's window reset.
// Each such 429 now holds the host, and defers the request, at least
// minRateLimitHold, and the deferrals add up to MaxRateLimitWait.
func TestA429WithAResetAlreadyPastStillHoldsTheHost(t *testing.T) {
	for name, set := range map[string]func(h http.Header){
		"unix reset in the past": func(h http.Header) { h.Set("RateLimit-Reset", strconv.FormatInt(time.Now().Unix()-5, 10)) },
		"Retry-After 0":          func(h http.Header) { h.Set("Retry-After", "0") },
		"delta reset 0":          func(h http.Header) { h.Set("RateLimit-Reset", "0") },
	} {
		t.Run(name, func(t *testing.T) {
			var requests atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				set(w.Header())
				w.Header().Set("RateLimit-Remaining", "0")
				w.WriteHeader(http.StatusTooManyRequests)
				fmt.Fprint(w, `{"error":"RateLimitExceeded","message":"Rate Limit Exceeded"}`)
			}))
			defer srv.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var waits []time.Duration
			c := &xrpcClient{http: srv.Client(), policy: RetryPolicy{}.withDefaults(), limits: newRateLimits(2, time.Now),
				onDefer: func(_ string, wait time.Duration) { waits = append(waits, wait); cancel() }}
			var out reposPage
			if err := c.get(ctx, srv.URL, methodListRepos, url.Values{}, &out); err == nil {
				t.Fatal("a peer answering only 429 gave no error")
			}
			if len(waits) != 1 || waits[0] < minRateLimitHold || requests.Load() != 1 {
				t.Fatalf("deferrals %v after %d requests, want one of at least %v after one request", waits, requests.Load(), minRateLimitHold)
			}
			if held := c.limits.host(srv.Listener.Addr().String()); !held.notBefore.After(time.Now()) {
				t.Fatalf("host not held after the 429 (not before %v)", held.notBefore)
			}
		})
	}
}

// One RateLimit-Reset hours away (on a 200 with Remaining 0, or a 429) set
// the host's hold before any cap was applied: every later request to that
// host waited silently for hours. The hold is now bounded by the longest
// single wait honoured, and told once per hold.
func TestAFarRateLimitResetHoldsTheHostAtMostTheCapAndIsToldOnce(t *testing.T) {
	now := time.Unix(1_767_000_000, 0)
	l := newRateLimits(2, func() time.Time { return now })
	l.maxHold = 10 * time.Minute
	type hold struct{ asked, held time.Duration }
	var holds []hold
	l.onHold = func(_ string, asked, held time.Duration) { holds = append(holds, hold{asked, held}) }
	far := rateLimitHeaders{remaining: 0, reset: now.Add(2 * time.Hour)}
	l.observe("pds.example", http.StatusOK, far)
	l.observe("pds.example", http.StatusTooManyRequests, far)
	hl := l.host("pds.example")
	if got := hl.notBefore.Sub(now); got != 10*time.Minute {
		t.Errorf("host held for %s, want the 10m cap", got)
	}
	if len(holds) != 1 || holds[0] != (hold{2 * time.Hour, 10 * time.Minute}) {
		t.Errorf("holds told %+v, want one {2h 10m}", holds)
	}
	// Once the hold is over, the next spent window is a new hold.
	now = now.Add(11 * time.Minute)
	l.observe("pds.example", http.StatusTooManyRequests, rateLimitHeaders{remaining: 0, reset: now.Add(time.Minute)})
	if len(holds) != 2 || holds[1].held != time.Minute {
		t.Errorf("holds told %+v, want a second one of 1m", holds)
	}
}
