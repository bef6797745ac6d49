package system

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"regexp"
	"time"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/identity"
)

// Deps is what a worker package gets when it registers: shared, process-wide
// resources. Build collectors and clients once from Deps at registration;
// the worker's actor is built anew for every grant of custody.
type Deps struct {
	Config config.Config
	// DB is the shared database pool (go-libsql ignores contexts: bound calls
	// with database.Bounded where a hang matters).
	DB *sql.DB
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
// identity.plc_url when Deps was built without it, as in tests).
func (d Deps) Resolver() *identity.Resolver {
	if d.Identity != nil {
		return d.Identity
	}
	return &identity.Resolver{PLCURL: d.Config.Identity.PLCURL}
}

// Worker describes one background worker to the registry. Exactly one of
// Actor and Job is set.
type Worker struct {
	// Name identifies the worker; for a leased worker it is also the lease
	// name (SPEC §4). Lowercase letters, digits and dashes.
	Name string
	// Leased workers run only on the instance that holds the lease Name;
	// unleased workers run on every instance.
	Leased bool
	// Actor builds the worker actor for one grant of custody. It is spawned
	// as the child of the worker's LeaseActor (or unleased supervisor) and
	// stopped when custody ends; it must stop writing when it stops.
	Actor func(c fence.Custody) *actor.Props
	// Job is run every Interval while custody lasts, in its own goroutine;
	// ctx is cancelled when custody ends and the worker stops only after Job
	// returns. An error is logged and the job runs again at the next tick; a
	// panic is a worker failure (restart with backoff).
	Job func(ctx context.Context, c fence.Custody) error
	// Interval between the starts of Job runs. 0 runs Job once and then
	// holds custody idle until it ends (e.g. a startup backfill).
	Interval time.Duration
}

var workerName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// Registry is the extension point: every registered worker is started by
// `appview serve`.
type Registry struct {
	workers []Worker
}

// Register adds a worker. It returns an error for an invalid or duplicate
// registration (a programming error: serve refuses to start).
func (r *Registry) Register(w Worker) error {
	switch {
	case !workerName.MatchString(w.Name):
		return fmt.Errorf("register worker %q: name must match %s", w.Name, workerName)
	case (w.Actor == nil) == (w.Job == nil):
		return fmt.Errorf("register worker %q: set exactly one of Actor and Job", w.Name)
	case w.Interval < 0:
		return fmt.Errorf("register worker %q: negative interval", w.Name)
	case w.Actor != nil && w.Interval != 0:
		return fmt.Errorf("register worker %q: Interval applies to Job workers only", w.Name)
	}
	for _, have := range r.workers {
		if have.Name == w.Name {
			return fmt.Errorf("register worker %q: already registered", w.Name)
		}
	}
	r.workers = append(r.workers, w)
	return nil
}

// Workers returns the registered workers in registration order.
func (r *Registry) Workers() []Worker { return append([]Worker(nil), r.workers...) }
