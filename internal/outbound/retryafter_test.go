package outbound_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/outbound"
)

func TestParseTakesSecondsOrAnHTTPDate(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"0":                             0,
		"7":                             7 * time.Second,
		" 120 ":                         2 * time.Minute,
		"Thu, 02 Jan 2025 03:04:35 GMT": 30 * time.Second,
		"Thu, 02 Jan 2025 03:00:00 GMT": 0, // in the past: retry now
		"99999999999999":                100 * 365 * 24 * time.Hour,
		"99999999999999999999999":       100 * 365 * 24 * time.Hour, // past int64: as long as can be

	} {
		got, ok := outbound.ParseRetryAfter(v, now)
		if !ok || got != want {
			t.Errorf("Parse(%q) = %s, %v; want %s", v, got, ok, want)
		}
	}
	for _, v := range []string{"", "-1", "soon", "1.5", "-99999999999999999999999"} {
		if _, ok := outbound.ParseRetryAfter(v, now); ok {
			t.Errorf("Parse(%q) accepted", v)
		}
	}
}

func TestResetTakesRetryAfterFirstThenAUnixOrDeltaRateLimitReset(t *testing.T) {
	now := time.Unix(1_767_000_000, 0)
	for _, tc := range []struct {
		name       string
		retryAfter string
		reset      string
		want       time.Duration
		ok         bool
	}{
		// Unix seconds are floored by the reference: one second is added.
		{"unix reset", "", "1767000042", 43 * time.Second, true},
		{"delta reset", "", "7", 7 * time.Second, true},
		{"retry-after only", "3", "", 3 * time.Second, true},
		// Both, as the reference sends them on a 429, from a peer whose
		// clock is 3 s behind: Retry-After is the one skew cannot move.
		{"both, skewed unix reset", "30", "1766999997", 30 * time.Second, true},
		{"unparsable retry-after, reset", "soon", "5", 5 * time.Second, true},
		{"unix reset already past", "", "1766999990", -9 * time.Second, true},
		{"neither", "", "", 0, false},
		{"negative reset", "", "-4", 0, false},
	} {
		h := http.Header{}
		if tc.retryAfter != "" {
			h.Set("Retry-After", tc.retryAfter)
		}
		if tc.reset != "" {
			h.Set("RateLimit-Reset", tc.reset)
		}
		at, ok := outbound.RateLimitReset(h, now)
		if ok != tc.ok || (ok && !at.Equal(now.Add(tc.want))) {
			t.Errorf("%s: Reset = %v, %v; want now%+v, %v", tc.name, at, ok, tc.want, tc.ok)
		}
		d, ok := outbound.RetryDelay(h, now)
		if ok != tc.ok || (ok && d != max(tc.want, 0)) {
			t.Errorf("%s: Delay = %s, %v; want %s, %v", tc.name, d, ok, max(tc.want, 0), tc.ok)
		}
	}
}

func TestRefusalReadsTheHeadersOfA429OrA503Only(t *testing.T) {
	now := time.Unix(1_767_000_000, 0)
	h := http.Header{"Retry-After": {"7"}}
	for status, want := range map[int]bool{http.StatusTooManyRequests: true, http.StatusServiceUnavailable: true,
		http.StatusInternalServerError: false, http.StatusOK: false} {
		d, ok := outbound.RetryRefusal(&http.Response{StatusCode: status, Header: h}, now)
		if ok != want || (ok && d != 7*time.Second) {
			t.Errorf("HTTP %d: Refusal = %v, %v; want ok %v (7s)", status, d, ok, want)
		}
	}
}
