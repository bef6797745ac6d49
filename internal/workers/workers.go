// Package workers is what a worker package imports to register with the
// runtime: the shared resources it is given (Deps), the description it
// returns (Spec) and the sentinels both sides agree on. It sits below
// system/ (which wires workers) and actors/* (which implement them), so a
// worker never imports the package that runs it.
package workers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/identity"
	"github.com/atcr-io/appview/internal/outbound"
)

// ErrDisabled is wrapped by a worker constructor whose worker is turned off
// by configuration (e.g. labeler.url empty, billing.enabled false): serve
// leaves that worker out instead of refusing to start.
var ErrDisabled = errors.New("worker disabled by configuration")

// Drain is the message a LeaseActor sends its worker actor just before a
// graceful stop (it is then
// poisoned). Custody is still held and renewed while the worker handles
// it, so a worker with work in flight (a request whose outcome must be
// recorded) should finish that work, bounded, before returning: its fenced
// writes still land. On a loss of custody no Drain is sent: the worker is
// stopped at once.
type Drain struct{}

// DrainBudget is the most a worker may spend on a Drain: the LeaseActor
// waits 10 s for its worker to stop (actors/lease, "Every stop of the
// worker is bounded"), then reports it stuck and moves on, and an actor
// still stopping holds the whole instance's stop up past
// shutdown_timeout. The 2 s left are for the worker's own stop.
const DrainBudget = 8 * time.Second

// ErrDrain is the cause (context.Cause) of a job's context when its
// worker is stopped gracefully: the LeaseActor sent Drain, and
// custody stays held and renewed until the job returns. A job must start
// nothing new, but it may let the one request it has in flight finish and
// record its outcome under that custody (within jobStopTimeout), when the
// peer acts on the request whether or not the job waits for the answer:
// otherwise the next holder repeats it. Any other cause (context.Canceled:
// custody lost, or a restart) means stop at once.
var ErrDrain = errors.New("worker draining for a graceful stop")

// Deps is what a worker package gets when it registers: shared, process-wide
// resources. Build collectors and clients once from Deps at registration;
// the worker's actor is built anew for every grant of custody.
type Deps struct {
	Config config.Config
	// DB is the shared database pool (go-libsql ignores contexts: bound calls
	// with database.Bounded where a hang matters).
	DB *database.DB
	// Log is the process logger (JSON on stderr).
	Log zerolog.Logger
	// Metrics registers the worker's Prometheus collectors (served at /metrics).
	Metrics prometheus.Registerer
	// Admin lets a worker add read-only debug handlers (e.g. /debug/holds).
	Admin *http.ServeMux
	// Instance is this process's instance_id.
	Instance string
	// Identity resolves DIDs (shared, so its cache is shared); nil means
	// one is built from Config on first use by Resolver.
	Identity *identity.Resolver
}

// Resolver is the process's DID resolver (Deps.Identity, or a new one for
// identity.plc_url when Deps was built without it, as in tests), its
// requests through the outbound guard (NewResolver).
func (d Deps) Resolver() *identity.Resolver {
	if d.Identity != nil {
		return d.Identity
	}
	return NewResolver(d.Config)
}

// HandleResolver is the process's resolver for verifying handles (it
// satisfies processor.HandleResolver), or nil when Deps was built without one:
// unlike Resolver it builds none, so tests and tools that set no
// Identity make no handle lookups and keep the handle events carry.
func (d Deps) HandleResolver() interface {
	Handle(ctx context.Context, did string) (string, error)
	RefreshHandle(ctx context.Context, did string) (string, error)
} {
	if d.Identity == nil {
		return nil // a nil *Resolver in the interface would not be nil
	}
	return d.Identity
}

// NewResolver builds a DID resolver for cfg whose requests pass the
// outbound guard: the PLC directory (identity.plc_url) is the operator's
// choice and trusted by name; a did:web host is network data and may not
// be a non-public address unless network.allow_private.
func NewResolver(cfg config.Config) *identity.Resolver {
	g := Outbound(cfg, "DID resolution").TrustURLs(cfg.Identity.PLCURL, cfg.Identity.HandleWellKnownURL)
	return &identity.Resolver{PLCURL: cfg.Identity.PLCURL, HandleWellKnownURL: cfg.Identity.HandleWellKnownURL, HTTP: g.Client(identity.DefaultTimeout)}
}

// Outbound is the guard for requests to hosts that network data names
// (holds, did:web, PDSes), as network.allow_private sets it; purpose
// names the requests in refusals.
func Outbound(cfg config.Config, purpose string) outbound.Guard {
	return outbound.Guard{AllowPrivate: cfg.Network.AllowPrivate, Purpose: purpose}
}

// Spec describes one background worker to the registry. Exactly one of
// Actor and Job is set.
//
// How a Job runs (system/job.go runs it; docs/architecture.md, "Adding a
// worker"):
//
//   - First run at grant: Job starts as soon as custody is granted (for
//     an unleased worker, at start), in its own goroutine, then again
//     Interval after the start of each run. Runs never overlap: a run
//     longer than Interval is followed at once by the next.
//   - An error is logged ("job failed") and waits for the next tick; with
//     Interval 0 the run is retried with exponential backoff (up to a
//     minute apart) until one succeeds.
//   - A panic is a worker failure: the worker is restarted in place with
//     backoff (worker.restarted); more than five failures a minute give
//     the lease up for another instance to try (worker.failed).
//   - An error wrapping fence.ErrSuperseded (a fence.Fenced write that
//     found another holder) stops the worker for good: custody has moved
//     on, and it is never restarted under this grant.
//   - Interval 0 runs Job once and then holds the lease idle until custody
//     ends, so the job runs once per deployment, not once per instance.
//   - ctx is cancelled when custody ends. On a graceful stop the worker
//     first gets Drain: ctx's cause (context.Cause) is then ErrDrain, and
//     the one request in flight may finish and record its outcome, its
//     fenced writes still landing; any other cause means stop at once.
//     A Job that has not returned 5 s after ctx is cancelled is abandoned
//     (its context is cancelled, so its fenced writes cannot land).
//
// Every write a leased Job makes goes through fence.Fenced with its
// custody, so that it commits only while this instance holds the lease.
type Spec struct {
	// Name identifies the worker; for a leased worker it is also the lease
	// name (docs/spec.md §4). Lowercase letters, digits and dashes.
	Name string
	// Leased workers run only on the instance that holds the lease Name;
	// unleased workers run on every instance.
	Leased bool
	// Actor builds the worker actor for one grant of custody. It is spawned
	// as the child of the worker's LeaseActor (an unleased worker has one
	// too, which grants itself custody with fence 0) and stopped when
	// custody ends; it must stop writing when it stops.
	Actor func(c fence.Custody) *actor.Props
	// Job is run every Interval while custody lasts, as the type's comment
	// says; the worker stops only after Job returns.
	Job func(ctx context.Context, c fence.Custody) error
	// Interval between the starts of Job runs. 0 runs Job once and then
	// holds custody idle until it ends (e.g. a startup backfill). A worker
	// registered with Keys leaves it 0: the runtime sets it from
	// <section>.interval.
	Interval time.Duration
	// Health, when set, is the worker's own health report (see Health):
	// a leased worker that reports unhealthy while a contender reports
	// healthy yields its lease. nil: always healthy.
	Health *Health
}

// Keys declare a worker's own configuration section, <Section>.enabled
// and <Section>.interval, with their defaults and the interval's floor
// (config.WorkerKeys): the configuration loader reads, checks and
// documents them, and the runtime applies them (Registration.Build).
type Keys = config.WorkerKeys

// Registration is one line of the list of workers `serve` runs
// (cmd/appview/workers.go): the worker's constructor and, for a worker
// that owns a configuration section, its Keys.
type Registration struct {
	// New builds the worker's Spec from the process's Deps, once per
	// process. An error wrapping ErrDisabled leaves the worker out; any
	// other refuses the start (a *config.Error exits 2).
	New func(Deps) (Spec, error)
	// Keys, when Keys.Section is set, make <Section>.enabled and
	// <Section>.interval keys of the configuration. The worker is then
	// left out while <Section>.enabled is false (New is not called), and
	// its Job runs every <Section>.interval: New leaves Spec.Interval 0.
	Keys Keys
}

// Build returns the Spec of the registered worker for d (see
// Registration). A worker with Keys whose section d.Config lacks (its
// Keys were not given to config.Load) is an error.
func (r Registration) Build(d Deps) (Spec, error) {
	section := r.Keys.Section
	if section == "" {
		return r.New(d)
	}
	w, ok := d.Config.Worker(section)
	switch {
	case !ok:
		return Spec{}, fmt.Errorf("worker section %s: not in the configuration (give the registered Keys to config.Load)", section)
	case !w.Enabled:
		return Spec{}, fmt.Errorf("%s.enabled is false: %w", section, ErrDisabled)
	}
	s, err := r.New(d)
	switch {
	case err != nil:
		return Spec{}, err
	case s.Job == nil:
		return Spec{}, fmt.Errorf("worker %q: Keys need a Job (%s.interval is how often it runs)", s.Name, section)
	case s.Interval != 0:
		return Spec{}, fmt.Errorf("worker %q sets Interval; with Keys it comes from %s.interval", s.Name, section)
	}
	s.Interval = w.Interval
	return s, nil
}

// Health is a worker's own report of whether it can do its job where it
// runs (the consumer: some upstream reachable and sending). The worker
// sets it; its LeaseActor reads it to decide whether to yield custody to
// a healthier contender, and publishes it in lease_contenders. The zero
// value is healthy. Safe for concurrent use.
type Health struct {
	mu        sync.Mutex
	unhealthy bool
	since     time.Time
	reason    string
	source    Source
}

// Source is what a worker that reads from another host says of the one
// it reads (the consumer: its Jetstream host), beside its health: for
// /debug/leases and the status page.
type Source struct {
	URL  string `json:"url,omitempty"`
	Wire string `json:"wire,omitempty"`
	// State is the connection's: connecting, connected, backoff.
	State string `json:"state,omitempty"`
	// LastError is why the last connection ended.
	LastError string `json:"last_error,omitempty"`
	// LastEvent is when the worker last received something (zero: never).
	LastEvent time.Time `json:"last_event,omitzero"`
}

// Set records the worker's current health; reason says why it is
// unhealthy (ignored when ok). The time of the last change is kept. It
// reports whether ok differs from the state before: the worker logs each
// change once, not every time it re-evaluates.
func (h *Health) Set(ok bool, reason string) (changed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ok {
		if h.unhealthy {
			h.unhealthy, h.since, h.reason = false, time.Now(), ""
			return true
		}
		return false
	}
	h.reason = reason
	if !h.unhealthy {
		h.unhealthy, h.since = true, time.Now()
		return true
	}
	return false
}

// SetSource records where the worker reads from now.
func (h *Health) SetSource(s Source) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.source = s
}

// Source returns what SetSource last recorded (zero for a nil Health or
// a worker that reads from no other host).
func (h *Health) Source() Source {
	if h == nil {
		return Source{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.source
}

// Status reports whether the worker is healthy, since when it has been in
// that state (zero if it never changed) and, when unhealthy, why. A nil
// Health is healthy.
func (h *Health) Status() (ok bool, since time.Time, reason string) {
	if h == nil {
		return true, time.Time{}, ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.unhealthy, h.since, h.reason
}
