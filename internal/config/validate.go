package config

import (
	"errors"
	"net"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/leasestore"
)

// maxWantedCollections is Jetstream's limit on wantedCollections (its
// subscribe handler answers more with HTTP 400).
const maxWantedCollections = 100

// Validate checks the relations between keys. It returns the first problem
// as a *Error.
func (c Config) Validate() error {
	if err := checkInstanceID(c.InstanceID); err != nil {
		return err
	}
	l := c.Leases
	switch {
	case c.ShutdownTimeout <= 0:
		return keyErr("shutdown_timeout", "must be positive, got %s", c.ShutdownTimeout)
	case !validLogLevel(c.LogLevel):
		return keyErr("log_level", "want debug, info, warn or error, got %q", c.LogLevel)
	case c.Database.BusyTimeout < 0:
		return keyErr("database.busy_timeout", "must not be negative")
	case c.Database.BusyTimeout < MinBusyTimeout:
		return keyErr("database.busy_timeout", "must be at least %s (below it a lock held by an ordinary commit fails lease renewals and writes that only had to wait), got %s",
			short(MinBusyTimeout), short(c.Database.BusyTimeout))
	// Operator floors and ceilings first; the relations the custody
	// guarantee rests on are the lease package's own (Timing.Validate,
	// also checked by the LeaseActor's constructor).
	case l.TTL > 0 && l.TTL < MinLeaseTTL:
		return keyErr("leases.ttl", "must be at least %s, got %s", short(MinLeaseTTL), short(l.TTL))
	case l.TTL > MaxLeaseTTL:
		return keyErr("leases.ttl", "must be at most %s, got %s", short(MaxLeaseTTL), short(l.TTL))
	case l.RenewInterval > 0 && l.RenewInterval < MinLeaseRenewInterval:
		return keyErr("leases.renew_interval", "must be at least %s, got %s", short(MinLeaseRenewInterval), short(l.RenewInterval))
	case l.RenewDeadline > 0 && l.RenewDeadline < MinLeaseRenewDeadline:
		return keyErr("leases.renew_deadline", "must be at least %s, got %s", short(MinLeaseRenewDeadline), short(l.RenewDeadline))
	case l.RetryInterval > 0 && l.RetryInterval < MinLeaseRetryInterval:
		return keyErr("leases.retry_interval", "must be at least %s, got %s", short(MinLeaseRetryInterval), short(l.RetryInterval))
	case l.YieldGrace < 0:
		return keyErr("leases.yield_grace", "must not be negative, got %s", l.YieldGrace)
	case l.MinHold < 0:
		return keyErr("leases.min_hold", "must not be negative, got %s", l.MinHold)
	}
	if err := l.Timing().Validate(); err != nil {
		var te *leasestore.TimingError
		if errors.As(err, &te) {
			return keyErr(te.Key, "%s", te.Reason)
		}
		return keyErr("leases", "%v", err)
	}
	if _, err := database.ParseURL(c.Database.URL); err != nil {
		return keyErr("database.url", "%v", err)
	}
	if c.Admin.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Admin.Addr); err != nil {
			return keyErr("admin.addr", "want host:port: %v", err)
		}
	}
	if c.Admin.Token != "" && len(c.Admin.Token) < MinTokenLength {
		if c.Admin.TokenFile != "" {
			return keyErr("admin.token_file", "the token in %s must be at least %d characters (got %d)", c.Admin.TokenFile, MinTokenLength, len(c.Admin.Token))
		}
		return keyErr("admin.token", "must be at least %d characters (got %d)", MinTokenLength, len(c.Admin.Token))
	}
	if c.Admin.Token != "" && strings.ContainsAny(c.Admin.Token, " \t\r\n") {
		return keyErr("admin.token", "must not contain whitespace (it is sent in an Authorization header)")
	}
	if c.Admin.Addr != "" && c.Admin.Token == "" && !c.Admin.AllowUnauthenticated && !loopbackOnly(c.Admin.Addr) {
		return keyErr("admin.token", "required when admin.addr (%s) is not a loopback address: set admin.token or admin.token_file, "+
			"or admin.allow_unauthenticated: true to serve the admin endpoint to anyone who reaches it", c.Admin.Addr)
	}
	if c.Admin.ProtectMetrics && c.Admin.Token == "" {
		return keyErr("admin.protect_metrics", "needs admin.token or admin.token_file")
	}
	if c.Admin.AdvertiseURL != "" {
		if err := checkURL("admin.advertise_url", c.Admin.AdvertiseURL, "http", "https"); err != nil {
			return err
		}
	}
	if len(c.Jetstream.URLs) == 0 {
		return keyErr("jetstream.urls", "must list at least one endpoint")
	}
	if err := checkList("jetstream.urls", c.Jetstream.URLs, sameEndpoint); err != nil {
		return err
	}
	for _, u := range c.Jetstream.URLs {
		if err := checkURL("jetstream.urls", u, "ws", "wss"); err != nil {
			return err
		}
		if err := checkJetstreamPath(u); err != nil {
			return err
		}
		if err := checkJetstreamQuery(u); err != nil {
			return err
		}
	}
	if len(c.Jetstream.Collections) == 0 {
		// Jetstream reads an absent wantedCollections as "everything": an
		// empty list would subscribe this instance to the whole firehose.
		return keyErr("jetstream.collections", "must list at least one NSID or prefix.* (an empty list subscribes to the whole firehose)")
	}
	if err := checkList("jetstream.collections", c.Jetstream.Collections, strings.TrimSpace); err != nil {
		return err
	}
	for _, col := range c.Jetstream.Collections {
		if !atproto.ValidNSIDPattern(col) {
			return keyErr("jetstream.collections", "%q is not an NSID or NSID prefix ending in .*", col)
		}
	}
	if n := len(c.Jetstream.Collections); n > maxWantedCollections {
		return keyErr("jetstream.collections", "%d collections: Jetstream accepts at most %d", n, maxWantedCollections)
	}
	// A key's floor is its own bound, so it comes before the rules relating
	// keys (health.timeout below health.check_interval); zero and negative
	// values are left to the "must be positive" cases below.
	for _, f := range durationFloors(c) {
		if f.got > 0 && f.got < f.min {
			return keyErr(f.key, "must be at least %s (%s), got %s", short(f.min), f.why, f.got)
		}
	}
	switch {
	case c.Jetstream.Rewind < 0:
		return keyErr("jetstream.rewind", "must not be negative")
	case c.Jetstream.StaleTimeout <= 0:
		return keyErr("jetstream.stale_timeout", "must be positive")
	case c.Jetstream.FailbackInterval < 0:
		return keyErr("jetstream.failback_interval", "must not be negative (0: never switch back)")
	case c.Jetstream.UnhealthyAfter <= 0:
		return keyErr("jetstream.unhealthy_after", "must be positive")
	case c.Jetstream.ResyncInterval < time.Millisecond:
		return keyErr("jetstream.resync_interval", "must be at least 1ms, got %v", c.Jetstream.ResyncInterval)
	case c.Jetstream.CommitBudget <= 0:
		return keyErr("jetstream.commit_budget", "must be positive, got %v", c.Jetstream.CommitBudget)
	case c.Jetstream.MaxMessageBytes < MinMaxMessageBytes:
		return keyErr("jetstream.max_message_bytes", "must be at least %d (1 KiB), got %d", MinMaxMessageBytes, c.Jetstream.MaxMessageBytes)
	case c.Jetstream.MaxMessageBytes > MaxMaxMessageBytes:
		return keyErr("jetstream.max_message_bytes", "must be at most %d (64 MiB), got %d", MaxMaxMessageBytes, c.Jetstream.MaxMessageBytes)
	case c.Backfill.Interval < 0:
		return keyErr("backfill.interval", "must not be negative")
	case c.Backfill.RerunAfter < 0:
		return keyErr("backfill.rerun_after", "must not be negative")
	case c.Backfill.Concurrency < 1:
		return keyErr("backfill.concurrency", "must be at least 1")
	case c.Cleanup.Interval <= 0:
		return keyErr("cleanup.interval", "must be positive")
	case c.Cleanup.ChunkRows < 1:
		return keyErr("cleanup.chunk_rows", "must be at least 1")
	case c.Labeler.StaleTimeout <= 0:
		return keyErr("labeler.stale_timeout", "must be positive, got %s", c.Labeler.StaleTimeout)
	case c.Billing.Timeout <= 0:
		return keyErr("billing.timeout", "must be positive")
	case c.Billing.DefaultTierRank < 0:
		return keyErr("billing.default_tier_rank", "must not be negative")
	case c.Health.Concurrency < 1:
		return keyErr("health.concurrency", "must be at least 1")
	// Each key's own bounds come before the rule relating them, so a
	// zero check_interval is reported as itself, not as a timeout too long.
	case c.Health.CheckInterval <= 0:
		return keyErr("health.check_interval", "must be positive, got %s", c.Health.CheckInterval)
	case c.Health.Timeout <= 0:
		return keyErr("health.timeout", "must be positive, got %s", c.Health.Timeout)
	case c.Health.Timeout >= c.Health.CheckInterval:
		return keyErr("health.timeout", "must be below health.check_interval (%s), got %s", c.Health.CheckInterval, c.Health.Timeout)
	case c.Webhooks.Concurrency < 1:
		return keyErr("webhooks.concurrency", "must be at least 1, got %d", c.Webhooks.Concurrency)
	case c.Cleanup.Retention <= 0:
		return keyErr("cleanup.retention", "must be positive")
	case c.Billing.Interval <= 0:
		return keyErr("billing.interval", "must be positive")
	case len(c.Webhooks.RetrySchedule) == 0:
		return keyErr("webhooks.retry_schedule", "must list at least one delay (the first attempt)")
	case c.Webhooks.Timeout <= 0:
		return keyErr("webhooks.timeout", "must be positive")
	}
	for _, d := range c.Webhooks.RetrySchedule {
		if d < 0 {
			return keyErr("webhooks.retry_schedule", "delays must not be negative")
		}
	}
	if err := checkURL("webhooks.public_url", c.Webhooks.PublicURL, "http", "https"); err != nil {
		return err
	}
	if err := checkList("backfill.relay_endpoints", c.Backfill.RelayEndpoints, sameEndpoint); err != nil {
		return err
	}
	if c.Backfill.Enabled && len(c.Backfill.RelayEndpoints) == 0 {
		return keyErr("backfill.relay_endpoints", "must list at least one relay when backfill.enabled is true")
	}
	// URLs are checked whether or not their worker is on: a URL that is
	// wrong (or carries credentials) is wrong before the day it is used.
	for _, u := range c.Backfill.RelayEndpoints {
		if err := checkURL("backfill.relay_endpoints", u, "http", "https"); err != nil {
			return err
		}
	}
	if err := checkURL("identity.plc_url", c.Identity.PLCURL, "http", "https"); err != nil {
		return err
	}
	if c.Identity.HandleWellKnownURL != "" {
		if err := checkURL("identity.handle_well_known_url", c.Identity.HandleWellKnownURL, "http", "https"); err != nil {
			return err
		}
	}
	if c.Labeler.URL != "" {
		if err := checkURL("labeler.url", c.Labeler.URL, "http", "https", "ws", "wss"); err != nil {
			return err
		}
	}
	if c.Billing.Enabled && c.Billing.StripeSecretKey == "" {
		return keyErr("billing.stripe_secret_key", "required when billing.enabled is true")
	}
	if c.Billing.Enabled || c.Billing.StripeAPIURL != "" {
		if err := checkURL("billing.stripe_api_url", c.Billing.StripeAPIURL, "http", "https"); err != nil {
			return err
		}
	}
	return nil
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
	return []durationFloor{
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
	}
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
