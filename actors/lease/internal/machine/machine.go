// Package machine is the custody state machine of one named lease in one
// instance: pure (time and inputs in, commands out), driven by the
// LeaseActor of package lease, which carries the commands out. See
// actors/lease/doc.go for the states and the guarantee.
package machine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/events"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/leasestore"
)

// Supervision and retry policy. Durations are wall time on the local
// monotonic clock.
const (
	// RestartBackoffMin is the delay before the first restart of a failed
	// worker; it doubles per failure in the window up to restartBackoffMax.
	RestartBackoffMin = 100 * time.Millisecond
	restartBackoffMax = 10 * time.Second
	// MaxFailures failures within failureWindow make the holder give the
	// lease up (worker.failed) so another instance can try.
	MaxFailures   = 5
	failureWindow = time.Minute
	// WorkerStopTimeout bounds how long any stop of the worker (graceful,
	// on a loss of custody, after repeated failures) waits for it: then
	// worker.stuck is published and the machine moves on as if the worker
	// had stopped (releases, or contends again). The stuck worker's
	// writes are fenced under a custody that has ended or is being
	// released, so it cannot land anything.
	WorkerStopTimeout = 10 * time.Second
	// releaseAttempts bounds the release retries on shutdown.
	releaseAttempts   = 3
	releaseRetryDelay = 100 * time.Millisecond
	// minRenewRetry is the floor of the delay after a failed renewal.
	minRenewRetry = 50 * time.Millisecond
	// NudgeSpacing is the minimum gap between nudge-triggered acquire
	// attempts: a flood of nudges costs at most one attempt per spacing.
	NudgeSpacing = 10 * time.Millisecond
	// expiryMargin is added to the contended grant's time left so the
	// attempt lands just after the expiry on the database's clock.
	expiryMargin = time.Millisecond
)

// ErrStoreStuck fails an attempt the shell did not make because earlier
// store calls of the same kind have not returned (the driver ignores
// contexts, so each keeps a goroutine and a pool connection until the
// database answers). The attempt never reached the database, so it cannot
// have committed.
var ErrStoreStuck = errors.New("earlier lease store calls have not returned (the database is slow to answer, or another writer holds its write lock); not starting another")

// ErrNotAttempted answers an AcquireCmd with AfterVacancy whose watch was
// called off (the instance is stopping) before the acquire was made: like
// ErrStoreStuck, it never reached the database as a write, so it cannot
// have committed.
var ErrNotAttempted = errors.New("acquire not attempted: the instance stopped while it waited for the lease to be released")

// errCallTimeout is the error recorded for a store call that did not answer
// within the call timeout (RenewDeadline/2).
var errCallTimeout = errors.New("lease store call timed out")

// errWorkerExited is the failure recorded when a worker stops on its own
// while custody lasts.
var errWorkerExited = errors.New("worker stopped on its own")

// NoWake is WakeCmd.At when nothing is due.
const NoWake time.Duration = -1

// Input is an event fed to the Machine.
type Input interface{ isInput() }

// Inputs.
type (
	// Start begins contending.
	Start struct{}
	// Tick is a timer wake-up (see WakeCmd).
	Tick struct{}
	// StopRequested asks for a graceful stop: stop the worker, release.
	StopRequested struct{}
	// Nudge says a holder just released: try to acquire now.
	Nudge struct{}
	// Standby says the holder announced it is about to release: when no
	// acquire is in flight (nor due to wait for a cool-down or a stop),
	// the next attempt is issued now as an AcquireCmd with AfterVacancy,
	// which the shell makes once it sees the row free (or its watch
	// ends). A Standby is otherwise ignored; the nudge after the release
	// still comes.
	Standby struct{}
	// AcquireResult answers AcquireCmd Seq.
	AcquireResult struct {
		Seq   uint64
		Grant leasestore.Grant
		Err   error
		// At is the wall time the store call returned: a grant's
		// lease.acquired carries it (zero: the shell stamps its own).
		At time.Time
		// Elapsed is how long the call ran, from its start (a Standby's
		// watch included) to the read that answered it, on the local
		// clock; 0 when unknown. A grant of this process that the call
		// did not make is adopted only if it is no older than that (see
		// adoptable).
		Elapsed time.Duration
		// HandedOver: a Standby's watch found the grant handed to this
		// process (Grant.Own, not Granted) and made no acquire. Such a
		// grant that cannot be adopted is handed back.
		HandedOver bool
	}
	// RenewResult answers RenewCmd Seq; Err wraps ErrSuperseded when the
	// row no longer matched.
	RenewResult struct {
		Seq uint64
		Err error
	}
	// ReleaseResult answers ReleaseCmd Seq.
	ReleaseResult struct {
		Seq uint64
		Err error
		// At is the wall time the store call began, before the release
		// committed: lease.released carries it, so it precedes any
		// successor's lease.acquired (zero: the shell stamps its own).
		At time.Time
		// HandedTo names the contender the release handed the lease to
		// (leasestore.Store.Transfer); "" for a release in place.
		// lease.released carries it as its holder.
		HandedTo string
	}
	// WorkerStopped reports that worker Gen has terminated.
	WorkerStopped struct{ Gen int }
	// YieldRequested asks the holder to give the lease to a healthier
	// contender: its worker has reported itself unhealthy for the yield
	// grace and some contender reports healthy (the shell checks both;
	// see actors/lease). The machine yields only while holding, and only
	// once it has held custody for the minimum holding time (SetMinHold):
	// it stops the worker gracefully, releases (reason yielded) and does
	// not contend again for one TTL, so the contender, nudged by the
	// release, gets there first. Reason is published with lease.yielded.
	YieldRequested struct{ Reason error }
	// WorkerFailed reports that worker Gen failed (panicked); it is
	// suspended until restarted or stopped.
	WorkerFailed struct {
		Gen    int
		Reason error
	}
)

func (Start) isInput()          {}
func (YieldRequested) isInput() {}
func (Tick) isInput()           {}
func (StopRequested) isInput()  {}
func (Nudge) isInput()          {}
func (Standby) isInput()        {}
func (AcquireResult) isInput()  {}
func (RenewResult) isInput()    {}
func (ReleaseResult) isInput()  {}
func (WorkerStopped) isInput()  {}
func (WorkerFailed) isInput()   {}

// Command is an action the Machine asks its shell to carry out.
type Command interface{ isCommand() }

// Commands.
type (
	// AcquireCmd: call Store.Acquire and answer with AcquireResult{Seq}.
	// AfterVacancy (a Standby's attempt): first read the lease row until it
	// is free, another grant replaces the one first read, or a bound well
	// inside the call timeout passes, then call Store.Acquire; answer
	// ErrNotAttempted when the watch is called off before it.
	AcquireCmd struct {
		Seq          uint64
		AfterVacancy bool
	}
	// RenewCmd: call Store.Renew(Custody) and answer with RenewResult{Seq}.
	RenewCmd struct {
		Seq     uint64
		Custody fence.Custody
	}
	// ReleaseCmd: call Store.Release(Custody) and answer with
	// ReleaseResult{Seq}. Stale is true for the release of a grant that
	// arrived too late to use; its answer may be dropped.
	ReleaseCmd struct {
		Seq     uint64
		Custody fence.Custody
		Stale   bool
		// LateAcquire marks a Stale release of a grant that an abandoned
		// acquire obtained after the machine stopped waiting for it (as
		// opposed to a grant a late renewal extended): the database
		// changed custody to this instance without the machine acting on
		// it, so once the hand-back lands both changes are published.
		LateAcquire bool
	}
	// SpawnWorkerCmd: spawn worker Gen under Custody.
	SpawnWorkerCmd struct {
		Gen     int
		Custody fence.Custody
	}
	// RestartWorkerCmd: restart the failed (suspended) worker Gen in place.
	RestartWorkerCmd struct{ Gen int }
	// StopWorkerCmd: stop worker Gen; Graceful lets it drain its mailbox
	// (poison) rather than stopping after the current message.
	StopWorkerCmd struct {
		Gen      int
		Graceful bool
	}
	// EmitCmd: publish Event (the shell stamps the wall time unless
	// Event.At is set: when a grant's acquire returned, when a release
	// began; see events.Custody.At).
	EmitCmd struct{ Event events.Custody }
	// WakeCmd: deliver Tick at At on the machine's clock (NoWake: nothing due).
	WakeCmd struct{ At time.Duration }
	// FinishedCmd: the machine is done; the shell may stop.
	FinishedCmd struct{}
)

func (AcquireCmd) isCommand()       {}
func (RenewCmd) isCommand()         {}
func (ReleaseCmd) isCommand()       {}
func (SpawnWorkerCmd) isCommand()   {}
func (RestartWorkerCmd) isCommand() {}
func (StopWorkerCmd) isCommand()    {}
func (EmitCmd) isCommand()          {}
func (WakeCmd) isCommand()          {}
func (FinishedCmd) isCommand()      {}

// Phase is the custody phase (see doc.go for the diagram).
type Phase int

// Phases.
const (
	PhaseIdle       Phase = iota // not started
	PhaseContending              // no custody; acquire attempts
	PhaseHolding                 // custody; worker running (or being restarted)
	PhaseStopping                // worker being stopped (custody lost, failed or shutting down)
	PhaseReleasing               // worker stopped; release in flight
	PhaseDone                    // finished; nothing more will happen
)

func (p Phase) String() string {
	switch p {
	case PhaseIdle:
		return "idle"
	case PhaseContending:
		return "contending"
	case PhaseHolding:
		return "holding"
	case PhaseStopping:
		return "stopping"
	case PhaseReleasing:
		return "releasing"
	case PhaseDone:
		return "done"
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// stopCause says why the worker is being stopped, which decides what
// follows once it has stopped.
type stopCause int

const (
	causeNone     stopCause = iota
	causeLost               // custody lost: never release; contend again or finish
	causeShutdown           // stop requested: release, then finish
	causeFailed             // worker failed too often: release, cool down, contend again
	causeStale              // grant too late to trust: release, contend again
	causeYield              // worker unhealthy, a contender healthy: release, cool down, contend again
)

type callKind int

const (
	callNone callKind = iota
	callAcquire
	callRenew
)

type workerPhase int

const (
	workerNone      workerPhase = iota
	workerRunning               // spawned or restarted, not failed
	workerSuspended             // failed; awaiting restart or stop
	workerStopping              // stop ordered; awaiting WorkerStopped
)

// Machine is the custody state machine of one named lease in one instance.
// It is pure: time is passed in (a monotonic duration since any origin),
// inputs go in, commands come out, and randomness comes from the seeded
// source given to New. Not safe for concurrent use.
type Machine struct {
	// What the machine is for; fixed at New.
	name, holder string
	t            leasestore.Timing
	callTimeout  time.Duration
	rng          *rand.Rand

	phase         Phase
	cause         stopCause
	stopRequested bool
	lastErr       error // the last store error (nil after a success)

	custody custodyState
	contend contendState
	call    callState
	release releaseState
	worker  workerState

	// minHold is how long custody must have lasted before a yield is
	// taken (SetMinHold): a new holder cannot hand the lease straight
	// back, so two instances whose health flickers cannot flap.
	minHold time.Duration

	seq uint64    // the last command Seq issued
	out []Command // the commands of the Step in progress
}

// custodyState is the grant this machine holds, has held, or gave up.
type custodyState struct {
	fence        int64         // fence of the custody we hold (0: none)
	since        time.Duration // when the current custody's acquire attempt started
	trustedUntil time.Duration // local deadline: start of last successful attempt + RenewDeadline
	nextRenewAt  time.Duration
	// heldFence is the highest fence this machine was granted.
	heldFence int64
	// lostFence is a grant given up without a release (blackout, error):
	// still ours in the database until its TTL, released once its worker
	// has stopped and we see it (or stop).
	lostFence int64
	// gaveBack is the highest fence this machine handed back (a late or
	// unused grant of its own, ReleaseCmd Stale): never adopted again.
	gaveBack int64
	// handBacks are fences whose grant a late renewal extended after
	// custody was given up; each is released once its worker has stopped.
	handBacks []int64
}

// contendState paces the acquire attempts of a contender.
type contendState struct {
	nextAcquireAt time.Duration
	cooldownUntil time.Duration // after giving the lease up (worker failed): no attempt before
	nudged        bool          // a nudge arrived while an acquire was in flight
	lastNudge     time.Duration // when the last nudged attempt was (or is) due
	everNudge     bool          // lastNudge is set
	// acquireUnsure: an acquire answered with an error, which may have
	// committed (a remote database whose answer was lost): a grant to this
	// holder with a fence above heldFence, made since unsureSince (the
	// start of the first such call), is then ours, unused. The time check
	// keeps a grant of another process that wrongly shares our instance_id
	// (made before our call) from being taken for ours.
	acquireUnsure bool
	unsureSince   time.Duration
}

// callState is the acquire or renew call in flight (at most one) and the
// calls given up on whose answers may still come.
type callState struct {
	kind  callKind
	seq   uint64
	start time.Duration
	fence int64 // fence a renew in flight is for
	// abandonedAcquires are acquire attempts given up on; a late grant is
	// released.
	abandonedAcquires map[uint64]bool
	// abandonedRenews maps renew attempts given up on to their fence: a
	// late "superseded" answer is still news.
	abandonedRenews map[uint64]int64
}

// releaseState is the release of the grant in progress (PhaseReleasing).
type releaseState struct {
	inFlight bool
	seq      uint64
	start    time.Duration
	tries    int
	nextAt   time.Duration
	reason   string
}

// workerState is the worker of the current custody and its supervision.
type workerState struct {
	phase     workerPhase
	gen       int
	fence     int64 // the fence worker gen was spawned under
	stopBy    time.Duration
	respawn   bool // Holding with no worker: spawn one at restartAt
	restartAt time.Duration
	failures  []time.Duration // failure times within failureWindow
	lastErr   error
}

// New returns a machine for lease name held as holder. rng supplies
// the retry jitter; pass a seeded source for reproducible runs.
func New(name, holder string, t leasestore.Timing, rng *rand.Rand) *Machine {
	return &Machine{
		name: name, holder: holder, t: t, rng: rng,
		callTimeout: t.RenewDeadline / 2,
		call:        callState{abandonedAcquires: map[uint64]bool{}, abandonedRenews: map[uint64]int64{}},
	}
}

// Phase is the current phase.
func (m *Machine) Phase() Phase { return m.phase }

// Custody is the custody this machine holds (Fence 0 when none).
func (m *Machine) Custody() fence.Custody {
	return fence.Custody{Lease: m.name, Holder: m.holder, Fence: m.custody.fence}
}

// TrustedUntil is the local deadline of the current custody (0 when none).
func (m *Machine) TrustedUntil() time.Duration {
	if !m.HoldsCustody() {
		return 0
	}
	return m.custody.trustedUntil
}

// LastErr is the last store error seen (nil after a success).
func (m *Machine) LastErr() error { return m.lastErr }

// WorkerActive reports whether a worker is alive (running, restarting or
// draining) under custody the machine still trusts (used by tests and
// /debug/leases).
func (m *Machine) WorkerActive() bool {
	return m.HoldsCustody() && m.worker.phase != workerNone
}

// Step feeds one input at time now and returns the commands to carry out,
// in order. The last command is always a WakeCmd.
func (m *Machine) Step(now time.Duration, in Input) []Command {
	m.out = nil
	if m.phase == PhaseDone {
		return []Command{WakeCmd{At: NoWake}}
	}
	// Time first: a deadline that has passed wins over any input that
	// arrives at the same moment, so a late success cannot revive custody.
	m.expire(now)
	switch in := in.(type) {
	case Start:
		if m.phase == PhaseIdle {
			m.phase = PhaseContending
			m.contend.nextAcquireAt = now
		}
	case Tick:
	case StopRequested:
		m.onStop(now)
	case Nudge:
		m.onNudge(now)
	case Standby:
		m.onStandby(now)
	case AcquireResult:
		m.onAcquire(now, in)
	case RenewResult:
		m.onRenew(now, in)
	case ReleaseResult:
		m.onRelease(now, in)
	case WorkerStopped:
		m.onWorkerStopped(now, in)
	case WorkerFailed:
		m.onWorkerFailed(now, in)
	case YieldRequested:
		m.onYield(now, in)
	}
	m.advance(now)
	m.flushHandBacks()
	if m.phase == PhaseDone {
		m.out = append(m.out, FinishedCmd{}, WakeCmd{At: NoWake})
	} else {
		m.out = append(m.out, WakeCmd{At: m.nextWake()})
	}
	return m.out
}

// HoldsCustody reports whether the machine holds a grant it has not given
// up: holding, or stopping its worker for a reason other than loss.
func (m *Machine) HoldsCustody() bool {
	switch m.phase {
	case PhaseHolding:
		return true
	case PhaseStopping:
		return m.cause == causeShutdown || m.cause == causeFailed || m.cause == causeYield
	}
	return false
}

func (m *Machine) emit(kind events.Kind, fence int64, reason string, err error) {
	m.emitAt(kind, fence, reason, err, time.Time{})
}

// emitAt is emit with the event's wall time (zero: the shell's).
func (m *Machine) emitAt(kind events.Kind, fence int64, reason string, err error, at time.Time) {
	m.emitCustody(events.Custody{Kind: kind, Fence: fence, Reason: reason, Err: err, At: at})
}

// emitCustody emits e as this machine's event (its lease and instance).
func (m *Machine) emitCustody(e events.Custody) {
	e.Lease, e.Instance = m.name, m.holder
	m.out = append(m.out, EmitCmd{Event: e})
}

func (m *Machine) nextSeq() uint64 { m.seq++; return m.seq }

func (m *Machine) expire(now time.Duration) {
	if !m.HoldsCustody() || now < m.custody.trustedUntil {
		return
	}
	// A blackout is a database that did not answer: a call still pending
	// or abandoned, or failures that say it could not be reached or served
	// (database.Unavailable: connection refused, HTTP 5xx, Hrana timeouts,
	// locked past busy_timeout). An answer that something is wrong (an I/O
	// error, a read-only or replaced file) is reason error.
	reason, err := events.ReasonBlackout, m.lastErr
	if m.call.kind == callNone && m.lastErr != nil && !errors.Is(m.lastErr, errCallTimeout) && !database.Unavailable(m.lastErr) {
		reason = events.ReasonError
	}
	if err == nil {
		err = fmt.Errorf("no renewal succeeded within %s", m.t.RenewDeadline)
	}
	m.lose(now, reason, err)
}

// lose gives custody up without a release: the database may already have
// granted it to someone else, so the worker stops at once.
func (m *Machine) lose(now time.Duration, reason string, err error) {
	m.emit(events.LeaseLost, m.custody.fence, reason, err)
	if reason != events.ReasonSuperseded {
		m.custody.lostFence = m.custody.fence
	}
	m.custody.fence = 0
	m.cause = causeLost
	m.phase = PhaseStopping
	m.worker.respawn = false
	m.stopWorker(now, false)
}

// stopWorker orders the worker to stop, or if there is none moves on.
func (m *Machine) stopWorker(now time.Duration, graceful bool) {
	switch m.worker.phase {
	case workerNone:
		m.afterWorkerStopped(now)
	case workerSuspended:
		// A suspended mailbox takes no user messages: poison would never
		// be read, so a failed worker is always stopped, not poisoned.
		m.out = append(m.out, StopWorkerCmd{Gen: m.worker.gen})
		m.worker.phase = workerStopping
		m.worker.stopBy = now + WorkerStopTimeout
	case workerRunning:
		m.out = append(m.out, StopWorkerCmd{Gen: m.worker.gen, Graceful: graceful})
		m.worker.phase = workerStopping
		m.worker.stopBy = now + WorkerStopTimeout
	case workerStopping:
		if !graceful {
			// A harsher order (a loss during a drain): the worker gets
			// its full bound from now, not what a paused process left of
			// the first one.
			m.out = append(m.out, StopWorkerCmd{Gen: m.worker.gen})
			m.worker.stopBy = now + WorkerStopTimeout
		}
	}
}

func (m *Machine) onStop(now time.Duration) {
	if m.stopRequested {
		return
	}
	m.stopRequested = true
	switch m.phase {
	case PhaseIdle:
		m.finish()
	case PhaseContending:
		switch {
		case m.call.kind == callAcquire:
			// an acquire is in flight; its answer decides (a grant is released)
		case m.contend.acquireUnsure:
			// An earlier acquire may have been granted unbeknown to us:
			// one more attempt finds out (a grant, or our own row, is
			// then released).
			m.call.kind, m.call.seq, m.call.start = callAcquire, m.nextSeq(), now
			m.out = append(m.out, AcquireCmd{Seq: m.call.seq})
		default:
			m.finish()
		}
	case PhaseHolding:
		m.cause = causeShutdown
		m.phase = PhaseStopping
		m.worker.respawn = false
		m.worker.stopBy = now + WorkerStopTimeout
		m.stopWorker(now, true)
	case PhaseStopping:
		if m.cause == causeFailed || m.cause == causeYield {
			m.cause = causeShutdown
		}
		m.worker.stopBy = now + WorkerStopTimeout
	}
}

// SetMinHold sets the minimum holding time before a YieldRequested is
// taken (0: none).
func (m *Machine) SetMinHold(d time.Duration) { m.minHold = d }

// HeldFor is how long the current custody has lasted at now (0 when none).
func (m *Machine) HeldFor(now time.Duration) time.Duration {
	if m.phase != PhaseHolding {
		return 0
	}
	return now - m.custody.since
}

func (m *Machine) onYield(now time.Duration, y YieldRequested) {
	if m.phase != PhaseHolding || m.stopRequested || now-m.custody.since < m.minHold {
		return
	}
	reason := y.Reason
	if reason == nil {
		reason = errors.New("worker unhealthy, a contender healthy")
	}
	m.emit(events.LeaseYielded, m.custody.fence, events.ReasonYielded, reason)
	m.cause = causeYield
	m.phase = PhaseStopping
	m.worker.respawn = false
	m.stopWorker(now, true)
}

func (m *Machine) finish() {
	m.phase = PhaseDone
	m.custody.fence = 0
	if m.custody.lostFence > 0 {
		// Our grant, given up unreleased, its worker stopped: hand it back
		// so the next holder need not wait out its TTL.
		m.handBackOwn(m.custody.lostFence, false)
	}
}

// grantedSinceUnsure reports whether a grant age old at now (database
// clock) was made after the first errored acquire since the last clean
// answer started: only then can it be that acquire's. The slack covers
// the database's millisecond timestamps and a clock rate a little off the
// database's (docs/spec.md and docs/lease.md: NTP-disciplined hosts).
func (m *Machine) grantedSinceUnsure(now, age time.Duration) bool {
	window := now - m.contend.unsureSince
	return age <= window+unsureSlack+window/100
}

// unsureSlack: see grantedSinceUnsure.
const unsureSlack = 20 * time.Millisecond

// adoptable reports whether r's grant, one the call did not make, is this
// process's to take custody of: its own (nonce) and live, newer than any
// fence it held, neither custody it gave up (lostFence), nor possibly the
// late commit of an acquire that errored (acquireUnsure: handed back, as
// before handovers), nor one it handed back; and granted since the call
// began (its age, read by the call, within the call's Elapsed, with the
// slack of grantedSinceUnsure for the database's millisecond clock and
// the clocks' rates). Such a grant was handed over by its former holder
// (leasestore.Store.Transfer) to this process standing by, and the watch's
// read (or the acquire) found it. One too old to trust is adopted all the
// same and released at once as a stale grant, so the lease does not sit
// idle for its TTL.
func (m *Machine) adoptable(now time.Duration, r AcquireResult) bool {
	g := r.Grant
	return !g.Granted && g.Own && g.TimeLeft > 0 && g.Fence > 0 &&
		g.Fence > m.custody.heldFence && g.Fence != m.custody.lostFence && g.Fence > m.custody.gaveBack &&
		!(m.contend.acquireUnsure && m.grantedSinceUnsure(now, g.Age)) &&
		g.Age <= r.Elapsed+unsureSlack+r.Elapsed/100
}

// adoptSlack is how much earlier than its call's start an adopted grant
// (adoptable) can have been made: the attribution's slack (unsureSlack
// and 1% of the call for the clocks' rates), the database's millisecond
// rounding of the grant's age, and the moment between the read and the
// call's answer. An adopted grant is trusted from that much before the
// call's start.
func adoptSlack(elapsed time.Duration) time.Duration {
	return unsureSlack + elapsed/100 + 2*time.Millisecond
}

// handBackOwn releases grant fence, which this holder has in the database
// and does not use.
func (m *Machine) handBackOwn(f int64, acquired bool) {
	if f == m.custody.lostFence {
		m.custody.lostFence = 0
	}
	m.custody.gaveBack = max(m.custody.gaveBack, f)
	m.out = append(m.out, ReleaseCmd{Seq: m.nextSeq(), Stale: true, LateAcquire: acquired,
		Custody: fence.Custody{Lease: m.name, Holder: m.holder, Fence: f}})
}

func (m *Machine) onNudge(now time.Duration) {
	if m.phase != PhaseContending || m.stopRequested {
		return
	}
	if m.call.kind == callAcquire {
		m.contend.nudged = true // acted on when the attempt in flight answers
		return
	}
	m.nudgeAttempt(now)
}

// onStandby issues the attempt of an announced release at once (see
// Standby). The call's start, from which a grant's trust window runs, is
// now, before the watch: the window can only come out shorter.
func (m *Machine) onStandby(now time.Duration) {
	if m.phase != PhaseContending || m.stopRequested || m.call.kind != callNone || now < m.contend.cooldownUntil {
		return
	}
	m.call.kind, m.call.seq, m.call.start = callAcquire, m.nextSeq(), now
	m.out = append(m.out, AcquireCmd{Seq: m.call.seq, AfterVacancy: true})
}

// nudgeAttempt brings the next acquire attempt forward to now, or to
// NudgeSpacing after the last nudged attempt if that is later. Every path
// by which a nudge causes an attempt goes through here, so a flood costs
// at most one attempt per spacing; a nudge inside the spacing is deferred,
// not dropped, because it may announce a release the last attempt missed.
func (m *Machine) nudgeAttempt(now time.Duration) {
	at := now
	if m.contend.everNudge {
		at = max(at, m.contend.lastNudge+NudgeSpacing)
	}
	if at < m.contend.nextAcquireAt {
		m.contend.nextAcquireAt = at
		m.contend.everNudge, m.contend.lastNudge = true, at
	}
}

func (m *Machine) onAcquire(now time.Duration, r AcquireResult) {
	if m.call.abandonedAcquires[r.Seq] {
		delete(m.call.abandonedAcquires, r.Seq)
		if r.Err == nil && (r.Grant.Granted || r.HandedOver) && r.Grant.Fence != m.custody.fence {
			// Granted after we stopped waiting: hand it straight back so
			// the lease does not sit idle until its TTL.
			m.custody.gaveBack = max(m.custody.gaveBack, r.Grant.Fence)
			m.out = append(m.out, ReleaseCmd{Seq: m.nextSeq(), Stale: true, LateAcquire: true,
				Custody: fence.Custody{Lease: m.name, Holder: m.holder, Fence: r.Grant.Fence}})
		}
		return
	}
	if m.call.kind != callAcquire || r.Seq != m.call.seq {
		return
	}
	m.call.kind = callNone
	nudged := m.contend.nudged
	m.contend.nudged = false
	if r.Err != nil {
		m.lastErr = r.Err
		if !errors.Is(r.Err, ErrStoreStuck) && !errors.Is(r.Err, ErrNotAttempted) && !errors.Is(r.Err, database.ErrFileReplaced) && !m.contend.acquireUnsure {
			// It may have committed before the answer was lost.
			m.contend.acquireUnsure, m.contend.unsureSince = true, m.call.start
		}
		if m.stopRequested {
			m.finish()
			return
		}
		m.contend.nextAcquireAt = now + m.jitter(m.t.RetryInterval)
		return
	}
	m.lastErr = nil
	g := r.Grant
	start, reason := m.call.start, ""
	if m.adoptable(now, r) {
		// A grant handed to this process by its former holder
		// (leasestore.Store.Transfer) while the call ran: trusted from
		// the call's start less the slack the attribution allowed and
		// the database's millisecond rounding (adoptSlack), so from
		// before it was granted, as an acquire's own grant is.
		start, reason = m.call.start-adoptSlack(r.Elapsed), events.ReasonHandedOver
		g.Granted = true
	}
	if !g.Granted {
		// Own, not a holder string equal to ours: another process
		// configured with our instance_id holds grants under our holder
		// string, and releasing one of those would start a second worker.
		if g.Own && g.TimeLeft > 0 && g.Fence > 0 &&
			(g.Fence == m.custody.lostFence || (m.contend.acquireUnsure && g.Fence > m.custody.heldFence && m.grantedSinceUnsure(now, g.Age)) ||
				((r.HandedOver || !m.contend.acquireUnsure) && g.Fence > m.custody.heldFence && g.Fence > m.custody.gaveBack)) {
			// Our own grant, unused: an acquire whose answer was lost
			// after it committed, custody given up whose worker has
			// stopped, or a handover this machine cannot take (found
			// too late by its watch, or landed after the call that
			// could have adopted it). Hand it back rather than contend
			// against it for a TTL (and leave it behind on shutdown).
			// With an errored acquire unsure, only one granted since
			// that acquire began is handed back, as before handovers.
			m.handBackOwn(g.Fence, g.Fence > m.custody.heldFence)
		}
		m.contend.acquireUnsure = false
		// A grant of this very process (its nonce) that the machine does
		// not use: an acquire that committed after it was given up, handed
		// back when its late answer comes (or just above), or custody given
		// up. Not "another instance": the event says so (stale-grant).
		reason := ""
		if g.Own {
			reason = events.ReasonStaleGrant
		}
		m.out = append(m.out, EmitCmd{Event: events.Custody{Kind: events.LeaseContended,
			Lease: m.name, Instance: m.holder, Fence: g.Fence, Holder: g.Holder, TimeLeft: g.TimeLeft, Reason: reason}})
		if m.stopRequested {
			m.finish()
			return
		}
		wait := m.jitter(m.t.RetryInterval)
		if left := max(g.TimeLeft, 0) + expiryMargin; left < wait {
			wait = left
		}
		m.contend.nextAcquireAt = max(now+wait, m.contend.cooldownUntil)
		if nudged {
			m.nudgeAttempt(now)
		}
		return
	}
	m.custody.fence = g.Fence
	m.custody.heldFence = max(m.custody.heldFence, g.Fence)
	m.contend.acquireUnsure = false
	m.custody.lostFence = 0 // it ran out or was released, or this grant could not be
	m.emitAt(events.LeaseAcquired, g.Fence, reason, nil, r.At)
	switch {
	case m.stopRequested:
		m.startRelease(now, causeShutdown, events.ReasonShutdown)
	case now-start >= m.t.RenewDeadline:
		m.startRelease(now, causeStale, events.ReasonStaleGrant)
	default:
		m.phase = PhaseHolding
		m.cause = causeNone
		m.custody.since = start
		m.custody.trustedUntil = start + m.t.RenewDeadline
		m.custody.nextRenewAt = start + m.t.RenewInterval
		m.worker.failures = m.worker.failures[:0]
		m.spawn()
	}
}

func (m *Machine) spawn() {
	m.worker.gen++
	m.worker.fence = m.custody.fence
	m.worker.phase = workerRunning
	m.worker.respawn = false
	m.out = append(m.out, SpawnWorkerCmd{Gen: m.worker.gen, Custody: m.Custody()})
	m.emit(events.WorkerStarted, m.custody.fence, "", nil)
}

// RenewalEndsCustody reports whether a renewal's error ends custody at
// once rather than being retried until the renew deadline: the row no
// longer carries this grant (fence.ErrSuperseded), or the grant lives in a
// database file deleted or replaced under the process
// (database.ErrFileReplaced), which no other instance can open any more,
// so no renewal will ever land where they look and one of them may hold
// the lease in the new file already.
func RenewalEndsCustody(err error) bool {
	return errors.Is(err, fence.ErrSuperseded) || errors.Is(err, database.ErrFileReplaced)
}

func (m *Machine) onRenew(now time.Duration, r RenewResult) {
	if f, ok := m.call.abandonedRenews[r.Seq]; ok {
		delete(m.call.abandonedRenews, r.Seq)
		switch {
		case errors.Is(r.Err, fence.ErrSuperseded) && m.HoldsCustody() && f == m.custody.fence:
			m.lastErr = r.Err
			m.lose(now, events.ReasonSuperseded, r.Err)
		case r.Err == nil:
			m.handBack(f)
		}
		return
	}
	if m.call.kind != callRenew || r.Seq != m.call.seq {
		return
	}
	m.call.kind = callNone
	if !m.HoldsCustody() {
		// Custody already given up: a late success cannot revive it, but
		// it did extend the grant in the database.
		if r.Err == nil {
			m.handBack(m.call.fence)
		}
		return
	}
	switch {
	case r.Err == nil:
		m.lastErr = nil
		// The window runs from the start of the attempt: a slow success
		// cannot stretch it.
		m.custody.trustedUntil = max(m.custody.trustedUntil, m.call.start+m.t.RenewDeadline)
		m.custody.nextRenewAt = m.call.start + m.t.RenewInterval
		m.emit(events.LeaseRenewed, m.custody.fence, "", nil)
	case RenewalEndsCustody(r.Err):
		m.lastErr = r.Err
		reason := events.ReasonError
		if errors.Is(r.Err, fence.ErrSuperseded) {
			reason = events.ReasonSuperseded
		}
		m.lose(now, reason, r.Err)
	default:
		m.lastErr = r.Err
		m.custody.nextRenewAt = now + max(m.t.RenewInterval/4, minRenewRetry)
	}
}

// handBack queues the release of grant fence after a renewal of it
// succeeded too late: custody was already given up, so the extension it
// wrote would leave the lease idle for a TTL (this instance included would
// contend against it). A grant still in use, or being released by the
// machine itself, is left alone; an older fence matches nothing, so the
// release is harmless.
func (m *Machine) handBack(fence int64) {
	if fence == 0 || (fence == m.custody.fence && (m.HoldsCustody() || m.phase == PhaseReleasing)) {
		return
	}
	if fence == m.custody.lostFence {
		m.custody.lostFence = 0 // released here
	}
	m.custody.handBacks = append(m.custody.handBacks, fence)
}

// flushHandBacks issues the queued hand-backs, except one whose worker is
// still stopping: until it has stopped, the grant keeps every other
// instance's worker from starting beside it.
func (m *Machine) flushHandBacks() {
	keep := m.custody.handBacks[:0]
	for _, f := range m.custody.handBacks {
		if m.phase != PhaseDone && m.worker.phase != workerNone && m.worker.fence == f {
			keep = append(keep, f)
			continue
		}
		m.out = append(m.out, ReleaseCmd{Seq: m.nextSeq(), Stale: true,
			Custody: fence.Custody{Lease: m.name, Holder: m.holder, Fence: f}})
	}
	m.custody.handBacks = keep
}

func (m *Machine) startRelease(now time.Duration, cause stopCause, reason string) {
	m.cause = cause
	m.phase = PhaseReleasing
	m.release.reason = reason
	m.release.tries = 0
	m.release.inFlight = false
	m.release.nextAt = now
}

func (m *Machine) onRelease(now time.Duration, r ReleaseResult) {
	if m.phase != PhaseReleasing || !m.release.inFlight || r.Seq != m.release.seq {
		return
	}
	m.release.inFlight = false
	switch {
	case r.Err == nil:
		m.emitCustody(events.Custody{Kind: events.LeaseReleased, Fence: m.custody.fence, Reason: m.release.reason,
			Holder: r.HandedTo, At: r.At})
	case errors.Is(r.Err, fence.ErrSuperseded):
		m.emit(events.LeaseLost, m.custody.fence, events.ReasonSuperseded, r.Err)
	default:
		m.release.tries++
		if m.release.tries < releaseAttempts {
			m.release.nextAt = now + releaseRetryDelay<<(m.release.tries-1)
			return
		}
		m.emit(events.LeaseLost, m.custody.fence, events.ReasonError,
			fmt.Errorf("release failed %d times, the grant will run out its TTL: %w", m.release.tries, r.Err))
	}
	m.afterRelease(now)
}

func (m *Machine) afterRelease(now time.Duration) {
	m.custody.fence = 0
	if m.stopRequested {
		m.finish()
		return
	}
	m.phase = PhaseContending
	switch m.cause {
	case causeFailed, causeYield:
		// Let another instance have a go before we try again.
		m.contend.cooldownUntil = now + m.t.TTL
		m.contend.nextAcquireAt = m.contend.cooldownUntil
	default:
		m.contend.nextAcquireAt = now
	}
	m.cause = causeNone
}

func (m *Machine) onWorkerStopped(now time.Duration, w WorkerStopped) {
	if w.Gen != m.worker.gen || m.worker.phase == workerNone {
		return
	}
	m.worker.phase = workerNone
	if m.phase == PhaseHolding {
		// A worker must not end its own custody; count it as a failure
		// and start a fresh one after a backoff.
		m.emit(events.WorkerStopped, m.worker.fence, "", errWorkerExited)
		m.recordFailure(now)
		if len(m.worker.failures) > MaxFailures {
			m.giveUp(now, errWorkerExited)
			return
		}
		m.worker.respawn = true
		m.worker.restartAt = now + m.backoff()
		return
	}
	m.emit(events.WorkerStopped, m.worker.fence, "", nil)
	if m.phase == PhaseStopping {
		m.afterWorkerStopped(now)
	}
}

func (m *Machine) afterWorkerStopped(now time.Duration) {
	switch m.cause {
	case causeLost:
		if m.stopRequested {
			m.finish()
			return
		}
		m.cause = causeNone
		m.phase = PhaseContending
		// Whoever caused the loss (another holder, a database that is down
		// or refuses writes) is still there: wait a retry interval rather
		// than spin through acquire, lose, acquire.
		m.contend.nextAcquireAt = max(now+m.jitter(m.t.RetryInterval), m.contend.cooldownUntil)
	case causeShutdown:
		m.startRelease(now, causeShutdown, events.ReasonShutdown)
	case causeFailed:
		m.startRelease(now, causeFailed, events.ReasonWorkerFailed)
	case causeYield:
		m.startRelease(now, causeYield, events.ReasonYielded)
	}
}

func (m *Machine) onWorkerFailed(now time.Duration, f WorkerFailed) {
	if f.Gen != m.worker.gen || m.worker.phase == workerNone {
		return
	}
	reason := f.Reason
	if reason == nil {
		reason = errors.New("worker failed")
	}
	if m.worker.phase == workerStopping {
		// Failed while draining: it is suspended now and would never read
		// a poison pill.
		m.out = append(m.out, StopWorkerCmd{Gen: m.worker.gen})
		return
	}
	m.worker.phase = workerSuspended
	if errors.Is(reason, fence.ErrSuperseded) {
		// A fenced write found another holder: the directive is Stop,
		// never Restart.
		if m.HoldsCustody() {
			m.lose(now, events.ReasonSuperseded, reason)
		} else {
			m.stopWorker(now, false)
		}
		return
	}
	if m.phase != PhaseHolding {
		m.stopWorker(now, false)
		return
	}
	m.recordFailure(now)
	if len(m.worker.failures) > MaxFailures {
		m.giveUp(now, reason)
		return
	}
	m.worker.lastErr = reason
	m.worker.restartAt = now + m.backoff()
}

func (m *Machine) recordFailure(now time.Duration) {
	keep := m.worker.failures[:0]
	for _, at := range m.worker.failures {
		if now-at < failureWindow {
			keep = append(keep, at)
		}
	}
	m.worker.failures = append(keep, now)
}

func (m *Machine) backoff() time.Duration {
	d := RestartBackoffMin << min(len(m.worker.failures)-1, 20)
	return min(d, restartBackoffMax)
}

// giveUp stops a worker that fails too often and releases the lease so
// another instance can try.
func (m *Machine) giveUp(now time.Duration, err error) {
	m.emit(events.WorkerFailed, m.worker.fence, "", fmt.Errorf("%d failures within %s, giving the lease up: %w", len(m.worker.failures), failureWindow, err))
	m.cause = causeFailed
	m.phase = PhaseStopping
	m.worker.respawn = false
	m.stopWorker(now, false)
}

// advance issues what is due at now.
func (m *Machine) advance(now time.Duration) {
	if m.phase == PhaseDone {
		return
	}
	if m.call.kind != callNone && now >= m.call.start+m.callTimeout {
		switch m.call.kind {
		case callAcquire:
			m.call.abandonedAcquires[m.call.seq] = true
		case callRenew:
			m.call.abandonedRenews[m.call.seq] = m.call.fence
		}
		m.lastErr = errCallTimeout
		m.call.kind = callNone
		m.contend.nudged = false
	}
	if m.phase == PhaseContending && m.stopRequested && m.call.kind != callAcquire {
		// Only an acquire in flight is worth waiting for (its grant must
		// be handed back); a renew left over from a lost custody is not.
		m.finish()
		return
	}
	if m.release.inFlight && now >= m.release.start+m.callTimeout {
		m.release.inFlight = false
		m.onReleaseTimeout(now)
		if m.phase == PhaseDone {
			return
		}
	}
	switch m.phase {
	case PhaseContending:
		if m.call.kind == callNone && !m.stopRequested && now >= m.contend.nextAcquireAt && now >= m.contend.cooldownUntil {
			m.call.kind, m.call.seq, m.call.start = callAcquire, m.nextSeq(), now
			m.out = append(m.out, AcquireCmd{Seq: m.call.seq})
		}
	case PhaseHolding:
		switch {
		case m.worker.phase == workerSuspended && now >= m.worker.restartAt:
			m.worker.phase = workerRunning
			m.out = append(m.out, RestartWorkerCmd{Gen: m.worker.gen})
			m.out = append(m.out, EmitCmd{Event: events.Custody{Kind: events.WorkerRestarted,
				Lease: m.name, Instance: m.holder, Fence: m.worker.fence,
				Attempt: len(m.worker.failures), Err: m.worker.lastErr}})
		case m.worker.phase == workerNone && m.worker.respawn && now >= m.worker.restartAt:
			m.spawn()
		}
	case PhaseStopping:
		if m.worker.phase == workerStopping && now >= m.worker.stopBy {
			// The worker did not stop in time (stuck in a call that
			// ignores its context). Move on without it: its writes are
			// fenced under a custody that has ended or is released next,
			// so they cannot land; its late termination is ignored.
			next := "contending again"
			switch {
			case m.cause == causeShutdown || m.stopRequested:
				next = "releasing anyway and stopping"
			case m.cause == causeFailed || m.cause == causeYield:
				next = "releasing anyway"
			}
			m.emit(events.WorkerStuck, m.worker.fence, "",
				fmt.Errorf("worker did not stop within %s; %s", WorkerStopTimeout, next))
			m.worker.phase = workerNone
			m.afterWorkerStopped(now)
		}
	}
	if m.HoldsCustody() && m.call.kind == callNone && now >= m.custody.nextRenewAt {
		m.call.kind, m.call.seq, m.call.start, m.call.fence = callRenew, m.nextSeq(), now, m.custody.fence
		m.out = append(m.out, RenewCmd{Seq: m.call.seq, Custody: m.Custody()})
	}
	if m.phase == PhaseReleasing && !m.release.inFlight && now >= m.release.nextAt {
		m.release.inFlight, m.release.seq, m.release.start = true, m.nextSeq(), now
		m.out = append(m.out, ReleaseCmd{Seq: m.release.seq, Custody: m.Custody()})
	}
}

func (m *Machine) onReleaseTimeout(now time.Duration) {
	m.release.tries++
	if m.release.tries < releaseAttempts {
		m.release.nextAt = now
		return
	}
	m.emit(events.LeaseLost, m.custody.fence, events.ReasonBlackout,
		fmt.Errorf("release unanswered %d times, the grant will run out its TTL: %w", m.release.tries, errCallTimeout))
	m.afterRelease(now)
}

// nextWake is the earliest moment something is due (NoWake: nothing).
func (m *Machine) nextWake() time.Duration {
	at := NoWake
	consider := func(t time.Duration) {
		if at == NoWake || t < at {
			at = t
		}
	}
	if m.call.kind != callNone {
		consider(m.call.start + m.callTimeout)
	}
	if m.release.inFlight {
		consider(m.release.start + m.callTimeout)
	}
	if m.HoldsCustody() {
		consider(m.custody.trustedUntil)
		if m.call.kind == callNone {
			consider(m.custody.nextRenewAt)
		}
	}
	switch m.phase {
	case PhaseContending:
		if m.call.kind == callNone && !m.stopRequested {
			consider(max(m.contend.nextAcquireAt, m.contend.cooldownUntil))
		}
	case PhaseHolding:
		if m.worker.phase == workerSuspended || (m.worker.phase == workerNone && m.worker.respawn) {
			consider(m.worker.restartAt)
		}
	case PhaseStopping:
		if m.worker.phase == workerStopping {
			consider(m.worker.stopBy)
		}
	case PhaseReleasing:
		if !m.release.inFlight {
			consider(m.release.nextAt)
		}
	}
	return at
}

func (m *Machine) jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*m.rng.Float64()))
}
