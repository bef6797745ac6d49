package config

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/database"
)

// maxWantedCollections is Jetstream's limit on wantedCollections (its
// subscribe handler answers more with HTTP 400).
const maxWantedCollections = 100

// Validate checks every value and the relations between keys. It returns
// the first problem as a *Error (Problems returns them all).
func (c Config) Validate() error { return c.Problems().Err() }

// Problems is every problem Validate finds: at most one per key (its
// first), and no rule relating keys when one of them already has a
// problem. The checks run in a fixed order, so the first problem is the
// same on every run: a key's own bounds before the rules relating it to
// others.
func (c Config) Problems() Problems {
	p := &problemList{}
	p.add(checkInstanceID(c.InstanceID))
	c.checkProcess(p)
	c.checkAdmin(p)
	c.checkJetstream(p)
	// A key's floor is its own bound, so it comes before the rules relating
	// keys (health.timeout below health.check_interval); zero and negative
	// values are left to the "must be positive" rules below.
	for _, f := range durationFloors(c) {
		if f.got > 0 && f.got < f.min {
			p.fail(f.key, "must be at least %s (%s), got %s", short(f.min), f.why, f.got)
		}
	}
	c.checkBounds(p)
	c.checkWorkers(p)
	c.checkWorkerURLs(p)
	return p.list
}

// checkProcess checks the keys every command reads: shutdown_timeout,
// log_level, database.* and leases.*.
func (c Config) checkProcess(p *problemList) {
	l := c.Leases
	if c.ShutdownTimeout <= 0 {
		p.fail("shutdown_timeout", "must be positive, got %s", c.ShutdownTimeout)
	}
	if !validLogLevel(c.LogLevel) {
		p.fail("log_level", "want debug, info, warn or error, got %q", c.LogLevel)
	}
	if c.Database.BusyTimeout < 0 {
		p.fail("database.busy_timeout", "must not be negative")
	}
	if c.Database.BusyTimeout < MinBusyTimeout {
		p.fail("database.busy_timeout", "must be at least %s (below it a lock held by an ordinary commit fails lease renewals and writes that only had to wait), got %s",
			short(MinBusyTimeout), short(c.Database.BusyTimeout))
	}
	// Operator floors and ceilings first; the relations the custody
	// guarantee rests on are the lease package's own (Timing.Validate,
	// also checked by the LeaseActor's constructor).
	if l.TTL > 0 && l.TTL < MinLeaseTTL {
		p.fail("leases.ttl", "must be at least %s, got %s", short(MinLeaseTTL), short(l.TTL))
	}
	if l.TTL > MaxLeaseTTL {
		p.fail("leases.ttl", "must be at most %s, got %s", short(MaxLeaseTTL), short(l.TTL))
	}
	if l.RenewInterval > 0 && l.RenewInterval < MinLeaseRenewInterval {
		p.fail("leases.renew_interval", "must be at least %s, got %s", short(MinLeaseRenewInterval), short(l.RenewInterval))
	}
	if l.RenewDeadline > 0 && l.RenewDeadline < MinLeaseRenewDeadline {
		p.fail("leases.renew_deadline", "must be at least %s, got %s", short(MinLeaseRenewDeadline), short(l.RenewDeadline))
	}
	if l.RetryInterval > 0 && l.RetryInterval < MinLeaseRetryInterval {
		p.fail("leases.retry_interval", "must be at least %s, got %s", short(MinLeaseRetryInterval), short(l.RetryInterval))
	}
	if l.YieldGrace < 0 {
		p.fail("leases.yield_grace", "must not be negative, got %s", l.YieldGrace)
	}
	if l.MinHold < 0 {
		p.fail("leases.min_hold", "must not be negative, got %s", l.MinHold)
	}
	if p.ok("leases.ttl", "leases.renew_interval", "leases.renew_deadline", "leases.retry_interval") {
		if err := l.Timing().Validate(); err != nil {
			var te *TimingError
			if errors.As(err, &te) {
				p.fail(te.Key, "%s", te.Reason)
			} else {
				p.fail("leases", "%v", err)
			}
		}
	}
	loc, err := database.ParseURL(c.Database.URL)
	if err != nil {
		p.fail("database.url", "%v", err)
	}
	// A token beside a file URL is not used; serve warns about it.
	if err == nil && loc.Server != nil && strings.ContainsAny(c.Database.AuthToken, " \t\r\n") {
		p.fail("database.auth_token", "must not contain whitespace (it is sent in an Authorization header)")
	}
}

// checkAdmin checks admin.*: the address, the token and the rules that
// tie them.
func (c Config) checkAdmin(p *problemList) {
	a := c.Admin
	if a.Addr != "" {
		if _, _, err := net.SplitHostPort(a.Addr); err != nil {
			p.fail("admin.addr", "want host:port: %v", err)
		}
	}
	if a.Token != "" && len(a.Token) < MinTokenLength {
		if a.TokenFile != "" {
			p.fail("admin.token_file", "the token in %s must be at least %d characters (got %d)", a.TokenFile, MinTokenLength, len(a.Token))
		} else {
			p.fail("admin.token", "must be at least %d characters (got %d)", MinTokenLength, len(a.Token))
		}
	}
	if a.Token != "" && strings.ContainsAny(a.Token, " \t\r\n") {
		p.fail("admin.token", "must not contain whitespace (it is sent in an Authorization header)")
	}
	if a.Addr != "" && a.Token == "" && !a.AllowUnauthenticated && !loopbackOnly(a.Addr) && p.ok("admin.addr") {
		p.fail("admin.token", "required when admin.addr (%s) is not a loopback address: set admin.token or admin.token_file, "+
			"or admin.allow_unauthenticated: true to serve the admin endpoint to anyone who reaches it", a.Addr)
	}
	if a.ProtectMetrics && a.Token == "" {
		p.fail("admin.protect_metrics", "needs admin.token or admin.token_file")
	}
	if a.AdvertiseURL != "" {
		p.add(checkURL("admin.advertise_url", a.AdvertiseURL, "http", "https"))
	}
}

// checkJetstream checks jetstream.urls and jetstream.collections.
func (c Config) checkJetstream(p *problemList) {
	js := c.Jetstream
	if len(js.URLs) == 0 {
		p.fail("jetstream.urls", "must list at least one endpoint")
	}
	p.add(checkList("jetstream.urls", js.URLs, sameEndpoint))
	for _, u := range js.URLs {
		p.add(checkURL("jetstream.urls", u, "ws", "wss"))
		p.add(checkJetstreamPath(u))
		p.add(checkJetstreamQuery(u))
	}
	if len(js.Collections) == 0 {
		// Jetstream reads an absent wantedCollections as "everything": an
		// empty list would subscribe this instance to the whole firehose.
		p.fail("jetstream.collections", "must list at least one NSID or prefix.* (an empty list subscribes to the whole firehose)")
	}
	p.add(checkList("jetstream.collections", js.Collections, strings.TrimSpace))
	for _, col := range js.Collections {
		if !atproto.ValidNSIDPattern(col) {
			p.fail("jetstream.collections", "%q is not an NSID or NSID prefix ending in .*", col)
		}
	}
	if n := len(js.Collections); n > maxWantedCollections {
		p.fail("jetstream.collections", "%d collections: Jetstream accepts at most %d", n, maxWantedCollections)
	}
}

// checkBounds checks the lower and upper bounds of the numbers and
// durations not checked above, after their floors.
func (c Config) checkBounds(p *problemList) {
	js, h := c.Jetstream, c.Health
	for _, b := range []struct {
		broken bool
		key    string
		reason string
	}{
		{js.Rewind < 0, "jetstream.rewind", "must not be negative"},
		{js.StaleTimeout <= 0, "jetstream.stale_timeout", "must be positive"},
		{js.FailbackInterval < 0, "jetstream.failback_interval", "must not be negative (0: never switch back)"},
		{js.UnhealthyAfter <= 0, "jetstream.unhealthy_after", "must be positive"},
		{js.ResyncInterval < time.Millisecond, "jetstream.resync_interval", fmt.Sprintf("must be at least 1ms, got %v", js.ResyncInterval)},
		{js.CommitBudget <= 0, "jetstream.commit_budget", fmt.Sprintf("must be positive, got %v", js.CommitBudget)},
		{js.MaxMessageBytes < MinMaxMessageBytes, "jetstream.max_message_bytes", fmt.Sprintf("must be at least %d (1 KiB), got %d", MinMaxMessageBytes, js.MaxMessageBytes)},
		{js.MaxMessageBytes > MaxMaxMessageBytes, "jetstream.max_message_bytes", fmt.Sprintf("must be at most %d (64 MiB), got %d", MaxMaxMessageBytes, js.MaxMessageBytes)},
		{c.Backfill.Interval < 0, "backfill.interval", "must not be negative"},
		{c.Backfill.RerunAfter < 0, "backfill.rerun_after", "must not be negative"},
		{c.Backfill.Concurrency < 1, "backfill.concurrency", "must be at least 1"},
		{c.Cleanup.Interval <= 0, "cleanup.interval", "must be positive"},
		{c.Cleanup.ChunkRows < 1, "cleanup.chunk_rows", "must be at least 1"},
		{c.Labeler.StaleTimeout <= 0, "labeler.stale_timeout", fmt.Sprintf("must be positive, got %s", c.Labeler.StaleTimeout)},
		{c.Billing.Timeout <= 0, "billing.timeout", "must be positive"},
		{c.Billing.DefaultTierRank < 0, "billing.default_tier_rank", "must not be negative"},
		{h.Concurrency < 1, "health.concurrency", "must be at least 1"},
		// Each key's own bounds come before the rule relating them, so a
		// zero check_interval is reported as itself, not as a timeout too long.
		{h.CheckInterval <= 0, "health.check_interval", fmt.Sprintf("must be positive, got %s", h.CheckInterval)},
		{h.Timeout <= 0, "health.timeout", fmt.Sprintf("must be positive, got %s", h.Timeout)},
		{h.Timeout >= h.CheckInterval && p.ok("health.check_interval"), "health.timeout",
			fmt.Sprintf("must be below health.check_interval (%s), got %s", h.CheckInterval, h.Timeout)},
		{c.Webhooks.Concurrency < 1, "webhooks.concurrency", fmt.Sprintf("must be at least 1, got %d", c.Webhooks.Concurrency)},
		{c.Cleanup.Retention <= 0, "cleanup.retention", "must be positive"},
		{c.Billing.Interval <= 0, "billing.interval", "must be positive"},
		{len(c.Webhooks.RetrySchedule) == 0, "webhooks.retry_schedule", "must list at least one delay (the first attempt)"},
		{c.Webhooks.Timeout <= 0, "webhooks.timeout", "must be positive"},
		{slices.ContainsFunc(c.Webhooks.RetrySchedule, func(d time.Duration) bool { return d < 0 }), "webhooks.retry_schedule", "delays must not be negative"},
	} {
		if b.broken {
			p.fail(b.key, "%s", b.reason)
		}
	}
}

// checkWorkerURLs checks the URLs and lists the workers use. URLs are
// checked whether or not their worker is on: a URL that is wrong (or
// carries credentials) is wrong before the day it is used.
func (c Config) checkWorkerURLs(p *problemList) {
	p.add(checkURL("webhooks.public_url", c.Webhooks.PublicURL, "http", "https"))
	p.add(checkList("backfill.relay_endpoints", c.Backfill.RelayEndpoints, sameEndpoint))
	if c.Backfill.Enabled && len(c.Backfill.RelayEndpoints) == 0 {
		p.fail("backfill.relay_endpoints", "must list at least one relay when backfill.enabled is true")
	}
	for _, u := range c.Backfill.RelayEndpoints {
		p.add(checkURL("backfill.relay_endpoints", u, "http", "https"))
	}
	p.add(checkURL("identity.plc_url", c.Identity.PLCURL, "http", "https"))
	if c.Identity.HandleWellKnownURL != "" {
		p.add(checkURL("identity.handle_well_known_url", c.Identity.HandleWellKnownURL, "http", "https"))
	}
	if c.Labeler.URL != "" {
		p.add(checkURL("labeler.url", c.Labeler.URL, "http", "https", "ws", "wss"))
		p.add(checkLabelerPath(c.Labeler.URL))
	}
	if c.Billing.Enabled && c.Billing.StripeSecretKey == "" {
		p.fail("billing.stripe_secret_key", "required when billing.enabled is true")
	}
	if c.Billing.Enabled || c.Billing.StripeAPIURL != "" {
		p.add(checkURL("billing.stripe_api_url", c.Billing.StripeAPIURL, "http", "https"))
	}
}

// MinTokenLength is the shortest admin.token accepted: shorter secrets are
// guessable by anyone who can reach the port.
const MinTokenLength = 16

// loopbackOnly reports whether the host of addr (host:port) only ever
// reaches this machine: a loopback IP or "localhost". An empty host or an
// unspecified address (0.0.0.0, ::) binds every interface.
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// durationFloor is the least value a duration key takes, and why.
type durationFloor struct {
	key      string
	got, min time.Duration
	why      string
}

// durationFloors lists the duration keys whose positive but tiny values
// (1ns passes "must be positive") would break the instance rather than
// tune it: a loop with no pause, a timeout no request or stop can meet,
// a stream dropped before its first event. The floors sit well below any
// value an operator would mean and below every value the test suites use.
func durationFloors(c Config) []durationFloor {
	const (
		loop    = "a shorter interval runs the loop with no pause"
		request = "no request completes in less"
		stream  = "a quieter stream would be dropped and redialed without pause"
	)
	ms := time.Millisecond
	return append([]durationFloor{
		{"shutdown_timeout", c.ShutdownTimeout, 100 * ms, "a stop cannot release its leases in less"},
		{"jetstream.stale_timeout", c.Jetstream.StaleTimeout, 100 * ms, stream},
		{"jetstream.unhealthy_after", c.Jetstream.UnhealthyAfter, 100 * ms, "a shorter silence is no sign of trouble"},
		{"jetstream.failback_interval", c.Jetstream.FailbackInterval, time.Second, "the probes would load the earlier hosts"},
		{"jetstream.commit_budget", c.Jetstream.CommitBudget, ms, "a transaction would commit every group of events"},
		{"backfill.interval", c.Backfill.Interval, time.Second, "a shorter interval walks every repository of the relays again with no pause"},
		{"cleanup.interval", c.Cleanup.Interval, 100 * ms, loop},
		{"labeler.stale_timeout", c.Labeler.StaleTimeout, 100 * ms, stream},
		{"billing.interval", c.Billing.Interval, 100 * ms, loop},
		{"billing.timeout", c.Billing.Timeout, 10 * ms, request},
		{"health.check_interval", c.Health.CheckInterval, 100 * ms, loop},
		{"health.timeout", c.Health.Timeout, 10 * ms, request},
		{"webhooks.timeout", c.Webhooks.Timeout, 10 * ms, request},
	}, c.workerFloors()...)
}

// short renders d as an operator writes it: 1h rather than 1h0m0s.
func short(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") { // 2m0s, 1h0m0s
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") { // 1h0m
		s = s[:len(s)-2]
	}
	return s
}

func validLogLevel(s string) bool {
	switch s {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}
