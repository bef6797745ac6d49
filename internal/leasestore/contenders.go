package leasestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
)

// Contenders gives graceful handover its speed without LISTEN/NOTIFY,
// which libSQL lacks. A contender records the URL of its nudge endpoint in
// lease_contenders; a holder that has just released POSTs to every recent
// contender of that lease, and each one makes an acquire attempt at once
// instead of at its next poll. Correctness never depends on it: a lost
// nudge costs at most one retry interval, and a nudge can only cause an
// acquire attempt (rate-limited by the machine).
type Contenders struct {
	DB *sql.DB
	// Instance is this process's instance_id.
	Instance string
	// Nonce is this process's start nonce (Store.Nonce), recorded so a
	// process can tell that its instance_id is live elsewhere.
	Nonce string
	// URL is this instance's nudge endpoint, e.g. http://127.0.0.1:5001/lease/nudge.
	URL string
	// TTL is the lease TTL; a contender not seen for 3×TTL is not nudged.
	TTL time.Duration
	// HTTP is the client for nudges; nil means a client with a 1 s timeout.
	HTTP *http.Client
	Log  zerolog.Logger

	mu   sync.Mutex
	seen map[string]registered
	wg   sync.WaitGroup
}

// registered is the last record this process wrote for a lease.
type registered struct {
	at      time.Time
	healthy bool
}

// NudgeTimeout bounds one nudge request.
const NudgeTimeout = time.Second

// Register records this instance as a contender for lease, with its
// worker's health as the worker last reported it (healthy true when the
// worker reports nothing). It writes at most once per TTL/2 per lease,
// and at once when the health changed, and never blocks the caller.
func (c *Contenders) Register(lease string, healthy bool) {
	if c == nil || c.URL == "" {
		return
	}
	c.mu.Lock()
	if c.seen == nil {
		c.seen = map[string]registered{}
	}
	if last, ok := c.seen[lease]; ok && time.Since(last.at) < c.TTL/2 && last.healthy == healthy {
		c.mu.Unlock()
		return
	}
	c.seen[lease] = registered{at: time.Now(), healthy: healthy}
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
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

// NudgeOthers tells every recent contender of lease except this instance
// that it has just been released. It never blocks the caller.
func (c *Contenders) NudgeOthers(lease string) {
	if c == nil {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		rows, err := c.DB.Query(`SELECT `+database.Text("nudge_url")+` FROM lease_contenders
WHERE name = ?1 AND instance <> ?2 AND seen_at > `+database.NowMS+` - ?3`,
			lease, c.Instance, (3 * c.TTL).Milliseconds())
		if err != nil {
			c.Log.Debug().Err(err).Str("lease", lease).Msg("could not read contenders to nudge")
			return
		}
		var urls []string
		for rows.Next() {
			var u string
			if rows.Scan(&u) == nil {
				urls = append(urls, u)
			}
		}
		rows.Close()
		client := c.HTTP
		if client == nil {
			client = &http.Client{Timeout: NudgeTimeout}
		}
		var wg sync.WaitGroup
		for _, u := range urls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), NudgeTimeout)
				defer cancel()
				target, err := url.Parse(u)
				if err != nil {
					c.Log.Debug().Err(err).Str("url", u).Msg("unusable nudge URL")
					return
				}
				q := target.Query()
				q.Set("lease", lease)
				target.RawQuery = q.Encode()
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), nil)
				if err != nil {
					return
				}
				resp, err := client.Do(req)
				if err != nil {
					c.Log.Debug().Err(err).Str("lease", lease).Str("url", u).Msg("nudge failed")
					return
				}
				resp.Body.Close()
			}()
		}
		wg.Wait()
	}()
}

// Wait blocks until every write and nudge in flight has finished (for a
// clean shutdown and leak-free tests).
func (c *Contenders) Wait() {
	if c != nil {
		c.wg.Wait()
	}
}

// contenderFreshness is how recent a contender's record must be to count
// for a yield, in TTLs: a contender writes at least once per TTL/2 while
// it attempts, and attempts at least every 1.2 retry intervals (<= TTL).
const contenderFreshness = 2

// HealthyContender reports whether some other instance contending for
// lease recorded itself healthy within the last two TTLs (health-aware
// custody: a holder whose worker is unhealthy yields only to such a
// contender). The driver ignores ctx.
func (c *Contenders) HealthyContender(ctx context.Context, lease string) (bool, error) {
	if c == nil {
		return false, nil
	}
	var one int
	err := c.DB.QueryRowContext(ctx, `SELECT 1 FROM lease_contenders
WHERE name = ?1 AND instance <> ?2 AND healthy = 1 AND seen_at > `+database.NowMS+` - ?3 LIMIT 1`,
		lease, c.Instance, (contenderFreshness * c.TTL).Milliseconds()).Scan(&one)
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
