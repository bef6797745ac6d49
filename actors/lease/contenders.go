package lease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"
)

// NudgePath is the admin endpoint every instance serves for nudges: POST
// NudgePath?lease=NAME tells a contender that NAME was just released.
const NudgePath = "/lease/nudge"

// NudgeTimeout bounds one nudge request.
const NudgeTimeout = time.Second

// Contenders makes a graceful handover quick without LISTEN/NOTIFY, which
// libSQL lacks: a contender records its nudge URL and its worker's health
// in lease_contenders; a holder's release statement reads the recent
// contenders' URLs (Store.Released) and the holder POSTs to each, which
// tries to acquire at once. A lost nudge costs a
// retry interval; a nudge can only cause an attempt. The same records
// tell an unhealthy holder whether a healthy contender waits. A nil
// *Contenders does nothing.
type Contenders struct {
	DB *database.DB
	// Instance is this process's instance_id.
	Instance string
	// Nonce is this process start's (Store.Nonce): it tells this
	// process's records from another's under the same instance_id.
	Nonce string
	URL   string // this instance's nudge endpoint, e.g. http://127.0.0.1:5001/lease/nudge
	// TTL is leases.ttl: a record is written at most once per TTL/2 (a
	// contender not seen for 3×TTL is not nudged: Store.Release).
	TTL time.Duration
	// Header goes with every nudge (the admin token: admin.BearerHeader).
	Header http.Header
	Log    zerolog.Logger

	mu        sync.Mutex
	seen      map[string]registered // the last record written, by lease
	forgotten bool                  // Forget ran: Register writes nothing
	refused   map[string]time.Time  // when a refusal by each URL was last said at warn
	writes    sync.WaitGroup        // Register's writes in flight
	wg        sync.WaitGroup        // everything in flight
	client    *http.Client
	abandon   context.CancelFunc // ends the nudges still unanswered (Drain)
	base      context.Context
}

type registered struct {
	at      time.Time
	healthy bool
}

// refusalQuiet spaces the warnings about one contender refusing the
// admin token.
const refusalQuiet = time.Minute

// lockInit locks c, making its maps on first use.
func (c *Contenders) lockInit() {
	c.mu.Lock()
	if c.seen == nil {
		c.seen, c.refused = map[string]registered{}, map[string]time.Time{}
	}
}

// otherProcess matches a lease_contenders row another process wrote
// (parameters instance and nonce carry c.Instance and c.Nonce).
func otherProcess(instance, nonce int) string {
	return fmt.Sprintf("(instance <> ?%d OR nonce <> ?%d)", instance, nonce)
}

// Register records this instance as a contender for lease, with its
// worker's health, in the background: at most once per TTL/2 per lease,
// and at once when the health changed.
func (c *Contenders) Register(lease string, healthy bool) {
	if c == nil || c.URL == "" {
		return
	}
	c.lockInit()
	defer c.mu.Unlock()
	if c.forgotten {
		return
	}
	if last, ok := c.seen[lease]; ok && time.Since(last.at) < c.TTL/2 && last.healthy == healthy {
		return
	}
	c.seen[lease] = registered{at: time.Now(), healthy: healthy}
	c.wg.Add(1)
	c.writes.Add(1)
	go func() {
		defer c.wg.Done()
		defer c.writes.Done()
		_, err := c.DB.Exec(`INSERT INTO lease_contenders (name, instance, nudge_url, seen_at, nonce, healthy)
VALUES (?1, ?2, ?3, `+database.NowMS+`, ?4, ?5)
ON CONFLICT (name, instance) DO UPDATE SET nudge_url = excluded.nudge_url, seen_at = excluded.seen_at,
  nonce = excluded.nonce, healthy = excluded.healthy`,
			lease, c.Instance, c.URL, c.Nonce, boolInt(healthy))
		if err != nil {
			c.mu.Lock()
			delete(c.seen, lease) // try again next time
			c.mu.Unlock()
			c.Log.Debug().Err(err).Str("lease", lease).Msg("could not record this instance as a contender")
		}
	}()
}

// Nudge tells each of urls, without blocking, that lease has just been
// released (Store.Released: the release statement read them).
func (c *Contenders) Nudge(lease string, urls []string) {
	if c == nil {
		return
	}
	for _, u := range urls {
		c.nudge(lease, u)
	}
}

// nudge POSTs one nudge for lease to u, in the background. No redirect is
// followed: the bearer token never goes to a host the table does not
// name.
func (c *Contenders) nudge(lease, u string) {
	c.mu.Lock()
	if c.client == nil {
		c.client = &http.Client{Timeout: NudgeTimeout, CheckRedirect: outbound.NoRedirect}
		c.base, c.abandon = context.WithCancel(context.Background())
	}
	client, base := c.client, c.base
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		req, err := http.NewRequestWithContext(base, http.MethodPost, u+sep+"lease="+url.QueryEscape(lease), nil)
		if err != nil {
			c.Log.Debug().Err(err).Str("url", u).Msg("unusable nudge URL")
			return
		}
		for k, vs := range c.Header {
			req.Header[k] = vs
		}
		resp, err := client.Do(req)
		if err != nil {
			c.Log.Debug().Err(err).Str("lease", lease).Str("url", u).Msg("nudge failed")
			return
		}
		c.answered(lease, u, resp)
	}()
}

// answered reads and closes a nudge's answer. A refusal of the admin
// token is logged at warn, once per contender per refusalQuiet (the rest
// at debug): handovers to that contender wait for its poll.
func (c *Contenders) answered(lease, u string, resp *http.Response) {
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		level := zerolog.WarnLevel
		c.lockInit()
		if at, ok := c.refused[u]; ok && time.Since(at) < refusalQuiet {
			level = zerolog.DebugLevel
		} else {
			c.refused[u] = time.Now()
		}
		c.mu.Unlock()
		c.Log.WithLevel(level).Str("lease", lease).Str("url", u).Int("status", resp.StatusCode).
			Str("answer", logval.String(strings.TrimSpace(string(body)))).
			Msg("a contender refused the nudge: admin.token differs between instances, so handovers to it wait for its next poll")
	case resp.StatusCode >= 300:
		c.Log.Debug().Str("lease", lease).Str("url", u).Int("status", resp.StatusCode).Msg("nudge not taken")
	}
}

// Forget deletes this process's contender records, once those being
// written have landed; Register writes none after it. A stopping
// instance forgets as its workers drain, so the delete does not meet a
// successor's acquire right after the releases.
func (c *Contenders) Forget(ctx context.Context) error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	c.forgotten = true
	c.mu.Unlock()
	c.writes.Wait()
	_, err := c.DB.ExecContext(ctx, `DELETE FROM lease_contenders WHERE instance = ?1 AND nonce = ?2`, c.Instance, c.Nonce)
	if err != nil {
		return fmt.Errorf("forget this instance's contender records: %w", err)
	}
	return nil
}

// Drain waits for the writes and nudges in flight, at most grace
// (negative: for ever) before giving up the nudges still unanswered
// (their requests were written).
func (c *Contenders) Drain(grace time.Duration) {
	if c == nil {
		return
	}
	if grace >= 0 {
		done := make(chan struct{})
		go func() { c.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(grace):
			c.mu.Lock()
			if c.abandon != nil {
				c.abandon()
			}
			c.mu.Unlock()
		}
	}
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil {
		c.client.CloseIdleConnections()
	}
}

// HealthyContender reports whether another process contending for lease
// recorded itself healthy within two TTLs: an unhealthy holder yields
// only to such a contender.
func (c *Contenders) HealthyContender(ctx context.Context, lease string) (bool, error) {
	if c == nil {
		return false, nil
	}
	var one int
	err := c.DB.QueryRowContext(ctx, `SELECT 1 FROM lease_contenders
WHERE name = ?1 AND `+otherProcess(2, 4)+` AND healthy = 1 AND seen_at > `+database.NowMS+` - ?3 LIMIT 1`,
		lease, c.Instance, (2 * c.TTL).Milliseconds(), c.Nonce).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read healthy contenders of lease %q: %w", lease, err)
	}
	return true, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
