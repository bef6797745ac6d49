package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/actors/lease/internal/machine"
	"github.com/atcr-io/appview/internal/events"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/leasestore"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/workers"
)

// StoreAPI is what a LeaseActor needs from the lease store.
// *leasestore.Store implements it; tests inject faults through it.
type StoreAPI interface {
	Acquire(ctx context.Context, name, holder string) (leasestore.Grant, error)
	Renew(ctx context.Context, c fence.Custody) error
	Release(ctx context.Context, c fence.Custody) error
}

// Options configures one LeaseActor.
type Options struct {
	// Name is the lease name (docs/spec.md §4), also the worker's name.
	Name string
	// Instance is this process's instance_id (the holder).
	Instance string
	// Timing must pass Timing.Validate (NewProps checks it).
	Timing leasestore.Timing
	// Store decides custody. Nil with Unleased set.
	Store StoreAPI
	// Unleased runs the worker unconditionally (leases disabled, or a worker
	// every instance runs): custody is granted at once with fence 0, nothing
	// is written, and no lease.* events are published. Supervision (restart
	// with backoff, give up after repeated failures) is the same.
	Unleased bool
	// Worker builds the worker actor for one grant of custody.
	Worker func(c fence.Custody) *actor.Props
	// Publish receives every custody event (normally the EventStream's
	// Publish). It must not block.
	Publish func(events.Custody)
	// Metrics is optional, and ignored with Unleased: an unleased worker
	// records no lease metrics.
	Metrics *Metrics
	// Contenders is optional: with it, a contender records itself so a
	// releasing holder can nudge it, and a holder nudges on release.
	Contenders *leasestore.Contenders
	// Health is the worker's own health report (workers.Spec.Health); nil
	// is always healthy. A contender records it in lease_contenders; a
	// holder whose worker has reported unhealthy for YieldGrace, once it
	// has held the lease for MinHold, releases it when some contender
	// reports healthy (health-aware custody; needs Contenders).
	Health *workers.Health
	// YieldGrace is leases.yield_grace: 0 never yields.
	YieldGrace time.Duration
	// MinHold is leases.min_hold: no yield before custody has lasted this
	// long.
	MinHold time.Duration
	// StandbyFor bounds one standby (see Standby); 0 means StandbyFor,
	// negative turns standbys off (a libSQL server, where each read is a
	// round trip and the nudge is quicker).
	StandbyFor time.Duration
	Log        zerolog.Logger
	// Seed seeds the retry jitter; 0 picks a random seed.
	Seed uint64
}

// StatusRequest asks a LeaseActor for its Status: send a *StatusRequest
// with RequestFuture; the answer is a Status.
type StatusRequest struct{}

// StopRequested asks a LeaseActor for a graceful stop (send a
// *StopRequested): it stops the worker (Drain, then poison), keeps
// renewing while the worker drains, releases, and only then stops itself.
// The system's shutdown sends it to every LeaseActor and waits for each
// to stop.
type StopRequested struct{}

// Nudge tells a LeaseActor that a holder has just released its lease
// (send a *Nudge): a contender makes an acquire attempt at once, at most
// one per nudge spacing however many arrive.
type Nudge struct{}

// Status is one LeaseActor's own view of its lease, for /debug/leases.
type Status struct {
	Lease string `json:"lease"`
	Phase string `json:"phase"`
	// Fence is the fence this instance holds (0: none).
	Fence int64 `json:"fence,omitempty"`
	// TrustedForMS is how much longer, by the local monotonic clock, this
	// instance trusts its grant without another successful renewal.
	TrustedForMS int64 `json:"trusted_for_ms,omitempty"`
	WorkerActive bool  `json:"worker_active"`
	// WorkerHealthy is the worker's own health report (always true for a
	// worker that reports none); HealthReason says why it is unhealthy
	// and UnhealthyForMS for how long.
	WorkerHealthy  bool   `json:"worker_healthy"`
	HealthReason   string `json:"health_reason,omitempty"`
	UnhealthyForMS int64  `json:"unhealthy_for_ms,omitempty"`
	// Yields counts the times this LeaseActor yielded its lease to a
	// healthier contender.
	Yields    int    `json:"yields,omitempty"`
	Unleased  bool   `json:"unleased,omitempty"`
	LastError string `json:"last_error,omitempty"`
}

// NewProps returns the props of a LeaseActor. Send it &StopRequested{} to
// stop gracefully (stop the worker, release, stop itself) and &Nudge{}
// when a holder has released. The actor is its worker's supervisor. It
// returns an error, and no props, when o.Timing breaks a relation of
// Timing.Validate (a *leasestore.TimingError) or a required option is
// missing.
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
		// No lease exists: nothing is acquired, renewed or held, so no
		// lease metric may report one (appview_lease_* series for the
		// health worker would show a lease on every dashboard).
		o.Store, o.Metrics = unleasedStore{}, nil
	}
	inc := &incarnation{}
	return actor.PropsFromProducer(func() actor.Actor { return &leaseActor{o: o, inc: inc} }), nil
}

// incarnation carries a grant across a restart of the LeaseActor itself
// (a bug in it, not a worker failure): the old incarnation records the
// grant it held, and the new one releases it before contending, instead of
// contending against its own grant for up to a TTL. Restarting and Started
// run on the actor's mailbox goroutine, one after the other.
type incarnation struct {
	mu   sync.Mutex
	left fence.Custody
}

type (
	tick          struct{ gen uint64 }
	workerFailure struct {
		pid    *actor.PID
		reason any
	}
)

// callBound is how long the shell waits for a synchronous backstop release.
const callBound = 2 * time.Second

// maxStuckCalls bounds the acquire calls, and separately the renew calls,
// of one LeaseActor still running in the background. The driver ignores contexts, so a call the
// machine gave up on keeps its goroutine (and its pool connection) until
// the database answers; while that many are stuck, a new attempt fails at
// once with machine.ErrStoreStuck instead of piling up another.
const maxStuckCalls = 2

// storeErrorLogPeriod rate-limits the warnings about failing store calls.
const storeErrorLogPeriod = 10 * time.Second

type leaseActor struct {
	o       Options
	inc     *incarnation
	m       *machine.Machine
	origin  time.Time
	sys     *actor.ActorSystem
	self    *actor.PID
	sup     actor.Supervisor
	timer   *time.Timer
	timerID uint64
	workers map[int]*actor.PID
	gens    map[string]int
	// genFence is the fence each worker generation was spawned under.
	genFence map[int]int64
	// halting: the actor itself is stopping or restarting (stopped
	// outright, not through StopRequested); its workers are being stopped
	// by the actor system, not by the machine.
	halting bool
	// handedBack is the highest fence whose hand-back was published.
	handedBack int64
	// late keeps the grants store calls obtained until they are taken in.
	late   *lateOutcomes
	left   []lateGrant // what late.stop returned at machine.FinishedCmd
	calls  context.Context
	cancel context.CancelFunc
	log    zerolog.Logger
	// storeErrs logs failing store calls, at most once per storeErrorLogPeriod.
	storeErrs zerolog.Logger
	// duplicates logs a grant of another process under this instance_id,
	// at most once per storeErrorLogPeriod.
	duplicates zerolog.Logger
	// acquiring and renewing count the calls of each kind not yet returned.
	acquiring, renewing *atomic.Int32
	// checkingYield: a look for a healthy contender is in flight.
	checkingYield bool
	yields        int
	// standby is the watch of the lease row after an announced release.
	standby standbyState
}

func (a *leaseActor) now() time.Duration { return time.Since(a.origin) }

func (a *leaseActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.sys, a.self, a.origin = ctx.ActorSystem(), ctx.Self(), time.Now()
		a.workers, a.gens, a.genFence = map[int]*actor.PID{}, map[string]int{}, map[int]int64{}
		a.halting = false
		a.calls, a.cancel = context.WithCancel(context.Background())
		a.log = a.o.Log.With().Str("lease", a.o.Name).Logger()
		a.storeErrs = logval.Sampled(a.log, 1, storeErrorLogPeriod, "lease store call failed")
		a.duplicates = logval.Sampled(a.log, 1, storeErrorLogPeriod, "another process holds this lease under this instance_id")
		a.acquiring, a.renewing = &atomic.Int32{}, &atomic.Int32{}
		a.late = newLateOutcomes()
		seed := a.o.Seed
		if seed == 0 {
			seed = rand.Uint64()
		}
		a.m = machine.New(a.o.Name, a.o.Instance, a.o.Timing, rand.New(rand.NewPCG(seed, seed>>1|1)))
		a.m.SetMinHold(a.o.MinHold)
		a.checkingYield, a.yields = false, 0
		a.standby = standbyState{}
		if a.o.Metrics != nil {
			a.o.Metrics.Held.WithLabelValues(a.o.Name).Set(0)
		}
		a.inc.mu.Lock()
		left := a.inc.left
		a.inc.left = fence.Custody{}
		a.inc.mu.Unlock()
		if left.Fence > 0 {
			// Our previous incarnation's worker has terminated (protoactor
			// restarts an actor only after its children stopped).
			a.releaseNow(left, events.ReasonActorRestarted)
		}
		a.step(ctx, machine.Start{})
	case *StopRequested:
		a.prepareNudges()
		a.stopStandby() // a contender's watch: no acquire after it
		a.step(ctx, machine.StopRequested{})
	case *Nudge:
		a.step(ctx, machine.Nudge{})
	case *Standby:
		a.startStandby(ctx, msg.Watching, msg.Began)
	case *machine.AcquireResult:
		a.late.taken(msg.Seq)
		if a.standby.cancel != nil && msg.Seq == a.standby.seq {
			a.standby.cancel(nil) // its watch is over
			a.standby.cancel = nil
		}
		if msg.Err != nil && !errors.Is(msg.Err, machine.ErrNotAttempted) {
			a.storeErrs.Warn().Err(msg.Err).Msg("lease acquire failed; retrying")
		}
		if g := msg.Grant; msg.Err == nil && !g.Granted && g.Holder == a.o.Instance && !g.Own && g.TimeLeft > 0 {
			// Custody stays correct (grants carry the process nonce), but
			// the operator has two processes answering to one name.
			a.duplicates.Warn().Int64("fence", g.Fence).Msg("another process holds this lease under this instance's instance_id: two running processes share one instance_id; give each its own")
		}
		a.step(ctx, *msg)
	case *machine.RenewResult:
		a.late.taken(msg.Seq)
		// An error that ends custody at once is reported by lease.lost, not
		// announced as retried.
		if msg.Err != nil && !machine.RenewalEndsCustody(msg.Err) {
			a.storeErrs.Warn().Err(msg.Err).Msg("lease renewal failed; retrying until the renew deadline")
		}
		a.step(ctx, *msg)
		if msg.Err == nil {
			if a.o.Metrics != nil && a.o.Health != nil {
				v := 0.0
				if a.healthy() {
					v = 1
				}
				a.o.Metrics.WorkerHealthy.WithLabelValues(a.o.Name).Set(v)
			}
			a.maybeCheckYield()
		}
	case *yieldCheck:
		a.checkingYield = false
		switch {
		case msg.err != nil:
			a.storeErrs.Debug().Err(msg.err).Msg("could not read the contenders' health; not yielding")
		case msg.found:
			if ok, since, reason := a.o.Health.Status(); !ok {
				a.prepareNudges()
				a.step(ctx, machine.YieldRequested{Reason: fmt.Errorf("worker unhealthy for %s (%s) and a contender reports healthy",
					time.Since(since).Round(time.Millisecond), reason)})
			}
		}
	case *machine.ReleaseResult:
		a.step(ctx, *msg)
	case *staleReleased:
		// A hand-back answered: the custody it ended (and, for a late
		// acquire, began) is published like any other (docs/spec.md §5), once per
		// grant (several late renewals of one grant each hand it back).
		if msg.Custody.Fence <= a.handedBack {
			return
		}
		a.handedBack = msg.Custody.Fence
		for _, e := range staleGrantEvents(lateGrant{c: msg.Custody, acquired: msg.LateAcquire}, msg.err) {
			e.At = msg.begun
			a.publish(e)
		}
		// The lease is free now, ours to contend for at once.
		a.step(ctx, machine.Nudge{})
	case *tick:
		if msg.gen == a.timerID {
			a.step(ctx, machine.Tick{})
		}
	case *actor.Terminated:
		if gen, ok := a.gens[msg.Who.Id]; ok {
			delete(a.gens, msg.Who.Id)
			delete(a.workers, gen)
			if a.halting {
				// Stopped with us, not on its own: no failure, no
				// respawn (and no timer armed on a stopping actor).
				a.publish(events.Custody{Kind: events.WorkerStopped, Lease: a.o.Name, Instance: a.o.Instance, Fence: a.genFence[gen]})
				return
			}
			a.step(ctx, machine.WorkerStopped{Gen: gen})
		}
	case *workerFailure:
		if gen, ok := a.gens[msg.pid.Id]; ok {
			a.step(ctx, machine.WorkerFailed{Gen: gen, Reason: asError(msg.reason)})
		}
	case *StatusRequest:
		ctx.Respond(a.status())
	case *actor.Stopping:
		a.halting = true
		a.stopTimer()
		a.stopStandby()
	case *actor.Stopped:
		left := append(a.left, a.late.stop()...)
		a.backstopRelease()
		for _, g := range left {
			if a.m != nil && a.m.HoldsCustody() && g.c.Fence == a.m.Custody().Fence {
				continue // released just above
			}
			begun, err := releaseBounded(a.o.Store, g.c, callBound)
			a.lateReleased(g, begun, err)
		}
		if !a.late.wait(callBound) {
			a.log.Warn().Dur("waited_ms", callBound).Msg("lease store calls still running at stop: a grant one obtains is released by it, unless the process has exited by then (the grant then runs out its TTL)")
		}
		a.cancel()
	case *actor.Restarting:
		a.halting = true
		a.stopTimer()
		a.stopStandby()
		a.cancel()
		if a.m != nil && !a.o.Unleased && (a.m.HoldsCustody() || a.m.Phase() == machine.PhaseReleasing) {
			a.inc.mu.Lock()
			a.inc.left = a.m.Custody()
			a.inc.mu.Unlock()
		}
	default:
		a.log.Warn().Str("message", fmt.Sprintf("%T", msg)).Msg("lease actor: unexpected message, ignored")
	}
}

// HandleFailure makes the LeaseActor its worker's supervisor (protoactor
// asks an actor that implements SupervisorStrategy). It runs on the
// actor's own goroutine; the decision is the machine's, so the failure is
// queued to Receive.
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

func (a *leaseActor) step(ctx actor.Context, in machine.Input) {
	cmds := a.m.Step(a.now(), in)
	for _, c := range cmds {
		if _, ok := c.(machine.FinishedCmd); ok {
			// From here on answers reach no Receive (the actor stops):
			// calls still running, and those this step starts (a
			// hand-back as the machine finishes), publish and release
			// their own outcomes.
			a.left = append(a.left, a.late.stop()...)
		}
	}
	for _, c := range cmds {
		a.exec(ctx, c)
	}
	if a.m.Phase() != machine.PhaseContending {
		a.stopStandby()
	}
}

func (a *leaseActor) exec(ctx actor.Context, c machine.Command) {
	switch c := c.(type) {
	case machine.AcquireCmd:
		a.goAcquire(c)
	case machine.RenewCmd:
		a.goRenew(c)
	case machine.ReleaseCmd:
		a.goRelease(c)
	case machine.SpawnWorkerCmd:
		pid := ctx.SpawnPrefix(a.o.Worker(c.Custody), "worker-")
		a.workers[c.Gen], a.gens[pid.Id], a.genFence[c.Gen] = pid, c.Gen, c.Custody.Fence
	case machine.RestartWorkerCmd:
		if pid := a.workers[c.Gen]; pid != nil {
			if a.sup != nil {
				a.sup.RestartChildren(pid)
			} else {
				ctx.Stop(pid) // cannot happen: a failure always comes through HandleFailure
			}
		}
	case machine.StopWorkerCmd:
		if pid := a.workers[c.Gen]; pid != nil {
			if c.Graceful {
				ctx.Send(pid, &workers.Drain{})
				ctx.Poison(pid)
			} else {
				ctx.Stop(pid)
			}
		}
	case machine.EmitCmd:
		a.publish(c.Event)
	case machine.WakeCmd:
		a.setTimer(c.At)
	case machine.FinishedCmd:
		ctx.Stop(ctx.Self())
	}
}

// yieldCheck answers a look for a healthy contender (see maybeCheckYield).
type yieldCheck struct {
	found bool
	err   error
}

// maybeCheckYield runs after each successful renewal: when the worker has
// reported itself unhealthy for YieldGrace and custody has lasted MinHold,
// it looks (in the background) for a contender that reports healthy; the
// answer may make the machine yield. Hysteresis: the grace counts from
// the worker's last change of health, so a flickering worker never
// yields, and MinHold keeps a new holder from handing the lease straight
// back.
func (a *leaseActor) maybeCheckYield() {
	if a.o.YieldGrace <= 0 || a.o.Contenders == nil || a.o.Unleased || a.checkingYield {
		return
	}
	ok, since, _ := a.o.Health.Status()
	if ok || time.Since(since) < a.o.YieldGrace || a.m.HeldFor(a.now()) < a.o.MinHold {
		return
	}
	a.checkingYield = true
	contenders, sys, self, late := a.o.Contenders, a.sys, a.self, a.late
	bound := a.o.Timing.RenewDeadline
	late.calls.Add(1)
	go func() {
		defer late.calls.Done()
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		found, err := contenders.HealthyContender(ctx, a.o.Name)
		late.sendOr(func() { sys.Root.Send(self, &yieldCheck{found: found, err: err}) }, func() {})
	}()
}

// prepareNudges readies the nudges of the release a graceful stop or a
// yield is about to make (leasestore.Contenders.Prepare): connections to
// the contenders are dialed while the worker drains, so the handover
// after the release waits for one request, not for a dial and a request.
func (a *leaseActor) prepareNudges() {
	if a.o.Contenders != nil && !a.o.Unleased && a.m.HoldsCustody() {
		a.o.Contenders.Prepare(a.o.Name)
	}
}

func (a *leaseActor) healthy() bool {
	ok, _, _ := a.o.Health.Status()
	return ok
}

func (a *leaseActor) publish(e events.Custody) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	if e.Kind == events.LeaseYielded {
		a.yields++
	}
	if a.o.Unleased {
		switch e.Kind {
		case events.LeaseAcquired, events.LeaseContended, events.LeaseRenewed, events.LeaseLost, events.LeaseReleased:
			return
		}
	}
	if a.o.Metrics != nil {
		a.o.Metrics.observe(e)
	}
	if a.o.Publish != nil {
		a.o.Publish(e)
	}
	if a.o.Contenders != nil {
		switch e.Kind {
		case events.LeaseContended:
			a.o.Contenders.Register(a.o.Name, a.healthy())
		case events.LeaseAcquired, events.LeaseRenewed:
			// A holder keeps its contenders' URLs at hand for its
			// release (one read per TTL/2 per process).
			a.o.Contenders.Refresh()
		}
	}
}

func (a *leaseActor) goAcquire(c machine.AcquireCmd) {
	store, sys, self, ctx := a.o.Store, a.sys, a.self, a.calls
	name, holder, metrics, running := a.o.Name, a.o.Instance, a.o.Metrics, a.acquiring
	if running.Load() >= maxStuckCalls {
		sys.Root.Send(self, &machine.AcquireResult{Seq: c.Seq, Err: machine.ErrStoreStuck})
		return
	}
	running.Add(1)
	late := a.late
	late.calls.Add(1)
	// A Standby's attempt watches the row first (machine.Standby): the
	// goroutine that sees it free makes the acquire, with no trip through
	// the mailbox between the two (20–200 µs on a busy 2-core host).
	began := time.Now() // the call's start, before a Standby's watch
	var watch func() (bool, leasestore.Vacancy, func())
	// startStandby issues AfterVacancy only for a store that reads vacancies.
	if reader, ok := store.(VacancyReader); c.AfterVacancy && ok {
		wctx, cancel := context.WithCancelCause(ctx)
		wctx, stop := context.WithTimeout(wctx, a.standbyBound())
		watching, watchBegan, log := a.standby.watching, a.standby.began, a.log
		a.standby.watching, a.standby.began, a.standby.cancel, a.standby.seq, a.standby.started = nil, nil, cancel, c.Seq, began
		watch = func() (bool, leasestore.Vacancy, func()) {
			defer stop()
			return watchFirst(wctx, ctx, reader, name, holder, watching, watchBegan, log)
		}
	}
	go func() {
		defer late.calls.Done()
		defer running.Add(-1)
		if watch != nil {
			// From the watch's start to the acquire's answer, the acquire
			// is a pending lease write of this process: its fenced worker
			// transactions hold back for it (see PendingAcquirer).
			if p, ok := store.(PendingAcquirer); ok {
				defer p.PendingAcquire()()
			}
			attempt, v, report := watch()
			defer report()
			if v.Ours {
				// Handed over by the holder (leasestore.Store.Transfer):
				// the grant is made; the machine takes custody of it
				// (or, when it cannot, hands it back, as a stopped
				// actor's late outcomes do).
				at := time.Now()
				g := leasestore.Grant{Holder: holder, Fence: v.Fence, Own: true, Age: v.Age, TimeLeft: v.TimeLeft}
				got := lateGrant{c: fence.Custody{Lease: name, Holder: holder, Fence: v.Fence}, acquired: true}
				late.deliver(c.Seq, got, func() {
					sys.Root.Send(self, &machine.AcquireResult{Seq: c.Seq, Grant: g, At: at, Elapsed: at.Sub(began), HandedOver: true})
				}, store, callBound, a.lateReleased)
				return
			}
			if !attempt {
				late.deliver(c.Seq, lateGrant{}, func() { sys.Root.Send(self, &machine.AcquireResult{Seq: c.Seq, Err: machine.ErrNotAttempted}) },
					store, callBound, a.lateReleased)
				return
			}
		}
		start := time.Now()
		g, err := store.Acquire(ctx, name, holder)
		at := time.Now()
		if metrics != nil {
			metrics.observeAcquire(name, time.Since(start), g, err)
		}
		var got lateGrant
		if err == nil && (g.Granted || g.Own) {
			// An Own grant not made by this call may be one handed over
			// while it ran, which the machine adopts: a stopped actor
			// hands it back like its own.
			got = lateGrant{c: fence.Custody{Lease: name, Holder: holder, Fence: g.Fence}, acquired: true}
		}
		late.deliver(c.Seq, got, func() {
			sys.Root.Send(self, &machine.AcquireResult{Seq: c.Seq, Grant: g, Err: err, At: at, Elapsed: at.Sub(began)})
		}, store, callBound, a.lateReleased)
	}()
}

func (a *leaseActor) goRenew(c machine.RenewCmd) {
	store, sys, self, ctx, metrics, running := a.o.Store, a.sys, a.self, a.calls, a.o.Metrics, a.renewing
	if running.Load() >= maxStuckCalls {
		sys.Root.Send(self, &machine.RenewResult{Seq: c.Seq, Err: machine.ErrStoreStuck})
		return
	}
	running.Add(1)
	late := a.late
	late.calls.Add(1)
	go func() {
		defer late.calls.Done()
		defer running.Add(-1)
		start := time.Now()
		err := store.Renew(ctx, c.Custody)
		if metrics != nil {
			metrics.observeRenew(c.Custody.Lease, time.Since(start), err)
		}
		var got lateGrant
		if err == nil {
			got.c = c.Custody
		}
		late.deliver(c.Seq, got, func() { sys.Root.Send(self, &machine.RenewResult{Seq: c.Seq, Err: err}) },
			store, callBound, a.lateReleased)
	}()
}

// lateReleased logs and publishes the release of a grant a store call
// obtained after the actor stopped taking answers (see lateOutcomes). It
// may run on a store call's goroutine: it only logs and publishes.
func (a *leaseActor) lateReleased(g lateGrant, begun time.Time, err error) {
	if err != nil && !errors.Is(err, fence.ErrSuperseded) {
		a.log.Warn().Err(err).Int64("fence", g.c.Fence).Msg("could not release a grant obtained as the lease actor stopped; it will run out its TTL")
		return
	}
	if a.o.Publish == nil || a.o.Unleased {
		return
	}
	for _, e := range staleGrantEvents(g, err) {
		e.At = begun
		a.o.Publish(e)
	}
}

// staleGrantEvents are the custody events of a grant handed back unused:
// for a late acquire, its grant (reason stale-grant); then its release
// (lease.released, stale-grant) or, when another instance had taken the
// lease before the hand-back landed (err is ErrSuperseded), its loss
// (lease.lost, superseded). A late renewal began no custody, so a hand-back
// that finds it superseded has nothing to report.
func staleGrantEvents(g lateGrant, err error) []events.Custody {
	c := g.c
	base := events.Custody{Lease: c.Lease, Instance: c.Holder, Fence: c.Fence}
	var out []events.Custody
	if g.acquired {
		e := base
		e.Kind, e.Reason = events.LeaseAcquired, events.ReasonStaleGrant
		out = append(out, e)
	}
	e := base
	switch {
	case err == nil:
		e.Kind, e.Reason = events.LeaseReleased, events.ReasonStaleGrant
	case g.acquired:
		e.Kind, e.Reason, e.Err = events.LeaseLost, events.ReasonSuperseded, err
	default:
		return out
	}
	return append(out, e)
}

// staleReleased reports the answer to a Stale ReleaseCmd: nil (landed) or
// ErrSuperseded.
type staleReleased struct {
	machine.ReleaseCmd
	begun time.Time
	err   error
}

// nudgePrepareWait bounds how long a graceful release waits for its
// nudges to be readied (leasestore.Contenders.WaitPrepared): a read of
// lease_contenders and a dial per contender, well under a millisecond
// each on a healthy database and network. A worker that drains for
// longer than that has given them the time already.
const nudgePrepareWait = 10 * time.Millisecond

// announceWait bounds how long a graceful release waits for its
// contenders to answer the announcement that it is coming
// (leasestore.Contenders.Announce): one request on a connection dialed
// ahead, a fraction of a millisecond on a healthy network. A contender
// slower than that still gets the nudge after the release.
const announceWait = 10 * time.Millisecond

func (a *leaseActor) goRelease(c machine.ReleaseCmd) {
	store, sys, self, log := a.o.Store, a.sys, a.self, a.log
	contenders, name, unleased := a.o.Contenders, a.o.Name, a.o.Unleased
	// A release must land even when the process is stopping and every
	// caller context is cancelled: it runs on its own bounded context, and
	// the actor's Stopped waits for it (bounded).
	late := a.late
	late.calls.Add(1)
	go func() {
		defer late.calls.Done()
		ctx, cancel := context.WithTimeout(context.Background(), a.o.Timing.RenewDeadline)
		defer cancel()
		var successors []leasestore.Successor
		if !c.Stale && !unleased {
			// The nudges this release is about to send are being readied
			// (prepareNudges, at the stop or yield): give them a moment,
			// so they leave with the release on open connections.
			wctx, stop := context.WithTimeout(ctx, nudgePrepareWait)
			contenders.WaitPrepared(wctx, name)
			stop()
			// The contenders stand by (Standby) before the release, so
			// the one that wins is already running when it lands.
			// The answers come back in a fraction of a millisecond:
			// meanwhile the transfer that may follow is warmed
			// (Transferrer.WarmTransfer). Not waited for: the transfer
			// queues behind it for the process's turn at lease writes.
			if t, ok := store.(Transferrer); ok && contenders.Announces(name) {
				late.calls.Add(1)
				go func() {
					defer late.calls.Done()
					t.WarmTransfer(ctx, c.Custody)
				}()
			}
			actx, stop := context.WithTimeout(ctx, announceWait)
			successors = contenders.Announce(actx, name)
			stop()
		}
		// A release's lease.released is stamped when it began: before it
		// committed, so before any successor's grant (events.Custody.At).
		begun := time.Now()
		if to, ok := handOver(ctx, store, contenders, c.Custody, successors, log); ok {
			sys.Root.Send(self, &machine.ReleaseResult{Seq: c.Seq, At: begun, HandedTo: to})
			return
		}
		err := store.Release(ctx, c.Custody)
		if err == nil && !unleased {
			// The lease is free from the commit on: the contenders hear
			// it now, not after this answer's trip through the mailbox
			// and the lease.released line (tens to hundreds of µs).
			contenders.NudgeOthers(name)
		}
		if c.Stale {
			if err != nil && !errors.Is(err, fence.ErrSuperseded) {
				what := "could not hand back a grant given up earlier; it will run out its TTL"
				if c.LateAcquire {
					what = "could not hand back a late grant; it will run out its TTL"
				}
				log.Warn().Err(err).Int64("fence", c.Custody.Fence).Msg(what)
				return
			}
			// After Stopped (a hand-back issued as the machine finished)
			// the answer would be dropped: publish it here.
			late.sendOr(func() { sys.Root.Send(self, &staleReleased{ReleaseCmd: c, begun: begun, err: err}) },
				func() { a.lateReleased(lateGrant{c: c.Custody, acquired: c.LateAcquire}, begun, err) })
			return
		}
		sys.Root.Send(self, &machine.ReleaseResult{Seq: c.Seq, Err: err, At: begun})
	}()
}

// Transferrer is a store that can hand a grant to a contender standing by
// instead of releasing it: *leasestore.Store implements it
// (Store.Transfer).
type Transferrer interface {
	Transfer(ctx context.Context, c fence.Custody, to leasestore.Successor, recent time.Duration) (int64, error)
	// WarmTransfer runs the transfer's transaction without effect, so the
	// transfer right after runs hot.
	WarmTransfer(ctx context.Context, c fence.Custody)
}

// handOver hands grant c to the first of successors (the contenders whose
// answers to the announcement say they watch the row) and reports whether
// it did, and to which instance. The successor, watching, finds the row granted to itself and
// takes custody without a write of its own: a graceful handover is one
// write instead of a release and an acquire (docs/performance.md). When it
// does not (no successor, a store that cannot, the grant or the
// successor's record no longer what Transfer requires, or an error), the
// caller releases as before, and the release's answer says what the grant
// has become.
func handOver(ctx context.Context, store StoreAPI, contenders *leasestore.Contenders, c fence.Custody, successors []leasestore.Successor, log zerolog.Logger) (string, bool) {
	t, ok := store.(Transferrer)
	if !ok || len(successors) == 0 || contenders == nil {
		return "", false
	}
	to := successors[0]
	began := time.Now()
	next, err := t.Transfer(ctx, c, to, contenders.Recent())
	took := time.Since(began)
	if err != nil {
		log.Debug().Err(err).Int64("fence", c.Fence).Str("to", logval.String(to.Instance)).Msg("lease not handed over; releasing it")
		return "", false
	}
	log.Info().Int64("fence", c.Fence).Str("to", logval.String(to.Instance)).Int64("to_fence", next).
		Int64("took_us", took.Microseconds()).Msg("lease handed over to a contender standing by")
	return to.Instance, true
}

func (a *leaseActor) setTimer(at time.Duration) {
	a.stopTimer()
	if at == machine.NoWake {
		return
	}
	a.timerID++
	id, sys, self := a.timerID, a.sys, a.self
	d := max(at-a.now(), 0)
	a.timer = time.AfterFunc(d, func() { sys.Root.Send(self, &tick{gen: id}) })
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
	return s
}

// backstopRelease runs when the actor is stopped without having finished
// the graceful path (its parent stopped it outright): its worker has
// already terminated (protoactor stops children first), so the grant is
// released here, synchronously and bounded, so the system's shutdown still
// waits for the write to land.
func (a *leaseActor) backstopRelease() {
	if a.m == nil || a.o.Unleased || !a.m.HoldsCustody() {
		return
	}
	a.releaseNow(a.m.Custody(), events.ReasonShutdown)
}

// releaseNow releases c synchronously, bounded by callBound, and publishes
// the outcome.
func (a *leaseActor) releaseNow(c fence.Custody, reason string) {
	begun, err := releaseBounded(a.o.Store, c, callBound)
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("release unanswered after %s", callBound)
	}
	if err == nil && !a.o.Unleased {
		a.o.Contenders.NudgeOthers(c.Lease)
	}
	e := events.Custody{Kind: events.LeaseReleased, Lease: c.Lease, Instance: c.Holder, Fence: c.Fence, Reason: reason, At: begun}
	if err != nil {
		e.Kind, e.Reason, e.Err, e.At = events.LeaseLost, events.ReasonError, err, time.Time{}
	}
	a.publish(e)
}

// unleasedStore grants at once and forever, with fence 0 (unfenced).
type unleasedStore struct{}

func (unleasedStore) Acquire(context.Context, string, string) (leasestore.Grant, error) {
	return leasestore.Grant{Granted: true}, nil
}
func (unleasedStore) Renew(context.Context, fence.Custody) error   { return nil }
func (unleasedStore) Release(context.Context, fence.Custody) error { return nil }
