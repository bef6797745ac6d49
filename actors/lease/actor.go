package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/workers"
)

// StoreAPI is what a LeaseActor needs from the lease store: *Store and
// *Renewer implement it; tests inject faults through it.
type StoreAPI interface {
	Acquire(ctx context.Context, name, holder string) (Grant, error)
	Renew(ctx context.Context, c fence.Custody) error
	Release(ctx context.Context, c fence.Custody) error
}

// Options configures one LeaseActor.
type Options struct {
	Name     string // the lease name (docs/spec.md §4), also the worker's
	Instance string // this process's instance_id, the holder
	Timing   config.Timing
	Store    StoreAPI // nil with Unleased
	// Unleased runs the worker unconditionally (leases disabled, or a
	// worker every instance runs): custody with fence 0, nothing written,
	// no lease.* events or metrics. Supervision is the same.
	Unleased bool
	// Worker builds the worker actor for one grant of custody.
	Worker func(c fence.Custody) *actor.Props
	// Publish receives every custody event; it must not block.
	Publish func(Event)
	Metrics *Metrics // optional
	// Contenders is optional: nudges on release, the contender records
	// and the healthy contender an unhealthy holder yields to.
	Contenders *Contenders
	// Health is the worker's own report (workers.Spec.Health); nil is
	// always healthy.
	Health *workers.Health
	// YieldGrace (leases.yield_grace; 0 never) and MinHold
	// (leases.min_hold): see doc.go, health-aware custody.
	YieldGrace, MinHold time.Duration
	Log                 zerolog.Logger
	Seed                uint64 // seeds the retry jitter; 0 picks one
}

// StatusRequest asks a LeaseActor for its Status: send a *StatusRequest
// with RequestFuture; the answer is a Status.
type StatusRequest struct{}

// Status is one LeaseActor's own view of its lease, for /debug/leases:
// the fence it holds (0: none), how much longer it trusts it (local
// monotonic clock), its worker's own health report, and its yields.
type Status struct {
	Lease          string `json:"lease"`
	Phase          string `json:"phase"`
	Fence          int64  `json:"fence,omitempty"`
	TrustedForMS   int64  `json:"trusted_for_ms,omitempty"`
	WorkerActive   bool   `json:"worker_active"`
	WorkerHealthy  bool   `json:"worker_healthy"`
	HealthReason   string `json:"health_reason,omitempty"`
	UnhealthyForMS int64  `json:"unhealthy_for_ms,omitempty"`
	Yields         int    `json:"yields,omitempty"`
	Unleased       bool   `json:"unleased,omitempty"`
	LastError      string `json:"last_error,omitempty"`
	// Source is where the running worker reads from (workers.Health's
	// Source: the consumer's Jetstream host); nil when it reads from no
	// other host or is not running here.
	Source *workers.Source `json:"source,omitempty"`
}

// NewProps returns the props of a LeaseActor. Send it *StopRequested to
// stop gracefully and *Nudge when a holder has released. The actor is its
// worker's supervisor. It returns an error, and no props, when o.Timing
// breaks a relation of config.Timing.Validate (a *config.TimingError) or
// a required option is missing.
func NewProps(o Options) (*actor.Props, error) {
	if err := o.Timing.Validate(); err != nil {
		return nil, fmt.Errorf("lease %q: %w", o.Name, err)
	}
	switch {
	case o.Name == "":
		return nil, errors.New("lease: Options.Name is empty")
	case o.Instance == "":
		return nil, fmt.Errorf("lease %q: Options.Instance is empty", o.Name)
	case o.Worker == nil:
		return nil, fmt.Errorf("lease %q: Options.Worker is nil", o.Name)
	case o.Store == nil && !o.Unleased:
		return nil, fmt.Errorf("lease %q: Options.Store is nil and the worker is not unleased", o.Name)
	}
	if o.Unleased {
		// No lease exists: no lease metric may report one.
		o.Store, o.Metrics, o.Contenders = unleasedStore{}, nil, nil
	}
	return actor.PropsFromProducer(func() actor.Actor { return &leaseActor{o: o} }), nil
}

const (
	// callBound is how long a stopping actor waits for its store calls
	// still running, and for a release of its own.
	callBound = 2 * time.Second
	// maxStuckCalls bounds the acquire calls, and apart the renewals,
	// still running (the driver ignores contexts: a call given up on
	// keeps its goroutine and connection); past it an attempt fails at
	// once with ErrStoreStuck.
	maxStuckCalls = 2
	// storeErrorLogPeriod spaces the warnings about failing store calls.
	storeErrorLogPeriod = 10 * time.Second
)

// Messages of the shell to itself. A store call's answer names the
// incarnation that asked (its calls): after a restart of the LeaseActor
// the old machine's answers are dropped (a grant one made is found as this
// process's own by the next attempt and released).
type (
	answer struct {
		from *calls
		in   Input
	}
	tick          struct{ id uint64 }
	workerFailure struct {
		pid    *actor.PID
		reason any
	}
	yieldCheck struct {
		from  *calls
		found bool
		err   error
	}
)

type leaseActor struct {
	o         Options
	m         *Machine
	origin    time.Time
	sys       *actor.ActorSystem
	self      *actor.PID
	sup       actor.Supervisor
	timer     *time.Timer
	timerID   uint64
	workers   map[int]*actor.PID // by generation
	gens      map[string]int     // generation by worker PID id
	genFence  map[int]int64
	halting   bool // stopping or restarting outright: the system stops the worker
	calls     *calls
	log       zerolog.Logger
	storeErrs zerolog.Logger // sampled: failing store calls
	twins     zerolog.Logger // sampled: another process under this instance_id
	checking  bool           // a look for a healthy contender is in flight
	yields    int
}

func (a *leaseActor) now() time.Duration { return time.Since(a.origin) }

func (a *leaseActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.start(ctx)
	case *StopRequested:
		a.step(ctx, StopRequested{})
	case *Nudge:
		a.step(ctx, Nudge{})
	case *answer:
		if msg.from == a.calls {
			a.onAnswer(ctx, msg.in)
		}
	case *yieldCheck:
		if msg.from == a.calls {
			a.onYieldCheck(ctx, msg)
		}
	case *tick:
		if msg.id == a.timerID {
			a.step(ctx, Tick{})
		}
	case *actor.Terminated:
		gen, ok := a.gens[msg.Who.Id]
		if !ok {
			return
		}
		delete(a.gens, msg.Who.Id)
		delete(a.workers, gen)
		if a.halting {
			// Stopped with us, not on its own: no failure, no respawn.
			a.publish(Event{Kind: WorkerStopped, Lease: a.o.Name, Instance: a.o.Instance, Fence: a.genFence[gen]})
			return
		}
		a.step(ctx, WorkerTerminated{Gen: gen})
	case *workerFailure:
		if gen, ok := a.gens[msg.pid.Id]; ok {
			a.step(ctx, WorkerPanicked{Gen: gen, Reason: asError(msg.reason)})
		}
	case *StatusRequest:
		ctx.Respond(a.status())
	case *actor.Stopping:
		a.halting = true
		a.stopTimer()
	case *actor.Stopped:
		a.stopped()
	case *actor.Restarting:
		a.halting = true
		a.stopTimer()
	default:
		a.log.Warn().Str("message", fmt.Sprintf("%T", msg)).Msg("lease actor: unexpected message, ignored")
	}
}

// start begins an incarnation: a new machine, contending at once. After a
// restart of the actor the previous incarnation's grant, if any, is found
// as this process's own by the first attempt and handed back.
func (a *leaseActor) start(ctx actor.Context) {
	a.sys, a.self, a.origin = ctx.ActorSystem(), ctx.Self(), time.Now()
	a.workers, a.gens, a.genFence = map[int]*actor.PID{}, map[string]int{}, map[int]int64{}
	a.halting, a.checking, a.yields = false, false, 0
	a.calls = &calls{obtained: map[uint64]fence.Custody{}}
	a.log = a.o.Log.With().Str("lease", a.o.Name).Logger()
	a.storeErrs = logval.Sampled(a.log, 1, storeErrorLogPeriod, "lease store call failed")
	a.twins = logval.Sampled(a.log, 1, storeErrorLogPeriod, "another process start holds this lease under this instance_id")
	seed := a.o.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	a.m = NewMachine(a.o.Name, a.o.Instance, a.o.Timing, rand.New(rand.NewPCG(seed, seed>>1|1)), a.o.MinHold)
	if a.o.Metrics != nil {
		a.o.Metrics.Held.WithLabelValues(a.o.Name).Set(0)
	}
	a.step(ctx, Start{})
}

func (a *leaseActor) onAnswer(ctx actor.Context, in Input) {
	switch r := in.(type) {
	case AcquireResult:
		if !a.m.Stray(r) {
			a.calls.taken(r.Seq)
		} // else left to stopped, which hands back what was never taken
		if r.Err != nil {
			a.storeErrs.Warn().Err(logval.Error(r.Err)).Msg("lease acquire failed; retrying")
		}
		if g := r.Grant; r.Err == nil && !g.Granted && g.Holder == a.o.Instance && !g.Own && g.TimeLeft > 0 {
			// Custody stays correct: grants carry the process nonce.
			a.twins.Warn().Int64("fence", g.Fence).Int64("time_left_ms", g.TimeLeft.Milliseconds()).
				Msg("another process start holds this lease under this instance's instance_id: a previous run that ended without releasing (its grant runs out in time_left_ms), or two running processes sharing one instance_id; give each its own")
		}
	case RenewResult:
		// An error that ends custody is reported by lease.lost.
		if r.Err != nil && !RenewalEndsCustody(r.Err) {
			a.storeErrs.Warn().Err(logval.Error(r.Err)).Msg("lease renewal failed; retrying until the renew deadline")
		}
	}
	a.step(ctx, in)
	if r, ok := in.(RenewResult); ok && r.Err == nil {
		if a.o.Metrics != nil && a.o.Health != nil {
			v := 0.0
			if a.healthy() {
				v = 1
			}
			a.o.Metrics.WorkerHealthy.WithLabelValues(a.o.Name).Set(v)
		}
		a.maybeCheckYield()
	}
}

// HandleFailure makes the LeaseActor its worker's supervisor; the
// decision is the machine's, so the failure is queued to Receive.
func (a *leaseActor) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID,
	_ *actor.RestartStatistics, reason any, _ any) {
	a.sup = sup
	a.sys.Root.Send(a.self, &workerFailure{pid: child, reason: reason})
}

func asError(reason any) error {
	if err, ok := reason.(error); ok {
		return err
	}
	return fmt.Errorf("worker panic: %v", reason)
}

func (a *leaseActor) step(ctx actor.Context, in Input) {
	for _, c := range a.m.Step(a.now(), in) {
		a.exec(ctx, c)
	}
}

func (a *leaseActor) exec(ctx actor.Context, c Command) {
	switch c := c.(type) {
	case AcquireCmd:
		a.goAcquire(c)
	case RenewCmd:
		a.goRenew(c)
	case ReleaseCmd:
		a.goRelease(c)
	case SpawnWorkerCmd:
		pid := ctx.SpawnPrefix(a.o.Worker(c.Custody), "worker-")
		a.workers[c.Gen], a.gens[pid.Id], a.genFence[c.Gen] = pid, c.Gen, c.Custody.Fence
	case RestartWorkerCmd:
		if pid := a.workers[c.Gen]; pid != nil && a.sup != nil {
			a.sup.RestartChildren(pid)
		}
	case StopWorkerCmd:
		if pid := a.workers[c.Gen]; pid != nil {
			if c.Graceful {
				ctx.Send(pid, &workers.Drain{})
				ctx.Poison(pid)
			} else {
				ctx.Stop(pid)
			}
		}
	case EmitCmd:
		a.publish(c.Event)
	case WakeCmd:
		a.setTimer(c.At)
	case FinishedCmd:
		ctx.Stop(ctx.Self())
	}
}

// maybeCheckYield runs after each successful renewal: once the worker has
// reported unhealthy for YieldGrace (since its last change of health, so
// a flickering worker never yields) and custody has lasted MinHold, it
// looks in the background for a healthy contender.
func (a *leaseActor) maybeCheckYield() {
	if a.o.YieldGrace <= 0 || a.o.Contenders == nil || a.checking {
		return
	}
	ok, since, _ := a.o.Health.Status()
	if ok || time.Since(since) < a.o.YieldGrace || a.m.HeldFor(a.now()) < a.o.MinHold {
		return
	}
	a.checking = true
	contenders, name, bound := a.o.Contenders, a.o.Name, a.o.Timing.RenewDeadline
	sys, self, calls := a.sys, a.self, a.calls
	calls.running.Add(1)
	go func() {
		defer calls.running.Done()
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		found, err := contenders.HealthyContender(ctx, name)
		calls.deliver(0, fence.Custody{}, func() { sys.Root.Send(self, &yieldCheck{from: calls, found: found, err: err}) })
	}()
}

func (a *leaseActor) onYieldCheck(ctx actor.Context, y *yieldCheck) {
	a.checking = false
	switch {
	case y.err != nil:
		a.storeErrs.Debug().Err(y.err).Msg("could not read the contenders' health; not yielding")
	case y.found:
		if ok, since, reason := a.o.Health.Status(); !ok {
			a.step(ctx, YieldRequested{Reason: fmt.Errorf("worker unhealthy for %s (%s) and a contender reports healthy",
				time.Since(since).Round(time.Millisecond), reason)})
		}
	}
}

func (a *leaseActor) healthy() bool {
	ok, _, _ := a.o.Health.Status()
	return ok
}

func (a *leaseActor) publish(e Event) {
	if e.Kind == LeaseYielded {
		a.yields++
	}
	a.o.publish(e)
}

// publish stamps e, counts it, publishes it and keeps the contender
// records. An unleased worker publishes no lease.* event.
func (o *Options) publish(e Event) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	if o.Unleased {
		switch e.Kind {
		case LeaseAcquired, LeaseContended, LeaseRenewed, LeaseLost, LeaseReleased:
			return
		}
	}
	o.Metrics.observe(e)
	if o.Publish != nil {
		o.Publish(e)
	}
	if e.Kind == LeaseContended {
		ok, _, _ := o.Health.Status()
		o.Contenders.Register(o.Name, ok)
	}
}

func (a *leaseActor) setTimer(at time.Duration) {
	a.stopTimer()
	if at == NoWake {
		return
	}
	a.timerID++
	id, sys, self := a.timerID, a.sys, a.self
	a.timer = time.AfterFunc(max(at-a.now(), 0), func() { sys.Root.Send(self, &tick{id: id}) })
}

func (a *leaseActor) stopTimer() {
	if a.timer != nil {
		a.timer.Stop()
		a.timer = nil
	}
}

func (a *leaseActor) status() Status {
	s := Status{Lease: a.o.Name, Phase: a.m.Phase().String(), WorkerActive: a.m.WorkerActive(), Unleased: a.o.Unleased, Yields: a.yields}
	ok, since, reason := a.o.Health.Status()
	s.WorkerHealthy = ok
	if !ok {
		s.HealthReason = reason
		s.UnhealthyForMS = time.Since(since).Milliseconds()
	}
	if c := a.m.Custody(); c.Fence > 0 && a.m.HoldsCustody() {
		s.Fence = c.Fence
		s.TrustedForMS = max(a.m.TrustedUntil()-a.now(), 0).Milliseconds()
	}
	if err := a.m.LastErr(); err != nil {
		s.LastError = err.Error()
	}
	if src := a.o.Health.Source(); s.WorkerActive && src.URL != "" {
		s.Source = &src
	}
	return s
}

// unleasedStore grants at once and forever, with fence 0 (unfenced).
type unleasedStore struct{}

func (unleasedStore) Acquire(context.Context, string, string) (Grant, error) {
	return Grant{Granted: true}, nil
}
func (unleasedStore) Renew(context.Context, fence.Custody) error   { return nil }
func (unleasedStore) Release(context.Context, fence.Custody) error { return nil }
