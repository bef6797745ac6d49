package backfill

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/testsupport"
)

// answer is a reference PDS's RateLimit-* headers: limit per window,
// remaining, the window's end floored to the second.
func answer(limit, remaining int, window time.Duration, end time.Time) http.Header {
	h := http.Header{}
	h.Set("RateLimit-Limit", strconv.Itoa(limit))
	h.Set("RateLimit-Remaining", strconv.Itoa(remaining))
	h.Set("RateLimit-Reset", strconv.FormatInt(end.Unix(), 10))
	h.Set("RateLimit-Policy", fmt.Sprintf("%d;w=%d", limit, int(window.Seconds())))
	return h
}

// The reference PDS opens a window with the first request after the last
// one ended and floors its RateLimit-Reset to the second. Holding the host
// until that second plus one left up to a second of every 5 s window
// unused (and a second that fell just after the real end sent the next
// request into the spent window); the window's end is now worked out
// from the answer that opened it.
func TestASpentWindowIsWaitedOutFromTheAnswerThatOpenedIt(t *testing.T) {
	t0 := time.Unix(1_767_000_000, 300_000_000) // .3 s past a second
	now := t0
	l := newRateLimits(2, func() time.Time { return now })
	const host = "pds.example"
	w := 5 * time.Second
	end := t0.Add(w) // the peer counted the opening request before t0

	l.observe(host, http.StatusOK, parseRateLimit(answer(25, 24, w, end), now))
	now = t0.Add(time.Second)
	l.observe(host, http.StatusOK, parseRateLimit(answer(25, 0, w, end), now))
	if got, want := l.host(host).notBefore, end.Add(windowMargin); !got.Equal(want) {
		t.Fatalf("held until %v after the window it opened was spent, want its end plus the margin, %v (the floored reset says %v)",
			got.Sub(t0), want.Sub(t0), time.Unix(end.Unix()+1, 0).Sub(t0))
	}

	// A window nobody here saw open (another client of the limit, or
	// answers before this run): the stated reset, as before.
	now = t0.Add(20 * time.Second)
	other := now.Add(3 * time.Second)
	l.observe(host, http.StatusOK, parseRateLimit(answer(25, 0, w, other), now))
	if got, want := l.host(host).notBefore, time.Unix(other.Unix()+1, 0); !got.Equal(want) {
		t.Fatalf("held until %v in a window not seen open, want the floored reset plus one second, %v", got.Sub(now), want.Sub(now))
	}

	// A peer without a policy: the stated reset too.
	now = t0.Add(40 * time.Second)
	h := answer(25, 24, w, now.Add(w))
	h.Del("RateLimit-Policy")
	l.observe(host, http.StatusOK, parseRateLimit(h, now))
	h = answer(25, 0, w, now.Add(w))
	h.Del("RateLimit-Policy")
	now = now.Add(time.Second)
	l.observe(host, http.StatusOK, parseRateLimit(h, now))
	if got, want := l.host(host).notBefore, time.Unix(t0.Add(45*time.Second).Unix()+1, 0); !got.Equal(want) {
		t.Fatalf("held until %v without a policy, want the floored reset plus one second", got.Sub(now))
	}
}

func TestRateLimitPolicyWindow(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"25;w=5":               5 * time.Second,
		"3000;w=300":           5 * time.Minute,
		"10;w=1, 1000;w=3600":  time.Second,
		"100;q=9;w=60":         time.Minute,
		"":                     0,
		"100":                  0,
		"100;w=soon":           0,
		"100;w=-5":             0,
		"100;w=99999999999999": 0,
	} {
		if got := policyWindow(v); got != want {
			t.Errorf("policyWindow(%q) = %v, want %v", v, got, want)
		}
	}
}

// windowLimiter answers like the reference PDS's in-memory limiter: a
// window opens with the first request after the last one ended and lasts
// `window`; the reset is floored to the second.
type windowLimiter struct {
	limit  int
	window time.Duration

	mu      sync.Mutex
	ends    time.Time
	used    int
	refused int
	windows int
}

func (l *windowLimiter) intercept(w http.ResponseWriter, _ *http.Request, _ testsupport.Request) bool {
	now := time.Now()
	l.mu.Lock()
	if !now.Before(l.ends) {
		l.ends, l.used = now.Add(l.window), 0
		l.windows++
	}
	l.used++
	over := l.used > l.limit
	if over {
		l.refused++
	}
	remaining, ends := max(l.limit-l.used, 0), l.ends
	l.mu.Unlock()
	for k, v := range answer(l.limit, remaining, l.window, ends) {
		w.Header()[k] = v
	}
	if over {
		testsupport.XRPCError(w, http.StatusTooManyRequests, "RateLimitExceeded", "Rate Limit Exceeded")
		return true
	}
	return false
}

// Against such a limiter the backfill spends every window and is never
// refused.
func TestBackfillSpendsEachWindowOfAPDSWithoutA429(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	var dids []string
	for i := range 6 {
		dids = append(dids, fmt.Sprintf("did:plc:w%d", i))
	}
	pds := e.pds(4, dids...) // 2 collections × (2 pages + an empty one) a repository: 36 requests
	relay.Add(colManifest, dids...)
	relay.Add(colTag, dids...)
	lim := &windowLimiter{limit: 10, window: time.Second}
	pds.Intercept(lim.intercept)
	o := e.options(relay.URL())
	o.Concurrency = 4
	o.Retry = RetryPolicy{Initial: time.Millisecond, Max: 2 * time.Millisecond, MaxTries: 3, MaxRetryAfter: 5 * time.Second}
	if err := e.backfiller(o).Run(context.Background(), e.acquire("instance-a")); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_repos WHERE state = 'failed'`); n != 0 {
		t.Fatalf("%d repositories failed", n)
	}
	if got, want := e.count(`SELECT COUNT(*) FROM backfilled`), 2*4*len(dids); got != want {
		t.Fatalf("%d records, want %d", got, want)
	}
	lim.mu.Lock()
	defer lim.mu.Unlock()
	if lim.refused != 0 {
		t.Errorf("%d requests refused with 429 in %d windows", lim.refused, lim.windows)
	}
	if lim.windows < 3 {
		t.Errorf("the limit bound in %d windows: the test did not exercise the pacing", lim.windows)
	}
}

// RateLimit-Remaining is shared with the requests still in flight: an
// answer that left one request while another was on its way left none
// for the next, which was sent (spaced) and refused. The host is now held
// until the reset.
func TestRequestsInFlightTakeTheirShareOfWhatRemains(t *testing.T) {
	t0 := time.Unix(1_767_000_000, 300_000_000)
	l := newRateLimits(2, func() time.Time { return t0 })
	const host = "pds.example"
	ctx := context.Background()
	_, release1, err := l.acquire(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	_, release2, err := l.acquire(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	end := t0.Add(3 * time.Second)
	l.observe(host, http.StatusOK, parseRateLimit(answer(25, 1, 5*time.Second, end), t0))
	release1()
	defer release2()
	if got, want := l.host(host).notBefore, time.Unix(end.Unix()+1, 0); !got.Equal(want) {
		t.Fatalf("held until %v with one request left and another in flight, want the reset %v", got.Sub(t0), want.Sub(t0))
	}
}

// While few requests remain, they go one at a time: two requests waiting
// for the same spaced time went together, for the same last points.
func TestAPacedHostTakesOneRequestAtATime(t *testing.T) {
	l := newRateLimits(2, time.Now)
	const host = "pds.example"
	ctx := context.Background()
	now := time.Now()
	l.observe(host, http.StatusOK, rateLimitHeaders{remaining: 3, reset: now.Add(200 * time.Millisecond)})
	type acquired struct{ release func() }
	got := make(chan acquired, 2)
	for range 2 {
		go func() {
			_, release, err := l.acquire(ctx, host)
			if err != nil {
				t.Error(err)
				release = func() {}
			}
			got <- acquired{release}
		}()
	}
	first := <-got
	select {
	case <-got:
		t.Fatal("a second request went while the first was in flight on a paced host")
	case <-time.After(150 * time.Millisecond): // past the spaced time: it must still be waiting
	}
	l.observe(host, http.StatusOK, rateLimitHeaders{remaining: 2, reset: time.Now().Add(100 * time.Millisecond)})
	first.release()
	select {
	case second := <-got:
		second.release()
	case <-time.After(5 * time.Second):
		t.Fatal("the second request did not go once the first was answered")
	}
}
