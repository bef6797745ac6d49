package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
)

// HealthPath is the hold XRPC health endpoint (docs/lexicons.md): any 2xx is healthy.
const HealthPath = "/xrpc/_health"

// maxBodyBytes is how much of a health response is read (and discarded)
// so the connection can be reused.
const maxBodyBytes = 64 << 10

// knownHoldsSQL lists every hold this AppView knows of: those that
// published a captain record and those that manifests point at.
var knownHoldsSQL = `SELECT ` + database.Text("hold_did") + ` FROM hold_captains WHERE hold_did <> ''
UNION SELECT ` + database.Text("hold_did") + ` FROM manifests WHERE hold_did <> ''
ORDER BY 1`

// Endpoints resolves a hold DID to the hold's base URL (no trailing
// slash). *identity.Resolver implements it.
type Endpoints interface {
	HoldEndpoint(ctx context.Context, did string) (string, error)
}

// Options configures a Checker.
type Options struct {
	// DB is read for the known holds (never written).
	DB *database.DB
	// Endpoints resolves hold DIDs.
	Endpoints Endpoints
	// HTTP sends the checks; nil means a client with no timeout of its own
	// (each check is bounded by Timeout) that refuses non-public addresses
	// (netguard): hold endpoints come from records anyone can publish.
	HTTP *http.Client
	// Timeout bounds one check: DID resolution plus GET /xrpc/_health.
	Timeout time.Duration
	// Concurrency bounds how many holds are checked at once (at least 1).
	Concurrency int
	// Cache receives each round's results.
	Cache *Cache
	// Log receives health transitions and round failures.
	Log zerolog.Logger
	// Checks counts checks by outcome; nil counts nothing (see NewChecksCounter).
	Checks *prometheus.CounterVec
}

// Checker runs health rounds into a Cache.
type Checker struct {
	o Options

	mu sync.Mutex
	// limitedUntil holds back, by hold DID, the holds that answered 429:
	// none is asked again before the time its Retry-After (else
	// RateLimit-Reset) named, and until then it keeps its last status.
	limitedUntil map[string]time.Time
}

// errRateLimited is a hold refusing its health check for its rate limit:
// the hold answered, so it is no sign of trouble, and no verdict either.
type errRateLimited struct{ retryAfter time.Duration }

func (e *errRateLimited) Error() string {
	return fmt.Sprintf("GET %s: HTTP 429 (rate limited; asked to wait %s)", HealthPath, e.retryAfter)
}

// maxHealthRetryAfter bounds how long one 429 holds a hold's checks back.
const maxHealthRetryAfter = time.Hour

// NewChecker validates the options. It returns an error for a missing DB,
// Endpoints or Cache, a non-positive Timeout or a Concurrency below 1.
func NewChecker(o Options) (*Checker, error) {
	switch {
	case o.DB == nil:
		return nil, errors.New("health: nil database")
	case o.Endpoints == nil:
		return nil, errors.New("health: nil endpoint resolver")
	case o.Cache == nil:
		return nil, errors.New("health: nil cache")
	case o.Timeout <= 0:
		return nil, fmt.Errorf("health: timeout must be positive, got %s", o.Timeout)
	case o.Concurrency < 1:
		return nil, fmt.Errorf("health: concurrency must be at least 1, got %d", o.Concurrency)
	}
	if o.HTTP == nil {
		o.HTTP = outbound.Guard{Purpose: "hold health check"}.Client(0)
	}
	return &Checker{o: o, limitedUntil: map[string]time.Time{}}, nil
}

// Run is the job function (workers.Spec.Job): one round. The custody is
// ignored: the checker is unleased and writes nothing. It returns an error
// when the known holds cannot be read (the cache is then left as it was)
// or ctx ended during the round (checks cut short are not recorded).
func (c *Checker) Run(ctx context.Context, _ fence.Custody) error {
	return c.Round(ctx)
}

// Round reads the known holds, checks them all and replaces the cache.
func (c *Checker) Round(ctx context.Context) error {
	started := time.Now()
	dids, err := c.knownHolds(ctx)
	if err != nil {
		return err
	}
	results := c.checkAll(ctx, dids)
	prev := c.o.Cache.previous(dids)
	next := make(map[string]Status, len(dids))
	for i, did := range dids {
		old, had := prev[did]
		r := results[i]
		if r == nil { // cut short by ctx: keep what we knew
			if had {
				next[did] = old
			}
			continue
		}
		s := *r
		if s.Healthy {
			s.LastHealthyMS = s.LastCheckedMS
		} else {
			s.ConsecutiveFailures = old.ConsecutiveFailures + 1
			s.LastHealthyMS = old.LastHealthyMS
		}
		next[did] = s
		c.logTransition(old, had, s)
	}
	c.o.Cache.replace(next, started.UnixMilli())
	return ctx.Err()
}

func (c *Checker) knownHolds(ctx context.Context) ([]string, error) {
	var dids []string
	err := database.Bounded(ctx, func() error {
		rows, err := c.o.DB.Query(knownHoldsSQL)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var d string
			if err := rows.Scan(&d); err != nil {
				return err
			}
			dids = append(dids, d)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("health: read known holds: %w", err)
	}
	return dids, nil
}

// checkAll checks every hold with at most Concurrency in flight and
// returns once every check has finished. results[i] is nil when the check
// of dids[i] was cut short by ctx or gave no verdict (a 429: the hold
// answered but asked not to be checked now; or one such answer's wait has
// not passed yet).
func (c *Checker) checkAll(ctx context.Context, dids []string) []*Status {
	results := make([]*Status, len(dids))
	next := make(chan int)
	var wg sync.WaitGroup
	workers := min(c.o.Concurrency, len(dids))
	for range workers {
		wg.Go(func() {
			for i := range next {
				if c.limited(dids[i]) {
					continue // no verdict: the hold keeps its last status
				}
				s, verdict := c.check(ctx, dids[i])
				if ctx.Err() == nil && verdict {
					results[i] = &s
				}
			}
		})
	}
feed:
	for i := range dids {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return results
}

// limited reports whether did's last 429 asked to be left alone until a
// time not come yet.
func (c *Checker) limited(did string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	until, ok := c.limitedUntil[did]
	if ok && !time.Now().Before(until) {
		delete(c.limitedUntil, did)
		return false
	}
	return ok
}

// check resolves and checks one hold, bounded by Timeout. verdict is
// false for a 429: the hold answered but gave no health, and is left alone
// for what it asked (limitedUntil).
func (c *Checker) check(ctx context.Context, did string) (s Status, verdict bool) {
	s = Status{HoldDID: did, LastCheckedMS: time.Now().UnixMilli()}
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	endpoint, err := c.o.Endpoints.HoldEndpoint(ctx, did)
	if err != nil {
		s.LastError = "resolve endpoint: " + err.Error()
		c.count("unhealthy")
		return s, true
	}
	s.Endpoint = endpoint
	start := time.Now()
	err = c.get(ctx, strings.TrimRight(endpoint, "/")+HealthPath)
	s.LatencyMS = float64(time.Since(start).Microseconds()) / 1000
	var rl *errRateLimited
	if errors.As(err, &rl) {
		c.mu.Lock()
		c.limitedUntil[did] = time.Now().Add(rl.retryAfter)
		c.mu.Unlock()
		c.count("rate_limited")
		return s, false
	}
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s: %w", c.o.Timeout, err)
		}
		s.LastError = err.Error()
		c.count("unhealthy")
		return s, true
	}
	s.Healthy = true
	c.count("healthy")
	return s, true
}

func (c *Checker) get(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.o.HTTP.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBodyBytes))
	resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests {
		d, _ := outbound.RetryDelay(resp.Header, time.Now())
		return &errRateLimited{retryAfter: min(d, maxHealthRetryAfter)}
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("GET %s: HTTP %d", HealthPath, resp.StatusCode)
	}
	return nil
}

func (c *Checker) count(outcome string) {
	if c.o.Checks != nil {
		c.o.Checks.WithLabelValues(outcome).Inc()
	}
}

// logTransition logs a hold becoming unhealthy (warn) or healthy again
// (info) once, not on every round.
func (c *Checker) logTransition(old Status, had bool, s Status) {
	switch {
	case !s.Healthy && (!had || old.Healthy):
		c.o.Log.Warn().Str("event", "hold.unhealthy").Str("hold", s.HoldDID).
			Str("endpoint", logval.String(s.Endpoint)).Str("error", logval.String(s.LastError)).Msg("hold failed its health check")
	case s.Healthy && had && !old.Healthy:
		c.o.Log.Info().Str("event", "hold.healthy").Str("hold", s.HoldDID).
			Int("after_failures", old.ConsecutiveFailures).Msg("hold healthy again")
	}
}

// NewChecksCounter builds and registers appview_hold_checks_total{outcome}
// (healthy, unhealthy, rate_limited: a 429, no verdict). It returns the
// registerer's error.
func NewChecksCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	cv := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "appview_hold_checks_total",
		Help: "Hold health checks run by this instance, by outcome (healthy, unhealthy, rate_limited: a 429, no verdict).",
	}, []string{"outcome"})
	if err := reg.Register(cv); err != nil {
		return nil, fmt.Errorf("register health metrics: %w", err)
	}
	return cv, nil
}
