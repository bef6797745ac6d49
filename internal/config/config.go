// Package config defines the appview configuration (docs/spec.md §3): its defaults,
// strict YAML loading, APPVIEW_* environment overrides and validation.
//
// Precedence, lowest to highest: built-in defaults, the YAML file, the
// environment, then flags (--set key=value). Every error names the key it is
// about, as a *Error, so the command line can print one line and exit 2.
package config

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Config is the whole configuration tree. YAML keys are the `yaml` tags;
// the environment variable for a key is APPVIEW_ + its dotted path in upper
// case with "_" for ".", e.g. APPVIEW_LEASES_TTL. A key tagged
// `secret:"true"` is never shown (Show).
type Config struct {
	// InstanceID names this process in lease rows (leases.holder) and logs.
	// Empty means <hostname>-<pid>-<random>, unique per process start.
	InstanceID string `yaml:"instance_id"`
	// ShutdownTimeout bounds a graceful stop: workers drain, leases released.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// LogLevel is the least level logged: debug, info, warn or error.
	LogLevel string `yaml:"log_level"`

	Database  Database  `yaml:"database"`
	Admin     Admin     `yaml:"admin"`
	Leases    Leases    `yaml:"leases"`
	Jetstream Jetstream `yaml:"jetstream"`
	Backfill  Backfill  `yaml:"backfill"`
	Identity  Identity  `yaml:"identity"`
	Labeler   Labeler   `yaml:"labeler"`
	Cleanup   Cleanup   `yaml:"cleanup"`
	Billing   Billing   `yaml:"billing"`
	Health    Health    `yaml:"health"`
	Webhooks  Webhooks  `yaml:"webhooks"`
	Network   Network   `yaml:"network"`

	// Workers are the sections of the workers registered with keys of
	// their own (Sources.Workers), in registration order, each after the
	// built-in sections in the file: <section>.enabled and
	// <section>.interval. Load fills them; Default has none. (A copy of
	// a Config shares them: read them, or Load another.)
	Workers []WorkerConfig `yaml:"-"`
}

// Network configures outbound requests to hosts that network data names
// (hold endpoints, did:web documents, PDS endpoints from DID documents).
type Network struct {
	// AllowPrivate lets those requests reach loopback, private, link-local
	// (cloud metadata) and other non-public addresses, which the outbound
	// guard (internal/outbound) otherwise refuses at dial time. For a
	// closed network or a test bed; it also permits them for webhooks.
	AllowPrivate bool `yaml:"allow_private"`
}

// Database selects the libSQL database every instance shares.
type Database struct {
	// URL is file:PATH (embedded: file:rel/path, file:/abs/path,
	// file:///abs/path or file://localhost/abs/path), http://HOST:PORT
	// (sqld) or libsql://HOST (Turso). Other file hosts and in-memory
	// databases are refused (package database/dburl says why).
	URL string `yaml:"url"`
	// AuthToken is sent to a libSQL server; unused for file databases.
	AuthToken string `yaml:"auth_token" secret:"true"`
	// BusyTimeout is how long a file-database connection waits on a lock
	// before SQLITE_BUSY (PRAGMA busy_timeout, set on every connection).
	BusyTimeout time.Duration `yaml:"busy_timeout"`
}

// Admin is the operator HTTP endpoint (docs/spec.md §7).
type Admin struct {
	// Addr is host:port for /healthz /readyz /metrics /debug/*. Empty disables
	// it (and with it the nudges that make graceful handover fast). Port 0
	// picks a free port.
	Addr string `yaml:"addr"`
	// AdvertiseURL is how other instances reach this endpoint (for lease
	// nudges), e.g. http://10.0.0.5:5001. Empty: derived from Addr.
	AdvertiseURL string `yaml:"advertise_url"`
	// Token is the shared secret of the admin endpoint: /lease/nudge,
	// /debug/* and the status page answer 401 to a request without
	// "Authorization: Bearer <Token>", and nudges between instances carry
	// it (every instance of a fleet needs the same one). Empty: no token.
	Token string `yaml:"token" secret:"true"`
	// TokenFile reads Token from a file (a secrets mount); surrounding
	// whitespace is trimmed. Set Token or TokenFile, not both.
	TokenFile string `yaml:"token_file"`
	// ProtectMetrics puts /metrics behind the token too (default open, so
	// a scraper needs no secret). /healthz and /readyz are always open.
	ProtectMetrics bool `yaml:"protect_metrics"`
	// AllowUnauthenticated lets Addr be a non-loopback address without a
	// token. Without it such a configuration is refused at start: anyone
	// who reaches the port could trigger acquires and read /debug/*.
	AllowUnauthenticated bool `yaml:"allow_unauthenticated"`
	// Pprof mounts net/http/pprof under /debug/pprof/ (behind the token).
	Pprof bool `yaml:"pprof"`
}

// MaxConfigFileBytes bounds the --config file (1 MiB; the commented
// default configuration is under 20 KiB): a file that never ends
// (/dev/zero, a runaway generator behind a pipe) is refused once this much
// is read instead of filling memory.
const MaxConfigFileBytes = 1 << 20

// MaxTokenFileBytes bounds admin.token_file: a token is a line, not a file
// of megabytes (a wrong path, e.g. a log file, is refused rather than read).
const MaxTokenFileBytes = 4 << 10

// Bounds on the lease timings, enforced by Validate (exit 2 at start).
//
// A TTL below MinLeaseTTL is shorter than one slow renewal (an fsync, a GC
// pause, a round trip to sqld), so custody would flap between instances;
// above MaxLeaseTTL a crashed holder's workers stay stopped for hours. A
// renewal or retry more often than every 50 ms is a write (or a read)
// hammering the shared database for no gain in handover time, and a
// renew deadline under 100 ms gives up a lease on ordinary latency. A
// retry interval above the TTL would leave an expired lease unclaimed for
// longer than the TTL it was meant to bound.
const (
	MinLeaseTTL           = 500 * time.Millisecond
	MaxLeaseTTL           = time.Hour
	MinLeaseRenewInterval = 50 * time.Millisecond
	MinLeaseRenewDeadline = 100 * time.Millisecond
	MinLeaseRetryInterval = 50 * time.Millisecond
)

// MinBusyTimeout is the least database.busy_timeout Validate accepts. A
// file connection waits this long for a lock another connection holds
// before its statement fails with SQLITE_BUSY; below it an ordinary commit
// of another instance (a consumer batch holds the lock for milliseconds)
// fails lease renewals and fenced writes that only had to wait, and 0
// (or anything under PRAGMA busy_timeout's millisecond) makes every lock
// a failure. The consumer's commit budget is also capped at half of it.
const MinBusyTimeout = 10 * time.Millisecond

// Leases tunes the named leases (docs/spec.md §4). Invariants: MinLeaseTTL <= TTL
// <= MaxLeaseTTL, MinLeaseRenewInterval <= RenewInterval < TTL/2,
// RenewInterval < RenewDeadline < TTL with RenewDeadline >=
// MinLeaseRenewDeadline, MinLeaseRetryInterval <= RetryInterval <= TTL.
type Leases struct {
	// Enabled false runs every worker unconditionally (single instance only).
	Enabled bool `yaml:"enabled"`
	// TTL is how long a grant lasts without renewal, on the database's clock.
	TTL time.Duration `yaml:"ttl"`
	// RenewInterval is how often the holder renews.
	RenewInterval time.Duration `yaml:"renew_interval"`
	// RenewDeadline is how long the holder keeps its worker running without a
	// successful renewal (measured locally from the start of the last
	// successful attempt) before it declares the lease lost. On a libSQL
	// server keep it at 6 s or more: sqld rolls back a stalled writer's
	// transaction only after about 5 s, and until then every instance's
	// renewal waits on that writer's lock (serve warns below 6 s).
	RenewDeadline time.Duration `yaml:"renew_deadline"`
	// RetryInterval is how often a contender retries, with jitter.
	RetryInterval time.Duration `yaml:"retry_interval"`
	// YieldGrace is how long a holder's worker must have reported itself
	// unhealthy, while some contender reports healthy, before the holder
	// releases the lease to it (health-aware custody). 0 never yields.
	YieldGrace time.Duration `yaml:"yield_grace"`
	// MinHold is how long a holder keeps a lease before it may yield it,
	// whatever its worker's health: with the grace, what keeps custody
	// from flapping between two instances whose health flickers.
	MinHold time.Duration `yaml:"min_hold"`
}

// Timing is the lease timing these keys configure.
func (l Leases) Timing() Timing {
	return Timing{TTL: l.TTL, RenewInterval: l.RenewInterval, RenewDeadline: l.RenewDeadline, RetryInterval: l.RetryInterval}
}

// Bounds on jetstream.max_message_bytes, enforced by Validate. Below 1 KiB
// ordinary commit events would not fit; above 64 MiB one frame (read
// whole into memory before it is decoded) could take an instance's memory.
// Jetstream frames are a few KiB; the default is 2 MiB.
const (
	MinMaxMessageBytes = 1 << 10
	MaxMaxMessageBytes = 64 << 20
)

// DefaultJetstreamURLs are Bluesky's public Jetstream v2 hosts on the v2
// wire (launched August 2026), then one frozen v1 host on the legacy wire
// as a last resort (it resumes by time only).
func DefaultJetstreamURLs() []string {
	return []string{
		"wss://jetstream.us-east.bsky.network/xrpc/network.bsky.jetstream.subscribeEvents",
		"wss://jetstream.us-west.bsky.network/xrpc/network.bsky.jetstream.subscribeEvents",
		"wss://jetstream2.us-east.bsky.network/subscribe",
	}
}

// Jetstream configures the consumer (docs/spec.md §6).
type Jetstream struct {
	// URLs are Jetstream endpoints, tried in order. The path selects the
	// wire: /xrpc/network.bsky.jetstream.subscribeEvents the v2 wire, a
	// path ending in /subscribe the legacy one; both may be mixed, and any
	// other path is refused (checkJetstreamPath). An
	// empty element, or one endpoint listed twice (compared as
	// sameEndpoint does: case of scheme and host and a trailing slash
	// ignored), is refused.
	URLs []string `yaml:"urls"`
	// Collections are NSIDs or "prefix.*" wildcards (wantedCollections on
	// the legacy wire, collections on v2). An empty element or one listed
	// twice is refused.
	Collections []string `yaml:"collections"`
	// Compress asks for zstd-compressed binary frames (compress=true on the
	// legacy wire; the host's getZstdDictionary on v2).
	Compress bool `yaml:"compress"`
	// Rewind is the margin of a resume by time: on a host other than the
	// one the stored position came from (or a position stored before
	// per-host positions), the consumer resumes from the position's shared
	// time (commit rev / relay time) less this; on a host without sequence
	// numbers (Jetstream v1), from that host's time_us less this after a
	// restart. A resume by sequence number on the same host never rewinds.
	Rewind time.Duration `yaml:"rewind"`
	// StaleTimeout leaves a host that sent no event for this long (pings
	// and pongs do not count) for the next configured one.
	StaleTimeout time.Duration `yaml:"stale_timeout"`
	// FailbackInterval: while on any URL but the first, the consumer
	// probes the earlier ones this often and switches back to the first
	// that takes a connection and sends a frame within StaleTimeout. 0
	// never switches back (a host that delivers is kept).
	FailbackInterval time.Duration `yaml:"failback_interval"`
	// UnhealthyAfter: the consumer reports itself unhealthy (workers.Health,
	// read by the lease runtime) when no upstream delivered an event for
	// this long: none reachable, or every one silent.
	UnhealthyAfter time.Duration `yaml:"unhealthy_after"`
	// ResyncInterval spaces the re-reads of repositories from their PDS
	// (a #sync event queues one, and so may an #account or #identity
	// event, or a gap): at most one per interval, so a burst of them
	// cannot flood PDSes or hold the database.
	ResyncInterval time.Duration `yaml:"resync_interval"`
	// MaxMessageBytes is the websocket read limit per frame, in bytes,
	// MinMaxMessageBytes..MaxMaxMessageBytes.
	MaxMessageBytes int64 `yaml:"max_message_bytes"`
	// CommitBudget bounds how long one consumer transaction applies
	// events while it holds the database's write lock: past it, the
	// consumer commits the events applied so far (and their position) and
	// goes on with the rest of the batch in a next transaction, so a lease
	// renewal waits at most about this long behind it (docs/lease.md).
	// Checked every 25 events. Positive. The consumer uses at
	// most half of database.busy_timeout and, with leases enabled, half of
	// leases.renew_deadline - leases.renew_interval
	// (consumer.EffectiveCommitBudget).
	CommitBudget time.Duration `yaml:"commit_budget"`
}

// Backfill configures the backfill worker.
type Backfill struct {
	Enabled bool `yaml:"enabled"`
	// Interval 0 runs once when first granted, then holds the lease; >0 is periodic.
	Interval time.Duration `yaml:"interval"`
	// RerunAfter: with Interval 0, a new holder skips a run completed more recently.
	RerunAfter time.Duration `yaml:"rerun_after"`
	// RelayEndpoints serve com.atproto.sync.listReposByCollection, tried
	// in order. An empty element, or one endpoint listed twice (as for
	// Jetstream.URLs), is refused.
	RelayEndpoints []string `yaml:"relay_endpoints"`
	// Concurrency bounds how many repositories are fetched at once.
	Concurrency int `yaml:"concurrency"`
}

// Identity configures DID resolution.
type Identity struct {
	// PLCURL is the did:plc directory.
	PLCURL string `yaml:"plc_url"`
	// HandleWellKnownURL, when set, verifies every handle with
	// GET {url}/.well-known/atproto-did (Host: the handle) instead of DNS
	// and https://<handle>: for a local chain whose PDS serves handles no
	// DNS knows (docs/interop.md). Empty (the default) in production.
	HandleWellKnownURL string `yaml:"handle_well_known_url"`
}

// Labeler configures the labeler subscriber.
type Labeler struct {
	// URL of the labeler service; empty disables it. Either its base URL
	// with no path (https://HOST, wss://HOST: the subscriber appends
	// /xrpc/com.atproto.label.subscribeLabels) or the full endpoint, whose
	// path ends in /xrpc/com.atproto.label.subscribeLabels (a prefix before
	// it is kept). Any other path is refused at start (actors/labeler
	// SubscribeURL): it would be dialled as given and answer 404 forever.
	URL string `yaml:"url"`
	// StaleTimeout reconnects when neither a frame nor a pong to our pings
	// has arrived for this long (pings go out every StaleTimeout/3), so a
	// quiet labeler is not mistaken for a dead connection.
	StaleTimeout time.Duration `yaml:"stale_timeout"`
}

// Cleanup configures the periodic cleanup sweep (lease "cleanup").
type Cleanup struct {
	Interval time.Duration `yaml:"interval"`
	// Retention is how long finished webhook deliveries and backfill runs are kept.
	Retention time.Duration `yaml:"retention"`
	// ChunkRows bounds how many rows one delete transaction removes, so a
	// large backlog never holds the database's write lock for long.
	ChunkRows int `yaml:"chunk_rows"`
}

// Billing configures the billing tier refresh.
type Billing struct {
	Enabled  bool          `yaml:"enabled"`
	Interval time.Duration `yaml:"interval"`
	// StripeSecretKey authenticates to the Stripe API (the billing source).
	StripeSecretKey string `yaml:"stripe_secret_key" secret:"true"`
	// StripeAPIURL is the Stripe API base URL.
	StripeAPIURL string `yaml:"stripe_api_url"`
	// Timeout bounds one HTTP request to Stripe or to a hold.
	Timeout time.Duration `yaml:"timeout"`
	// DefaultTierRank is pushed to a hold for a user who has no active
	// subscription any more but was earlier pushed another rank.
	DefaultTierRank int `yaml:"default_tier_rank"`
}

// Health configures the hold health checker (runs on every instance).
type Health struct {
	CheckInterval time.Duration `yaml:"check_interval"`
	// Timeout bounds one GET /xrpc/_health; it must be below CheckInterval.
	Timeout time.Duration `yaml:"timeout"`
	// Concurrency bounds how many holds are checked at once.
	Concurrency int `yaml:"concurrency"`
}

// Webhooks configures webhook delivery (docs/spec.md §9).
type Webhooks struct {
	// AllowPrivate permits URLs that resolve to loopback/private/link-local addresses.
	AllowPrivate bool `yaml:"allow_private"`
	// RetrySchedule is the delay before each attempt; its length is the
	// attempt count. An empty element is refused; a delay may repeat
	// (0s, 30s, 30s spaces two retries alike).
	RetrySchedule []time.Duration `yaml:"retry_schedule"`
	// Timeout bounds one delivery attempt (docs/spec.md §9: 10 s).
	Timeout time.Duration `yaml:"timeout"`
	// Concurrency bounds how many deliveries are in flight at once.
	Concurrency int `yaml:"concurrency"`
	// PublicURL is the registry's public base URL; payloads link to
	// <PublicURL>/r/<namespace>/<repository>.
	PublicURL string `yaml:"public_url"`
}

// Default returns the built-in configuration (docs/spec.md §3). InstanceID is left
// empty; Load fills it.
func Default() Config {
	return Config{
		ShutdownTimeout: 30 * time.Second,
		LogLevel:        "info",
		Database: Database{
			URL:         "file:./data/appview.db",
			BusyTimeout: 5 * time.Second,
		},
		Admin: Admin{Addr: "127.0.0.1:5001"},
		Leases: Leases{
			Enabled:       true,
			TTL:           15 * time.Second,
			RenewInterval: 5 * time.Second,
			RenewDeadline: 10 * time.Second,
			RetryInterval: 2 * time.Second,
			YieldGrace:    30 * time.Second,
			MinHold:       time.Minute,
		},
		Jetstream: Jetstream{
			URLs:             DefaultJetstreamURLs(),
			Collections:      []string{"io.atcr.*"},
			Compress:         true,
			Rewind:           30 * time.Second,
			StaleTimeout:     30 * time.Second,
			FailbackInterval: 5 * time.Minute,
			UnhealthyAfter:   90 * time.Second,
			ResyncInterval:   time.Second,
			MaxMessageBytes:  2 << 20,
			CommitBudget:     250 * time.Millisecond,
		},
		Backfill: Backfill{
			Enabled:        true,
			RerunAfter:     24 * time.Hour,
			RelayEndpoints: []string{"https://relay1.us-east.bsky.network"},
			Concurrency:    4,
		},
		Identity: Identity{PLCURL: "https://plc.directory"},
		Labeler:  Labeler{StaleTimeout: 60 * time.Second},
		Cleanup:  Cleanup{Interval: time.Hour, Retention: 30 * 24 * time.Hour, ChunkRows: 500},
		Billing: Billing{
			Interval:     time.Hour,
			StripeAPIURL: "https://api.stripe.com",
			Timeout:      10 * time.Second,
		},
		Health: Health{CheckInterval: 15 * time.Second, Timeout: 5 * time.Second, Concurrency: 8},
		Webhooks: Webhooks{
			RetrySchedule: []time.Duration{0, 30 * time.Second, 2 * time.Minute, 8 * time.Minute},
			Timeout:       10 * time.Second,
			Concurrency:   4,
			PublicURL:     "https://atcr.io",
		},
	}
}

// Error is a configuration problem about one key.
type Error struct {
	// Key is the dotted YAML path, e.g. "leases.ttl".
	Key string
	// Reason says what is wrong, in words an operator can act on.
	Reason string
}

func (e *Error) Error() string { return fmt.Sprintf("config: %s: %s", e.Key, e.Reason) }

func keyErr(key, format string, args ...any) *Error {
	return &Error{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// NewInstanceID returns <hostname>-<pid>-<6 random hex digits>. A
// character of the hostname that an instance_id may not hold (see
// MaxInstanceIDBytes) becomes "-", and the hostname is cut to 64 bytes,
// so that the id is always valid.
func NewInstanceID() string {
	host, err := os.Hostname()
	if err != nil {
		host = ""
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", idHost(host), os.Getpid(), hex.EncodeToString(b[:]))
}

// idHost is the hostname part of a generated instance_id: the hostname
// with every character an instance_id may not hold replaced by "-", cut
// to 64 bytes; "appview" when there is none.
func idHost(host string) string {
	host = strings.Map(func(r rune) rune {
		if !instanceIDRune(r) {
			return '-'
		}
		return r
	}, strings.ToValidUTF8(host, "-"))
	for len(host) > 64 {
		_, n := utf8.DecodeLastRuneInString(host)
		host = host[:len(host)-n]
	}
	if host == "" {
		return "appview"
	}
	return host
}

// MaxInstanceIDBytes bounds instance_id. The id is written into every
// lease row, contender row and log line, shown on the status page and in
// the columns of `appview leases`; a generated one (NewInstanceID) is at
// most about 80 bytes. An instance_id must also be valid UTF-8 without
// whitespace, control or format (invisible) characters: those would
// break the columns, hide two different ids behind one look, or carry
// terminal escape sequences. Any other character is allowed ("web-1",
// "appview.eu-west_2", "host:5001").
const MaxInstanceIDBytes = 128

// instanceIDRune reports whether r may appear in an instance_id.
func instanceIDRune(r rune) bool {
	return r != utf8.RuneError && !unicode.IsSpace(r) && !unicode.IsControl(r) && !unicode.Is(unicode.Cf, r)
}

// checkInstanceID refuses an instance_id that breaks the rules of
// MaxInstanceIDBytes ("" is fine: Load generates one).
func checkInstanceID(id string) error {
	if len(id) > MaxInstanceIDBytes {
		return keyErr("instance_id", "%d bytes: must be at most %d (it is written into every lease row and log line)", len(id), MaxInstanceIDBytes)
	}
	if !utf8.ValidString(id) {
		return keyErr("instance_id", "%q is not valid UTF-8", id)
	}
	for i, r := range id {
		if !instanceIDRune(r) {
			return keyErr("instance_id", "%q has a whitespace, control or invisible character (%U at byte %d); use e.g. letters, digits, '-', '.', '_'", id, r, i)
		}
	}
	return nil
}
