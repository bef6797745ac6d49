package leasestore

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/logval"
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
	// HTTP is the client for nudges; nil means a client with a 1 s
	// timeout over Transport. A client given here should use Transport
	// (as its base) too, or the connections Prepare dials are not used.
	HTTP *http.Client
	// Header is added to every nudge, e.g. the admin token's
	// Authorization (admin.BearerHeader).
	Header http.Header
	Log    zerolog.Logger
	// NoAnnounce makes Announce do nothing: on a libSQL server the
	// contenders do not stand by (actors/lease.Options.StandbyFor), so the
	// release need not wait for their answers.
	NoAnnounce bool

	mu   sync.Mutex
	seen map[string]registered
	// forgotten is set by Forget: Register writes nothing after it.
	forgotten bool
	// registering counts Register's writes in flight (Forget waits for
	// them, so none lands after its delete).
	registering sync.WaitGroup
	// known holds, per lease, the nudge URLs of the other instances'
	// recent contenders as last read (by Refresh for every lease, at
	// refreshedAt, or by Prepare for one), so a release nudges at once,
	// without reading the table first.
	known       map[string]knownURLs
	refreshedAt time.Time
	refreshing  bool
	// reading holds, per lease, a channel closed when Prepare's read of
	// its contenders has ended; prepared, one closed when its dials have
	// ended too (WaitPrepared).
	reading  map[string]chan struct{}
	prepared map[string]chan struct{}
	// warm holds connections dialed ahead of a nudge, by host:port.
	warm map[string][]warmConn
	// client is the default nudge client (HTTP nil), built once;
	// transport is Transport's.
	client    *http.Client
	transport *http.Transport
	// refused holds when a contender's refusal of the admin token was
	// last logged at warn, by nudge URL.
	refused map[string]time.Time
	wg      sync.WaitGroup
	// abandon, made on first use (base), ends the contexts and reads of
	// the nudges still unanswered when Drain's grace has run out.
	abandonCtx context.Context
	abandon    context.CancelFunc
}

// Recent is how lately a contender must have been seen (its record's
// seen_at) to be nudged, announced to or handed a lease (Store.Transfer):
// three TTLs.
func (c *Contenders) Recent() time.Duration { return 3 * c.TTL }

// base is the context every nudge's request and answer derive from.
func (c *Contenders) base() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.abandonCtx == nil {
		c.abandonCtx, c.abandon = context.WithCancel(context.Background())
	}
	return c.abandonCtx
}

// knownURLs is one lease's contenders' URLs, read at at.
type knownURLs struct {
	at   time.Time
	urls []string
}

// warmConn is a connection dialed by Prepare, not used yet.
type warmConn struct {
	at   time.Time
	conn net.Conn
}

// warmFor bounds how long a connection dialed ahead waits for its nudge:
// well within the admin server's ReadHeaderTimeout (5 s), after which the
// server would close it under the request. An older one is closed and a
// new connection dialed.
const warmFor = 2 * time.Second

// registered is the last record this process wrote for a lease.
type registered struct {
	at      time.Time
	healthy bool
}

// refusalQuiet spaces the warnings about one contender refusing the
// admin token.
const refusalQuiet = time.Minute

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
	if c.forgotten {
		c.mu.Unlock()
		return
	}
	if c.seen == nil {
		c.seen = map[string]registered{}
	}
	if last, ok := c.seen[lease]; ok && time.Since(last.at) < c.TTL/2 && last.healthy == healthy {
		c.mu.Unlock()
		return
	}
	c.seen[lease] = registered{at: time.Now(), healthy: healthy}
	c.wg.Add(1)
	c.registering.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		defer c.registering.Done()
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

// Refresh reads the recent contenders of every lease, with one query in
// the background, when the last read is older than TTL/2; otherwise it
// does nothing. A holder calls it at every renewal, so that its release
// can nudge at once (see NudgeOthers): at most one read per TTL/2 per
// process, however many leases it holds.
func (c *Contenders) Refresh() {
	if c == nil {
		return
	}
	c.mu.Lock()
	if c.refreshing || time.Since(c.refreshedAt) < c.TTL/2 {
		c.mu.Unlock()
		return
	}
	c.refreshing = true
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		began := time.Now()
		all, err := c.readAll()
		c.mu.Lock()
		defer c.mu.Unlock()
		c.refreshing = false
		if err != nil {
			c.Log.Debug().Err(err).Msg("could not read the contenders to nudge")
			return
		}
		known := make(map[string]knownURLs, len(all))
		for lease, urls := range all {
			known[lease] = knownURLs{at: began, urls: urls}
		}
		for lease, k := range c.known {
			if k.at.After(began) { // Prepare read it since
				known[lease] = k
			}
		}
		c.known, c.refreshedAt = known, began
	}()
}

// otherProcess is the condition on a lease_contenders row that it was
// written by another process than this one: another instance, or another
// process start under this instance_id (two processes an operator gave
// one instance_id are told apart by their nonce). instance and nonce are
// the numbers of the parameters carrying c.Instance and c.Nonce.
func otherProcess(instance, nonce int) string {
	return fmt.Sprintf("(instance <> ?%d OR nonce <> ?%d)", instance, nonce)
}

// readAll reads the nudge URLs of the other processes' recent contenders
// of every lease (see urls).
func (c *Contenders) readAll() (map[string][]string, error) {
	rows, err := c.DB.Query(`SELECT `+database.Text("name")+`, `+database.Text("nudge_url")+` FROM lease_contenders
WHERE `+otherProcess(1, 3)+` AND seen_at > `+database.NowMS+` - ?2`,
		c.Instance, c.Recent().Milliseconds(), c.Nonce)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	all := map[string][]string{}
	for rows.Next() {
		var name, u string
		if err := rows.Scan(&name, &u); err != nil {
			return nil, err
		}
		all[name] = append(all[name], u)
	}
	return all, rows.Err()
}

// knownURLs returns the URLs last read for lease, nil when that read is
// a TTL old or more.
func (c *Contenders) knownURLs(lease string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.known[lease]
	if time.Since(k.at) >= c.TTL {
		return nil
	}
	return k.urls
}

// Prepare readies the nudges of a release of lease that is about to come
// (a graceful stop has begun, the worker drains): it dials a connection
// to each contender already known (Refresh), reads the lease's
// contenders again and dials the new ones, so the nudge after the
// release is most often one request on an open connection, with no read
// and no dial before it. It never blocks the caller; NudgeOthers works
// without it.
func (c *Contenders) Prepare(lease string) {
	if c == nil {
		return
	}
	known := c.knownURLs(lease)
	read, prepared := make(chan struct{}), make(chan struct{})
	c.mu.Lock()
	if c.reading == nil {
		c.reading, c.prepared = map[string]chan struct{}{}, map[string]chan struct{}{}
	}
	c.reading[lease], c.prepared[lease] = read, prepared
	c.mu.Unlock()
	var both sync.WaitGroup
	both.Add(2)
	c.wg.Add(3)
	go func() {
		defer c.wg.Done()
		both.Wait()
		c.mu.Lock()
		if c.prepared[lease] == prepared {
			delete(c.prepared, lease)
		}
		c.mu.Unlock()
		close(prepared)
	}()
	go func() {
		defer c.wg.Done()
		defer both.Done()
		for _, u := range known {
			c.dialAhead(u)
		}
	}()
	go func() {
		defer c.wg.Done()
		defer both.Done()
		began := time.Now()
		urls, err := c.urls(lease)
		c.mu.Lock()
		if err == nil {
			if c.known == nil {
				c.known = map[string]knownURLs{}
			}
			c.known[lease] = knownURLs{at: began, urls: urls}
		}
		if c.reading[lease] == read {
			delete(c.reading, lease)
		}
		c.mu.Unlock()
		close(read)
		if err != nil {
			c.Log.Debug().Err(err).Str("lease", lease).Msg("could not read contenders to nudge")
			return
		}
		for _, u := range urls {
			if !slices.Contains(known, u) {
				c.dialAhead(u)
			}
		}
	}()
}

// WaitPrepared blocks until the last Prepare of lease has read its
// contenders and dialed them, or until ctx ends, whichever is first; it
// returns at once when no Prepare of lease is under way. A holder waits
// on it (briefly) before it releases, so the nudge leaves with the
// release, on an open connection, rather than after a read and a dial:
// the lease is held a little longer, and left without a holder for less.
func (c *Contenders) WaitPrepared(ctx context.Context, lease string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	prepared := c.prepared[lease]
	c.mu.Unlock()
	if prepared == nil {
		return
	}
	select {
	case <-prepared:
	case <-ctx.Done():
	}
}

// The lease endpoints of every instance's admin server: POST
// NudgePath?lease=NAME tells a contender that NAME was just released
// (NudgeOthers); POST StandbyPath?lease=NAME that its holder is about to
// release it (Announce).
const (
	NudgePath   = "/lease/nudge"
	StandbyPath = "/lease/standby"
)

// StandbyURL returns the standby endpoint of the instance whose nudge
// endpoint is u (u ending in NudgePath), and false for any other URL: an
// instance that records a nudge URL of another shape is only nudged.
func StandbyURL(u string) (string, bool) {
	base, ok := strings.CutSuffix(u, NudgePath)
	if !ok {
		return "", false
	}
	return base + StandbyPath, true
}

// Announce tells lease's known contenders (Refresh, Prepare) that this
// holder is about to release it, and waits until each has answered or ctx
// ends, whichever is first; a holder calls it right before the release.
// A contender that answers has begun to watch the lease row (see
// actors/lease, Standby) and takes the lease within a read and an acquire
// of the release, where a nudge alone would first have to wake an idle
// process (100–400 µs on a 2-core host, measured in
// docs/performance.md). The request goes on a connection Prepare dialed
// when there is one, which then carries the nudge after the release too.
// Correctness never depends on it: an unanswered announcement only costs
// the wait, and the nudge still follows the release.
//
// It returns the contenders whose answers say they are watching, as
// Successors, in the order they answered: the holder can hand the lease
// to one of them (Store.Transfer) instead of releasing it.
func (c *Contenders) Announce(ctx context.Context, lease string) []Successor {
	if c == nil || c.NoAnnounce {
		return nil
	}
	var answered sync.WaitGroup
	var mu sync.Mutex
	var watching []Successor
	for _, u := range c.knownURLs(lease) {
		su, ok := StandbyURL(u)
		if !ok {
			continue
		}
		answered.Add(1)
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer answered.Done()
			if s, ok := c.standby(ctx, lease, u, su); ok {
				mu.Lock()
				watching = append(watching, s)
				mu.Unlock()
			}
		}()
	}
	answered.Wait()
	mu.Lock()
	defer mu.Unlock()
	return watching
}

// Announces reports whether Announce(lease) would ask any contender
// now: announcements are on and some other process's contender of lease
// was known at the last read.
func (c *Contenders) Announces(lease string) bool {
	if c == nil || c.NoAnnounce {
		return false
	}
	for _, u := range c.knownURLs(lease) {
		if _, ok := StandbyURL(u); ok {
			return true
		}
	}
	return false
}

// standbyAnswer is the body of a standby's 200 answer (POST StandbyPath):
// the contender watching the row, which a holder may hand the lease to.
// A contender that does not watch answers 202 without a body.
type standbyAnswer struct {
	Instance string `json:"instance"`
	Nonce    string `json:"nonce"`
	TTLMS    int64  `json:"ttl_ms"`
}

// maxAnswerTTL bounds the TTL a standby's answer may ask a handed-over
// grant to carry: leases.ttl's own ceiling (config.MaxLeaseTTL, 1 h), so
// a wrong answer parks a lease no longer than a configured TTL could.
const maxAnswerTTL = time.Hour

// StandbyAnswer is the body a watching contender answers a standby with
// (see Announce): its instance_id, process nonce and lease TTL.
func StandbyAnswer(s Successor) []byte {
	b, _ := json.Marshal(standbyAnswer{Instance: s.Instance, Nonce: s.Nonce, TTLMS: s.TTL.Milliseconds()})
	return b
}

// parseStandbyAnswer reads a standby's 200 body: a Successor with an
// instance, a nonce of 16 hex digits (Store.Nonce) and a TTL of 1 ms to
// maxAnswerTTL, or an error saying which is wrong.
func parseStandbyAnswer(body []byte) (Successor, error) {
	var a standbyAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return Successor{}, fmt.Errorf("standby answer: %w", err)
	}
	if a.Instance == "" || len(a.Instance) > 256 {
		return Successor{}, fmt.Errorf("standby answer: instance of %d bytes", len(a.Instance))
	}
	if len(a.Nonce) != 16 || strings.Trim(a.Nonce, "0123456789abcdef") != "" {
		return Successor{}, fmt.Errorf("standby answer: nonce %q is not 16 hex digits", logval.String(a.Nonce))
	}
	ttl := time.Duration(a.TTLMS) * time.Millisecond
	if a.TTLMS <= 0 || ttl > maxAnswerTTL {
		return Successor{}, fmt.Errorf("standby answer: ttl_ms %d out of range", a.TTLMS)
	}
	return Successor{Instance: a.Instance, Nonce: a.Nonce, TTL: ttl}, nil
}

// standby POSTs the standby request for lease to su, the standby URL of
// nudge URL u, and reads its answer, within ctx. It goes on a connection
// Prepare opened to the host when there is one (dialing one otherwise),
// and gives the connection back for the nudge when the exchange left it
// open. It returns the contender when its answer says it is watching.
func (c *Contenders) standby(ctx context.Context, lease, u, su string) (Successor, bool) {
	req, err := c.nudgeRequest(ctx, lease, su)
	if err != nil || req.URL.Scheme != "http" {
		return Successor{}, false
	}
	addr := hostPort(req.URL)
	conn := c.takeWarm(addr)
	if conn == nil {
		if conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr); err != nil {
			return Successor{}, false
		}
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(NudgeTimeout)
	}
	_ = conn.SetDeadline(deadline)
	reuse := false
	defer func() {
		if !reuse {
			_ = conn.Close()
			return
		}
		_ = conn.SetDeadline(time.Time{})
		c.giveWarm(addr, conn)
	}()
	if err := req.Write(conn); err != nil {
		return Successor{}, false
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		c.Log.Debug().Err(err).Str("lease", lease).Str("url", su).Msg("standby request got no answer")
		return Successor{}, false
	}
	if resp.StatusCode == http.StatusNotFound {
		// An instance without the endpoint (an older version), or one
		// that does not run this lease: the nudge alone serves it.
		_ = resp.Body.Close()
		return Successor{}, false
	}
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, 4096))
	reuse = rerr == nil && !resp.Close && br.Buffered() == 0 && resp.StatusCode < 300
	c.answered(lease, u, resp)
	if rerr != nil || resp.StatusCode != http.StatusOK {
		return Successor{}, false
	}
	s, err := parseStandbyAnswer(body)
	if err != nil {
		c.Log.Debug().Err(err).Str("lease", lease).Str("url", su).Msg("standby answer not understood; the lease is released, not handed over")
		return Successor{}, false
	}
	return s, true
}

// giveWarm puts back an open connection to addr for the next nudge.
func (c *Contenders) giveWarm(addr string, conn net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.warm == nil {
		c.warm = map[string][]warmConn{}
	}
	c.warm[addr] = append(c.warm[addr], warmConn{at: time.Now(), conn: conn})
}

// dialAhead opens a connection to the host of nudge URL u for dial to
// hand out.
func (c *Contenders) dialAhead(u string) {
	target, err := url.Parse(u)
	if err != nil || target.Scheme != "http" {
		return
	}
	addr := hostPort(target)
	ctx, cancel := context.WithTimeout(c.base(), NudgeTimeout)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return // the nudge dials again, and reports
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.warm == nil {
		c.warm = map[string][]warmConn{}
	}
	// Connections nobody used in time are closed here, so a process
	// that prepares releases that never come does not keep them open.
	fresh := c.warm[addr][:0]
	for _, w := range c.warm[addr] {
		if time.Since(w.at) < warmFor {
			fresh = append(fresh, w)
		} else {
			_ = w.conn.Close()
		}
	}
	c.warm[addr] = append(fresh, warmConn{at: time.Now(), conn: conn})
}

// Transport returns the HTTP transport nudges should go through (the
// base of Contenders.HTTP): http.DefaultTransport's settings, dialing
// through the connections Prepare opened. It is the same transport on
// every call; Wait closes its idle connections.
func (c *Contenders) Transport() *http.Transport {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.transport == nil {
		c.transport = http.DefaultTransport.(*http.Transport).Clone()
		c.transport.DialContext = c.dial
	}
	return c.transport
}

// dial hands out a connection Prepare opened to addr, when one is fresh
// enough, else dials.
func (c *Contenders) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if network == "tcp" {
		if conn := c.takeWarm(addr); conn != nil {
			return conn, nil
		}
	}
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

// urls reads the nudge URLs of lease's recent contenders other than this
// process (otherProcess: a twin under this instance_id is nudged too).
func (c *Contenders) urls(lease string) ([]string, error) {
	rows, err := c.DB.Query(`SELECT `+database.Text("nudge_url")+` FROM lease_contenders
WHERE name = ?1 AND `+otherProcess(2, 4)+` AND seen_at > `+database.NowMS+` - ?3`,
		lease, c.Instance, c.Recent().Milliseconds(), c.Nonce)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var urls []string
	for rows.Next() {
		var u string
		if rows.Scan(&u) == nil {
			urls = append(urls, u)
		}
	}
	return urls, rows.Err()
}

// NudgeOthers tells every recent contender of lease except this instance
// that it has just been released. It never blocks the caller. The
// contenders already known (Refresh, or Prepare's read) are nudged at
// once; those Prepare's read, if still running, finds are nudged as soon
// as it ends; the table is then read again, once those nudges are
// answered, and a contender recorded since is nudged too.
func (c *Contenders) NudgeOthers(lease string) {
	if c == nil {
		return
	}
	var sent sync.WaitGroup
	nudged := map[string]bool{}
	nudgeNew := func(urls []string) {
		for _, u := range urls {
			if !nudged[u] {
				nudged[u] = true
				sent.Add(1)
				if !c.nudgeWarm(lease, u, sent.Done) {
					c.nudge(lease, u, sent.Done)
				}
			}
		}
	}
	nudgeNew(c.knownURLs(lease))
	c.mu.Lock()
	reading := c.reading[lease]
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if reading != nil {
			select {
			case <-reading:
				nudgeNew(c.knownURLs(lease))
			case <-time.After(NudgeTimeout):
			}
		}
		sent.Wait() // the nudges come first
		urls, err := c.urls(lease)
		if err != nil {
			c.Log.Debug().Err(err).Str("lease", lease).Msg("could not read contenders to nudge")
			return
		}
		nudgeNew(urls)
	}()
}

// nudgeWarm is the fast path of a nudge: when Prepare opened a connection
// to u's host, the request is written on it from the caller's goroutine
// (a few hundred bytes into an empty socket buffer: it does not block),
// so it leaves the moment the lease is released instead of after the
// goroutines an HTTP client goes through first (on a loaded 2-core host
// they took 0.5 to 2 ms to be scheduled). The answer is read in the
// background; done is called once it has been, or once the ordinary
// nudge it falls back to has ended (the server may have closed the
// connection since it was dialed). It returns false, having done
// nothing, when there is no such connection.
func (c *Contenders) nudgeWarm(lease, u string, done func()) bool {
	req, err := c.nudgeRequest(context.Background(), lease, u)
	if err != nil || req.URL.Scheme != "http" {
		return false
	}
	conn := c.takeWarm(hostPort(req.URL))
	if conn == nil {
		return false
	}
	req.Close = true // one request: the server closes after answering
	_ = conn.SetDeadline(time.Now().Add(NudgeTimeout))
	if err := req.Write(conn); err != nil {
		_ = conn.Close()
		return false
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		// Drain gives up on an answer that has not come within its grace.
		unblock := context.AfterFunc(c.base(), func() { _ = conn.SetDeadline(time.Now()) })
		defer unblock()
		resp, err := http.ReadResponse(bufio.NewReader(conn), req)
		if err == nil {
			c.answered(lease, u, resp)
		}
		_ = conn.Close()
		if err != nil {
			if c.base().Err() != nil {
				done() // given up on at Drain: the request was written
				return
			}
			c.Log.Debug().Err(err).Str("lease", lease).Str("url", u).Msg("nudge on a connection dialed ahead got no answer; sending it again")
			c.nudge(lease, u, done)
			return
		}
		done()
	}()
	return true
}

// nudgeRequest is the nudge for lease to nudge URL u: a POST with the
// lease as a query parameter, carrying Header.
func (c *Contenders) nudgeRequest(ctx context.Context, lease, u string) (*http.Request, error) {
	target, err := url.Parse(u)
	if err != nil {
		return nil, err
	}
	q := target.Query()
	q.Set("lease", lease)
	target.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), nil)
	if err != nil {
		return nil, err
	}
	for k, vs := range c.Header {
		req.Header[k] = vs
	}
	return req, nil
}

// takeWarm returns a connection Prepare opened to addr and nobody has
// used, fresh enough (warmFor), or nil.
func (c *Contenders) takeWarm(addr string) net.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.warm[addr]) > 0 {
		conns := c.warm[addr]
		w := conns[len(conns)-1]
		c.warm[addr] = conns[:len(conns)-1]
		if time.Since(w.at) < warmFor {
			return w.conn
		}
		_ = w.conn.Close()
	}
	return nil
}

// hostPort is the host:port of an http URL (port 80 when it names none).
func hostPort(u *url.URL) string {
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "80")
	}
	return u.Host
}

// noRedirect is the default nudge client's redirect rule: none is
// followed. A nudge goes to another instance's own endpoint, which never
// redirects; a 3xx (a URL in lease_contenders pointing elsewhere) is the
// answer, and a nudge is never sent on, with its bearer token, to a host
// the contender table does not name.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// nudge POSTs one nudge for lease to u, in the background, and calls
// done when it is answered or has failed.
func (c *Contenders) nudge(lease, u string, done func()) {
	client := c.HTTP
	if client == nil {
		c.mu.Lock()
		client = c.client
		c.mu.Unlock()
		if client == nil {
			client = &http.Client{Timeout: NudgeTimeout, Transport: c.Transport(), CheckRedirect: noRedirect}
			c.mu.Lock()
			if c.client == nil {
				c.client = client
			}
			client = c.client
			c.mu.Unlock()
		}
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer done()
		ctx, cancel := context.WithTimeout(c.base(), NudgeTimeout)
		defer cancel()
		req, err := c.nudgeRequest(ctx, lease, u)
		if err != nil {
			c.Log.Debug().Err(err).Str("url", u).Msg("unusable nudge URL")
			return
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
// token is logged at warn: every handover to that contender then waits
// for its poll (leases.retry_interval) instead of milliseconds, and the
// only other trace is the contender's appview_admin_auth_failures_total.
// It is said once per contender per refusalQuiet (a shutdown releases
// every lease at once: one line, not one per lease); the rest at debug.
func (c *Contenders) answered(lease, u string, resp *http.Response) {
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		level := zerolog.WarnLevel
		c.mu.Lock()
		if c.refused == nil {
			c.refused = map[string]time.Time{}
		}
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

// Forget deletes this process's contender records (a stopping instance
// contends no more), so that releasing holders stop nudging it, after the
// records being written have landed; Register writes none after it. It
// returns the database's error.
//
// A stopping instance forgets as its stop begins, not after its releases:
// the delete is a write, and right after the releases it met the
// successor's acquires at the write lock (docs/performance.md, twelfth
// pass).
func (c *Contenders) Forget(ctx context.Context) error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	c.forgotten = true
	c.mu.Unlock()
	c.registering.Wait()
	_, err := c.DB.ExecContext(ctx, `DELETE FROM lease_contenders WHERE instance = ?1 AND nonce = ?2`, c.Instance, c.Nonce)
	if err != nil {
		return fmt.Errorf("forget this instance's contender records: %w", err)
	}
	return nil
}

// Wait blocks until every write and nudge in flight has finished (for
// leak-free tests), then closes the connections dialed ahead and not
// used, and Transport's idle connections. A stopping instance calls Drain.
func (c *Contenders) Wait() { c.Drain(-1) }

// Drain is Wait that waits at most grace (negative: for ever) for the
// nudges still unanswered, then gives them up: their requests were
// written, and a contender that does not answer (frozen, or its port
// taken by something that never replies) would otherwise hold a stopping
// holder's exit for NudgeTimeout. Database writes in flight are always
// waited for.
func (c *Contenders) Drain(grace time.Duration) {
	if c == nil {
		return
	}
	if grace >= 0 {
		done := make(chan struct{})
		go func() { c.wg.Wait(); close(done) }()
		t := time.NewTimer(grace)
		select {
		case <-done:
		case <-t.C:
			c.base()
			c.mu.Lock()
			c.abandon()
			c.mu.Unlock()
		}
		t.Stop()
		<-done
	}
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, conns := range c.warm {
		for _, w := range conns {
			_ = w.conn.Close()
		}
		delete(c.warm, addr)
	}
	if c.transport != nil {
		c.transport.CloseIdleConnections()
	}
}

// contenderFreshness is how recent a contender's record must be to count
// for a yield, in TTLs: a contender writes at least once per TTL/2 while
// it attempts, and attempts at least every 1.2 retry intervals (<= TTL).
const contenderFreshness = 2

// HealthyContender reports whether some other process contending for
// lease (another instance, or another process start under this
// instance_id) recorded itself healthy within the last two TTLs (health-aware
// custody: a holder whose worker is unhealthy yields only to such a
// contender). The driver ignores ctx.
func (c *Contenders) HealthyContender(ctx context.Context, lease string) (bool, error) {
	if c == nil {
		return false, nil
	}
	var one int
	err := c.DB.QueryRowContext(ctx, `SELECT 1 FROM lease_contenders
WHERE name = ?1 AND `+otherProcess(2, 4)+` AND healthy = 1 AND seen_at > `+database.NowMS+` - ?3 LIMIT 1`,
		lease, c.Instance, (contenderFreshness * c.TTL).Milliseconds(), c.Nonce).Scan(&one)
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
