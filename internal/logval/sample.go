package logval

import (
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Sampled returns l limited to burst lines per period (the first burst
// lines of each period pass, the rest are dropped), as zerolog's
// BurstSampler limits it, except that it says what it dropped: the first
// line it lets through after a period in which it dropped some is
// preceded by one warning on l saying how many lines of what were held
// back and since when (field held_back, a count; since, the start of that
// period; lines, the what given here). zerolog's samplers drop silently,
// so an operator reading a sampled log could not tell ten bad events from
// ten thousand. A count is reported only when a later line comes; the
// metrics that count the events themselves (e.g.
// appview_processor_skipped_total) are never sampled. burst 0 or a
// period <= 0 returns l unlimited.
func Sampled(l zerolog.Logger, burst uint32, period time.Duration, what string) zerolog.Logger {
	if burst == 0 || period <= 0 {
		return l
	}
	return l.Sample(&countingSampler{burst: burst, period: period, what: what, report: l, now: time.Now})
}

// countingSampler is Sampled's zerolog.Sampler.
type countingSampler struct {
	burst  uint32
	period time.Duration
	what   string
	report zerolog.Logger
	now    func() time.Time

	mu      sync.Mutex
	start   time.Time // of the current period
	passed  uint32    // lines let through in it
	dropped uint64    // lines dropped in it
}

// Sample implements zerolog.Sampler.
func (s *countingSampler) Sample(zerolog.Level) bool {
	s.mu.Lock()
	now := s.now()
	var held uint64
	var since time.Time
	if now.Sub(s.start) >= s.period {
		held, since = s.dropped, s.start
		s.start, s.passed, s.dropped = now, 0, 0
	}
	pass := s.passed < s.burst
	if pass {
		s.passed++
	} else {
		s.dropped++
	}
	s.mu.Unlock()
	if held > 0 {
		// Written outside the lock: the report logger is unsampled.
		s.report.Warn().Str("lines", s.what).Uint64("held_back", held).Time("since", since).
			Msg("log lines held back by the rate limit (the metrics count every event)")
	}
	return pass
}
