package system

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/admin"
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
)

// RootName is the root actor's name; a LeaseActor's PID is RootName/<lease>.
const RootName = "appview"

// statusTimeout bounds a LeaseActor status query from /debug/leases.
const statusTimeout = time.Second

// Options configures a System.
type Options struct {
	Config config.Config
	DB     *database.DB
	// Log is the process logger without an "instance" field: custody
	// events carry their own (docs/spec.md §5); the system adds it elsewhere.
	Log      zerolog.Logger
	Registry *Registry
	// Metrics is where the system registers its collectors (and where
	// /metrics reads from).
	Metrics *prometheus.Registry
	// NudgeURL is this instance's nudge endpoint ("" disables nudges).
	NudgeURL string
	// AdminToken is admin.token: nudges to other instances carry it as a
	// bearer token. Empty sends none.
	AdminToken string
}

// System is the embedded actor system of one instance: a root actor with
// one LeaseActor per registered worker, custody events logged from the
// EventStream.
type System struct {
	o Options
	// stopping is set when Stop begins: nudges are refused.
	stopping atomic.Bool
	actors   *actor.ActorSystem
	root     *actor.PID
	leases   map[string]*actor.PID
	unleased map[string]bool
	eventLog *eventLog
	// store is the lease store every LeaseActor writes through.
	store *lease.Store
	// renewer batches the renewals of every LeaseActor: one statement
	// per renew tick, not one per lease.
	renewer *lease.Renewer
	// releases tells Stop whether every lease held was released.
	releases    *releaseAudit
	releasesSub *eventstream.Subscription
	contenders  *lease.Contenders
	// mark keeps this instance's leases-off record (leases.enabled false).
	mark  *unleasedMark
	log   zerolog.Logger
	specs []childSpec
}

// New builds the actor system and the LeaseActor props for every
// registered worker; Start spawns them.
func New(o Options) (*System, error) {
	cfg := o.Config
	log := o.Log.With().Str("instance", cfg.InstanceID).Logger()
	s := &System{o: o, leases: map[string]*actor.PID{}, unleased: map[string]bool{}, log: log}
	actorLog := log.With().Str("component", "actor").Logger()
	s.actors = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return SlogBridge(actorLog)
	}))
	published := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "appview_events_published_total", Help: "Custody events published on the EventStream, by kind (docs/spec.md §5).",
	}, []string{"event"})
	dropped := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "appview_events_log_dropped_total", Help: "Custody events not logged because the log writer was blocked.",
	})
	for _, k := range lease.EventKinds {
		published.WithLabelValues(string(k))
	}
	if err := registerAll(o.Metrics, published, dropped); err != nil {
		return nil, err
	}
	leaseMetrics, err := lease.NewMetrics(o.Metrics)
	if err != nil {
		return nil, err
	}
	s.eventLog = newEventLog(s.actors.EventStream, o.Log, published, dropped)
	s.releases = newReleaseAudit(cfg.InstanceID)
	s.releasesSub = s.actors.EventStream.Subscribe(s.releases.observe)
	store := lease.NewStore(o.DB, cfg.Leases.TTL)
	var replaced, schemaLost sync.Once
	store.Failed = func(err error) {
		switch {
		case errors.Is(err, database.ErrFileReplaced):
			replaced.Do(func() {
				log.Error().Err(err).Msg("the database file was deleted or replaced under this process: its workers stop (their writes are refused, its leases given up at their next renewal) and it cannot recover; restart it")
			})
		case database.SchemaLost(err):
			schemaLost.Do(func() {
				log.Error().Err(logval.Error(err)).Msg(database.ErrSchemaLost.Error() + ": until then lease writes fail, so this process holds no lease and its workers stop; then it recovers by itself")
			})
		}
	}
	s.store = store
	s.renewer = lease.NewRenewer(store)
	if cfg.Leases.Enabled && o.NudgeURL != "" {
		s.contenders = &lease.Contenders{DB: o.DB, Instance: cfg.InstanceID, URL: o.NudgeURL,
			TTL: cfg.Leases.TTL, Nonce: store.Nonce(), Header: admin.BearerHeader(o.AdminToken), Log: log}
	}
	store.Released = s.contenders.Nudge
	timing := cfg.Leases.Timing()
	var specs []childSpec
	for _, w := range o.Registry.Workers() {
		unleased := !w.Leased || !cfg.Leases.Enabled
		opts := lease.Options{
			Name: w.Name, Instance: cfg.InstanceID, Timing: timing, Store: s.renewer, Unleased: unleased,
			Worker: workerProps(w, log), Publish: s.publish, Metrics: leaseMetrics,
			Contenders: s.contenders, Log: log,
			Health: w.Health, YieldGrace: cfg.Leases.YieldGrace, MinHold: cfg.Leases.MinHold,
		}
		props, err := lease.NewProps(opts)
		if err != nil {
			return nil, fmt.Errorf("worker %s: %w", w.Name, err)
		}
		specs = append(specs, childSpec{name: w.Name, props: props})
		s.unleased[w.Name] = unleased
	}
	s.specs = specs
	return s, nil
}

func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func workerProps(w workers.Spec, log zerolog.Logger) func(fence.Custody) *actor.Props {
	if w.Actor != nil {
		return w.Actor
	}
	return func(c fence.Custody) *actor.Props { return jobProps(w, c, log) }
}

func (s *System) publish(e lease.Event) {
	switch e.Kind {
	case lease.LeaseReleased, lease.LeaseLost:
		// This process writes nothing more under that grant: its worker's
		// last write no longer speaks for /readyz (fence.CustodyEnded).
		fence.CustodyEnded(s.o.DB, fence.Custody{Lease: e.Lease, Holder: e.Instance, Fence: e.Fence})
	}
	s.actors.EventStream.Publish(e)
}

// Start spawns the root actor and, under it, one LeaseActor per worker.
func (s *System) Start() error {
	if s.root != nil {
		return errors.New("system already started")
	}
	root, err := s.actors.Root.SpawnNamed(rootProps(s.specs, s.log), RootName)
	if err != nil {
		return fmt.Errorf("spawn root actor: %w", err)
	}
	s.root = root
	for _, spec := range s.specs {
		s.leases[spec.name] = actor.NewPID(root.Address, root.Id+"/"+spec.name)
	}
	if !s.o.Config.Leases.Enabled {
		s.log.Warn().Msg("leases.enabled is false: every worker runs unconditionally on this instance; run a single instance only")
		s.markUnleased()
	} else {
		s.warnIfInstanceLiveElsewhere()
	}
	return nil
}

// warnIfInstanceLiveElsewhere warns when this instance_id holds a lease,
// or contended for one within a TTL, from another process start. Custody stays correct (every grant carries its process's nonce),
// but two processes answering to one name confuse every report that names
// the holder.
func (s *System) warnIfInstanceLiveElsewhere() {
	ttl := s.o.Config.Leases.TTL
	ctx, cancel := context.WithTimeout(context.Background(), ttl)
	defer cancel()
	names, err := s.store.LiveElsewhere(ctx, s.o.Config.InstanceID, ttl)
	switch {
	case err != nil:
		s.log.Debug().Err(err).Msg("could not check whether this instance_id is live elsewhere")
	case len(names) > 0:
		s.log.Warn().Strs("leases", names).Dur("within", ttl).
			Msg("this instance_id is live from another process start (a lease held, or contended for within one TTL): two running processes share one instance_id, or this instance's previous run ended without releasing; give each process its own instance_id")
	}
}

// Nudge tells the LeaseActor of lease that a holder has just released it,
// so it tries to acquire now. It reports whether such a leased worker exists.
func (s *System) Nudge(name string) bool {
	pid, ok := s.leasedPID(name)
	if ok {
		s.actors.Root.Send(pid, &lease.Nudge{})
	}
	return ok
}

// leasedPID returns the LeaseActor of name when name is a leased worker
// of this instance.
func (s *System) leasedPID(name string) (*actor.PID, bool) {
	pid, ok := s.leases[name]
	return pid, ok && !s.unleased[name]
}

// nudgeDrainGrace bounds how long a stopping instance waits for its
// nudges' answers before it exits (lease.Contenders.Drain): a
// contender answers within milliseconds; one that does not has its
// nudge written all the same.
const nudgeDrainGrace = 200 * time.Millisecond

// forgetBound bounds how long a stopping instance waits for the delete of
// its contender records before its workers stop; the delete may land
// later (Stop waits for it before returning).
const forgetBound = time.Second

// HeldLeases returns the names of the leases this instance holds now (by
// its own custody events), sorted: what a forced exit leaves to run out
// its TTL.
func (s *System) HeldLeases() []string { return s.releases.heldNow() }

// GivenUp names the grants this instance gave up before its stop without
// a release (a blackout, a database error, a replaced file: lease.lost
// with a reason other than superseded) that were neither handed back nor
// followed by a newer grant, as "lease (fence N): reason", sorted. They
// stand in the database until their TTL; Stop does not count them (they
// were not held when it began), so a stop after them is still clean.
func (s *System) GivenUp() []string { return s.releases.givenUpNow() }

// Ready returns nil unless the instance's lease writes are failing
// (lease.Store.Healthy): a database that still answers reads, and even a
// one-page write probe, may refuse every real write (a full disk). With
// leases disabled no lease is written and Ready is nil.
func (s *System) Ready() error {
	if !s.o.Config.Leases.Enabled {
		return nil
	}
	return s.store.Healthy()
}

// Statuses asks every LeaseActor for its own view, in name order.
func (s *System) Statuses() []lease.Status {
	names := make([]string, 0, len(s.leases))
	for n := range s.leases {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]lease.Status, 0, len(names))
	for _, n := range names {
		res, err := s.actors.Root.RequestFuture(s.leases[n], &lease.StatusRequest{}, statusTimeout).Result()
		st, ok := res.(lease.Status)
		if err != nil || !ok {
			st = lease.Status{Lease: n, Phase: "unknown", LastError: fmt.Sprint(err)}
		}
		out = append(out, st)
	}
	return out
}

// ErrStoppedLate is wrapped by Stop's error when ctx ended while an actor
// was still stopping (a worker stuck past the LeaseActor's bound on its
// stop, left behind) but every lease this instance held had been
// released: nothing is left for a successor to wait out, and the writes
// of the actor left behind are fenced under a custody that has ended.
var ErrStoppedLate = errors.New("an actor was still stopping when the shutdown timeout ran out; every lease held was released")

// Stop stops every worker gracefully and waits until the whole actor tree
// has stopped: each LeaseActor stops its worker, releases its lease and
// waits for that write to land before it stops. If ctx ends first (the
// caller then exits anyway) it returns an error wrapping ctx.Err() and
// naming the leases not released, which run out their TTL, or wrapping
// ErrStoppedLate when there are none. Unlike protoactor's PoisonFuture,
// there is no 10 s cap.
func (s *System) Stop(ctx context.Context) error {
	defer s.eventLog.Close()
	if s.root == nil {
		return nil
	}
	done := make(chan struct{})
	root := s.root
	s.actors.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch c.Message().(type) {
		case *actor.Started:
			c.Watch(root)
		case *actor.Terminated:
			close(done)
			c.Stop(c.Self())
		}
	}))
	s.stopping.Store(true)
	// This instance contends no more: releasing holders need not nudge
	// it. Forgotten before any worker stops (at most forgetBound), so the
	// delete does not queue at the database with this instance's releases
	// and its successors' acquires.
	forgot := make(chan struct{})
	go func() {
		defer close(forgot)
		if ferr := s.contenders.Forget(ctx); ferr != nil {
			s.log.Debug().Err(ferr).Msg("could not delete this instance's contender records")
		}
	}()
	select {
	case <-forgot:
	case <-time.After(forgetBound):
	case <-ctx.Done():
	}
	s.releases.beginStop()
	s.actors.Root.Send(root, &shutdown{})
	var err error
	select {
	case <-done:
		err = s.releases.unreleased()
	case <-ctx.Done():
		if left := s.releases.unreleased(); left != nil {
			err = fmt.Errorf("actors still stopping when the shutdown timeout ran out: %w; %w", ctx.Err(), left)
		} else {
			err = fmt.Errorf("%w: %w", ErrStoppedLate, ctx.Err())
		}
	}
	s.actors.EventStream.Unsubscribe(s.releasesSub)
	// Every LeaseActor has stopped (or the timeout ran out): no renewal
	// is asked any more; one still in flight is waited for, bounded.
	if cerr := s.renewer.Close(ctx); cerr != nil && err == nil {
		err = cerr
	}
	select {
	case <-forgot:
	case <-ctx.Done(): // the driver ignores ctx: the delete may still land
	}
	s.stopUnleased(ctx)
	s.contenders.Drain(nudgeDrainGrace)
	s.actors.Shutdown()
	return err
}

// NudgeHandler returns the admin endpoint for nudges: POST
// lease.NudgePath?lease=NAME (204; 404 for a name this instance does not
// contend for under a lease; 400 and 503 as leaseSignal says).
// It can only cause an acquire attempt, which the LeaseActor rate-limits.
func (s *System) NudgeHandler() http.Handler {
	return s.leaseSignal(s.Nudge)
}

// leaseSignal is a POST endpoint that passes the lease query parameter to
// signal and answers 204; 400 when the parameter is missing, empty,
// repeated or not a valid query; 404 when signal reports no such leased
// worker; 503 once the instance is stopping (its LeaseActors are going
// away: a signal would be dropped, and a contender that stops contends
// no more).
func (s *System) leaseSignal(signal func(name string) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			http.Error(w, "unparsable query: "+err.Error(), http.StatusBadRequest)
			return
		}
		names := q["lease"]
		if len(names) != 1 || names[0] == "" {
			http.Error(w, "want exactly one non-empty lease parameter", http.StatusBadRequest)
			return
		}
		if s.stopping.Load() {
			http.Error(w, "instance stopping", http.StatusServiceUnavailable)
			return
		}
		if !signal(names[0]) {
			http.Error(w, "no such leased worker", http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}
