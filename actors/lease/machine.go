package lease

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/events"
	"github.com/atcr-io/appview/internal/fence"
)

// Timing is the lease timing of SPEC §3 (leases.*). Validated by config:
// RenewInterval < TTL/2 and RenewInterval < RenewDeadline < TTL.
type Timing struct {
	// TTL is the grant length on the database's clock.
	TTL time.Duration
	// RenewInterval is how often the holder renews.
	RenewInterval time.Duration
	// RenewDeadline is how long, measured locally from the start of the
	// last successful acquire/renew attempt, the holder trusts its grant.
	RenewDeadline time.Duration
	// RetryInterval is the contender's base retry period (jittered ±20%).
	RetryInterval time.Duration
}

// Supervision and retry policy. Durations are wall time on the local
// monotonic clock.
const (
	// restartBackoffMin is the delay before the first restart of a failed
	// worker; it doubles per failure in the window up to restartBackoffMax.
	restartBackoffMin = 100 * time.Millisecond
	restartBackoffMax = 10 * time.Second
	// maxFailures failures within failureWindow make the holder give the
	// lease up (worker.failed) so another instance can try.
	maxFailures   = 5
	failureWindow = time.Minute
	// workerStopTimeout bounds how long a graceful stop waits for the
	// worker before releasing anyway (its writes are fenced, so a worker
	// that outlives the release cannot land anything).
	workerStopTimeout = 10 * time.Second
	// releaseAttempts bounds the release retries on shutdown.
	releaseAttempts   = 3
	releaseRetryDelay = 100 * time.Millisecond
	// minRenewRetry is the floor of the delay after a failed renewal.
	minRenewRetry = 50 * time.Millisecond
	// nudgeSpacing is the minimum gap between nudge-triggered acquire
	// attempts: a flood of nudges costs at most one attempt per spacing.
	nudgeSpacing = 10 * time.Millisecond
	// expiryMargin is added to the contended grant's time left so the
	// attempt lands just after the expiry on the database's clock.
	expiryMargin = time.Millisecond
)

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
	// AcquireResult answers AcquireCmd Seq.
	AcquireResult struct {
		Seq   uint64
		Grant Grant
		Err   error
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
	}
	// WorkerStopped reports that worker Gen has terminated.
	WorkerStopped struct{ Gen int }
	// WorkerFailed reports that worker Gen failed (panicked); it is
	// suspended until restarted or stopped.
	WorkerFailed struct {
		Gen    int
		Reason error
	}
)

func (Start) isInput()         {}
func (Tick) isInput()          {}
func (StopRequested) isInput() {}
func (Nudge) isInput()         {}
func (AcquireResult) isInput() {}
func (RenewResult) isInput()   {}
func (ReleaseResult) isInput() {}
func (WorkerStopped) isInput() {}
func (WorkerFailed) isInput()  {}

// Command is an action the Machine asks its shell to carry out.
type Command interface{ isCommand() }

// Commands.
type (
	// AcquireCmd: call Store.Acquire and answer with AcquireResult{Seq}.
	AcquireCmd struct{ Seq uint64 }
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
	// EmitCmd: publish Event (the shell stamps the wall time).
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
// source given to NewMachine. Not safe for concurrent use.
type Machine struct {
	name, holder string
	t            Timing
	callTimeout  time.Duration
	rng          *rand.Rand

	phase         Phase
	cause         stopCause
	stopRequested bool
	fence         int64         // fence of the custody we hold (0: none)
	trustedUntil  time.Duration // local deadline: start of last successful attempt + RenewDeadline
	nextRenewAt   time.Duration
	nextAcquireAt time.Duration
	cooldownUntil time.Duration

	call      callKind
	callSeq   uint64
	callStart time.Duration
	lastErr   error
	nudged    bool          // a nudge arrived while an acquire was in flight
	lastNudge time.Duration // when the last nudged attempt was (or is) due
	everNudge bool
	abandoned map[uint64]bool // acquire attempts given up on; a late grant is released
	callFence int64           // fence a renew in flight is for
	// abandonedRenews maps renew attempts given up on to their fence: a late
	// "superseded" answer is still news.
	abandonedRenews map[uint64]int64
	// handBacks are fences whose grant a late renewal extended after
	// custody was given up; each is released once its worker has stopped.
	handBacks []int64
	// heldFence is the highest fence this machine was granted.
	heldFence int64
	// lostFence is a grant given up without a release (blackout, error):
	// still ours in the database until its TTL, released once its worker
	// has stopped and we see it (or stop).
	lostFence int64
	// acquireUnsure: an acquire answered with an error, which may have
	// committed (a remote database whose answer was lost): a grant to this
	// holder with a fence above heldFence, made since unsureSince (the
	// start of the first such call), is then ours, unused. The time check
	// keeps a grant of another process that wrongly shares our instance_id
	// (made before our call) from being taken for ours.
	acquireUnsure bool
	unsureSince   time.Duration

	releasing     bool
	releaseSeq    uint64
	releaseStart  time.Duration
	releaseTries  int
	nextReleaseAt time.Duration
	releaseReason string

	worker        workerPhase
	workerGen     int
	workerFence   int64
	workerStopBy  time.Duration
	respawn       bool // Holding with no worker: spawn one at restartAt
	restartAt     time.Duration
	failures      []time.Duration
	lastWorkerErr error

	seq uint64
	out []Command
}

// NewMachine returns a machine for lease name held as holder. rng supplies
// the retry jitter; pass a seeded source for reproducible runs.
func NewMachine(name, holder string, t Timing, rng *rand.Rand) *Machine {
	return &Machine{
		name: name, holder: holder, t: t, rng: rng,
		callTimeout: t.RenewDeadline / 2,
		abandoned:   map[uint64]bool{},

		abandonedRenews: map[uint64]int64{},
	}
}

// Phase is the current phase.
func (m *Machine) Phase() Phase { return m.phase }

// Custody is the custody this machine holds (Fence 0 when none).
func (m *Machine) Custody() fence.Custody {
	return fence.Custody{Lease: m.name, Holder: m.holder, Fence: m.fence}
}

// TrustedUntil is the local deadline of the current custody (0 when none).
func (m *Machine) TrustedUntil() time.Duration {
	if !m.holdsCustody() {
		return 0
	}
	return m.trustedUntil
}

// LastErr is the last store error seen (nil after a success).
func (m *Machine) LastErr() error { return m.lastErr }

// WorkerActive reports whether a worker is alive (running, restarting or
// draining) under custody the machine still trusts (used by tests and
// /debug/leases).
func (m *Machine) WorkerActive() bool {
	return m.holdsCustody() && m.worker != workerNone
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
			m.nextAcquireAt = now
		}
	case Tick:
	case StopRequested:
		m.onStop(now)
	case Nudge:
		m.onNudge(now)
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

// holdsCustody reports whether the machine holds a grant it has not given
// up: holding, or stopping its worker for a reason other than loss.
func (m *Machine) holdsCustody() bool {
	switch m.phase {
	case PhaseHolding:
		return true
	case PhaseStopping:
		return m.cause == causeShutdown || m.cause == causeFailed
	}
	return false
}

func (m *Machine) emit(kind events.Kind, fence int64, reason string, err error) {
	m.out = append(m.out, EmitCmd{Event: events.Custody{
		Kind: kind, Lease: m.name, Instance: m.holder, Fence: fence, Reason: reason, Err: err,
	}})
}

func (m *Machine) nextSeq() uint64 { m.seq++; return m.seq }

func (m *Machine) expire(now time.Duration) {
	if !m.holdsCustody() || now < m.trustedUntil {
		return
	}
	// A blackout is a database that did not answer: a call still pending
	// or abandoned, or failures that say it could not be reached or served
	// (database.Unavailable: connection refused, HTTP 5xx, Hrana timeouts,
	// locked past busy_timeout). An answer that something is wrong (an I/O
	// error, a read-only or replaced file) is reason error.
	reason, err := events.ReasonBlackout, m.lastErr
	if m.call == callNone && m.lastErr != nil && !errors.Is(m.lastErr, errCallTimeout) && !database.Unavailable(m.lastErr) {
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
	m.emit(events.LeaseLost, m.fence, reason, err)
	if reason != events.ReasonSuperseded {
		m.lostFence = m.fence
	}
	m.fence = 0
	m.cause = causeLost
	m.phase = PhaseStopping
	m.respawn = false
	m.stopWorker(now, false)
}

// stopWorker orders the worker to stop, or if there is none moves on.
func (m *Machine) stopWorker(now time.Duration, graceful bool) {
	switch m.worker {
	case workerNone:
		m.afterWorkerStopped(now)
	case workerSuspended:
		// A suspended mailbox takes no user messages: poison would never
		// be read, so a failed worker is always stopped, not poisoned.
		m.out = append(m.out, StopWorkerCmd{Gen: m.workerGen})
		m.worker = workerStopping
	case workerRunning:
		m.out = append(m.out, StopWorkerCmd{Gen: m.workerGen, Graceful: graceful})
		m.worker = workerStopping
	case workerStopping:
		if !graceful {
			m.out = append(m.out, StopWorkerCmd{Gen: m.workerGen})
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
		case m.call == callAcquire:
			// an acquire is in flight; its answer decides (a grant is released)
		case m.acquireUnsure:
			// An earlier acquire may have been granted unbeknown to us:
			// one more attempt finds out (a grant, or our own row, is
			// then released).
			m.call, m.callSeq, m.callStart = callAcquire, m.nextSeq(), now
			m.out = append(m.out, AcquireCmd{Seq: m.callSeq})
		default:
			m.finish()
		}
	case PhaseHolding:
		m.cause = causeShutdown
		m.phase = PhaseStopping
		m.respawn = false
		m.workerStopBy = now + workerStopTimeout
		m.stopWorker(now, true)
	case PhaseStopping:
		if m.cause == causeFailed {
			m.cause = causeShutdown
		}
		m.workerStopBy = now + workerStopTimeout
	}
}

func (m *Machine) finish() {
	m.phase = PhaseDone
	m.fence = 0
	if m.lostFence > 0 {
		// Our grant, given up unreleased, its worker stopped: hand it back
		// so the next holder need not wait out its TTL.
		m.handBackOwn(m.lostFence, false)
	}
}

// grantedSinceUnsure reports whether a grant age old at now (database
// clock) was made after the first errored acquire since the last clean
// answer started: only then can it be that acquire's. The slack covers
// the database's millisecond timestamps and a clock rate a little off the
// database's (SPEC: NTP-disciplined hosts).
func (m *Machine) grantedSinceUnsure(now, age time.Duration) bool {
	window := now - m.unsureSince
	return age <= window+unsureSlack+window/100
}

// unsureSlack: see grantedSinceUnsure.
const unsureSlack = 20 * time.Millisecond

// handBackOwn releases grant fence, which this holder has in the database
// and does not use.
func (m *Machine) handBackOwn(f int64, acquired bool) {
	if f == m.lostFence {
		m.lostFence = 0
	}
	m.out = append(m.out, ReleaseCmd{Seq: m.nextSeq(), Stale: true, LateAcquire: acquired,
		Custody: fence.Custody{Lease: m.name, Holder: m.holder, Fence: f}})
}

func (m *Machine) onNudge(now time.Duration) {
	if m.phase != PhaseContending || m.stopRequested {
		return
	}
	if m.call == callAcquire {
		m.nudged = true // acted on when the attempt in flight answers
		return
	}
	m.nudgeAttempt(now)
}

// nudgeAttempt brings the next acquire attempt forward to now, or to
// nudgeSpacing after the last nudged attempt if that is later. Every path
// by which a nudge causes an attempt goes through here, so a flood costs
// at most one attempt per spacing; a nudge inside the spacing is deferred,
// not dropped, because it may announce a release the last attempt missed.
func (m *Machine) nudgeAttempt(now time.Duration) {
	at := now
	if m.everNudge {
		at = max(at, m.lastNudge+nudgeSpacing)
	}
	if at < m.nextAcquireAt {
		m.nextAcquireAt = at
		m.everNudge, m.lastNudge = true, at
	}
}

func (m *Machine) onAcquire(now time.Duration, r AcquireResult) {
	if m.abandoned[r.Seq] {
		delete(m.abandoned, r.Seq)
		if r.Err == nil && r.Grant.Granted && r.Grant.Fence != m.fence {
			// Granted after we stopped waiting: hand it straight back so
			// the lease does not sit idle until its TTL.
			m.out = append(m.out, ReleaseCmd{Seq: m.nextSeq(), Stale: true, LateAcquire: true,
				Custody: fence.Custody{Lease: m.name, Holder: m.holder, Fence: r.Grant.Fence}})
		}
		return
	}
	if m.call != callAcquire || r.Seq != m.callSeq {
		return
	}
	m.call = callNone
	nudged := m.nudged
	m.nudged = false
	if r.Err != nil {
		m.lastErr = r.Err
		if !errors.Is(r.Err, errStoreStuck) && !errors.Is(r.Err, database.ErrFileReplaced) && !m.acquireUnsure {
			// It may have committed before the answer was lost.
			m.acquireUnsure, m.unsureSince = true, m.callStart
		}
		if m.stopRequested {
			m.finish()
			return
		}
		m.nextAcquireAt = now + m.jitter(m.t.RetryInterval)
		return
	}
	m.lastErr = nil
	g := r.Grant
	if !g.Granted {
		if g.Holder == m.holder && g.TimeLeft > 0 && g.Fence > 0 &&
			(g.Fence == m.lostFence || (m.acquireUnsure && g.Fence > m.heldFence && m.grantedSinceUnsure(now, g.Age))) {
			// Our own grant, unused: an acquire whose answer was lost
			// after it committed, or custody given up whose worker has
			// stopped. Hand it back rather than contend against it for
			// a TTL (and leave it behind on shutdown).
			m.handBackOwn(g.Fence, g.Fence > m.heldFence)
		}
		m.acquireUnsure = false
		m.out = append(m.out, EmitCmd{Event: events.Custody{Kind: events.LeaseContended,
			Lease: m.name, Instance: m.holder, Fence: g.Fence, Holder: g.Holder, TimeLeft: g.TimeLeft}})
		if m.stopRequested {
			m.finish()
			return
		}
		wait := m.jitter(m.t.RetryInterval)
		if left := max(g.TimeLeft, 0) + expiryMargin; left < wait {
			wait = left
		}
		m.nextAcquireAt = max(now+wait, m.cooldownUntil)
		if nudged {
			m.nudgeAttempt(now)
		}
		return
	}
	m.fence = g.Fence
	m.heldFence = max(m.heldFence, g.Fence)
	m.acquireUnsure = false
	m.lostFence = 0 // it ran out or was released, or this grant could not be
	m.emit(events.LeaseAcquired, g.Fence, "", nil)
	switch {
	case m.stopRequested:
		m.startRelease(now, causeShutdown, events.ReasonShutdown)
	case now-m.callStart >= m.t.RenewDeadline:
		m.startRelease(now, causeStale, events.ReasonStaleGrant)
	default:
		m.phase = PhaseHolding
		m.cause = causeNone
		m.trustedUntil = m.callStart + m.t.RenewDeadline
		m.nextRenewAt = m.callStart + m.t.RenewInterval
		m.failures = m.failures[:0]
		m.spawn()
	}
}

func (m *Machine) spawn() {
	m.workerGen++
	m.workerFence = m.fence
	m.worker = workerRunning
	m.respawn = false
	m.out = append(m.out, SpawnWorkerCmd{Gen: m.workerGen, Custody: m.Custody()})
	m.emit(events.WorkerStarted, m.fence, "", nil)
}

func (m *Machine) onRenew(now time.Duration, r RenewResult) {
	if f, ok := m.abandonedRenews[r.Seq]; ok {
		delete(m.abandonedRenews, r.Seq)
		switch {
		case errors.Is(r.Err, fence.ErrSuperseded) && m.holdsCustody() && f == m.fence:
			m.lastErr = r.Err
			m.lose(now, events.ReasonSuperseded, r.Err)
		case r.Err == nil:
			m.handBack(f)
		}
		return
	}
	if m.call != callRenew || r.Seq != m.callSeq {
		return
	}
	m.call = callNone
	if !m.holdsCustody() {
		// Custody already given up: a late success cannot revive it, but
		// it did extend the grant in the database.
		if r.Err == nil {
			m.handBack(m.callFence)
		}
		return
	}
	switch {
	case r.Err == nil:
		m.lastErr = nil
		// The window runs from the start of the attempt: a slow success
		// cannot stretch it.
		m.trustedUntil = max(m.trustedUntil, m.callStart+m.t.RenewDeadline)
		m.nextRenewAt = m.callStart + m.t.RenewInterval
		m.emit(events.LeaseRenewed, m.fence, "", nil)
	case errors.Is(r.Err, fence.ErrSuperseded):
		m.lastErr = r.Err
		m.lose(now, events.ReasonSuperseded, r.Err)
	default:
		m.lastErr = r.Err
		m.nextRenewAt = now + max(m.t.RenewInterval/4, minRenewRetry)
	}
}

// handBack queues the release of grant fence after a renewal of it
// succeeded too late: custody was already given up, so the extension it
// wrote would leave the lease idle for a TTL (this instance included would
// contend against it). A grant still in use, or being released by the
// machine itself, is left alone; an older fence matches nothing, so the
// release is harmless.
func (m *Machine) handBack(fence int64) {
	if fence == 0 || (fence == m.fence && (m.holdsCustody() || m.phase == PhaseReleasing)) {
		return
	}
	if fence == m.lostFence {
		m.lostFence = 0 // released here
	}
	m.handBacks = append(m.handBacks, fence)
}

// flushHandBacks issues the queued hand-backs, except one whose worker is
// still stopping: until it has stopped, the grant keeps every other
// instance's worker from starting beside it.
func (m *Machine) flushHandBacks() {
	keep := m.handBacks[:0]
	for _, f := range m.handBacks {
		if m.phase != PhaseDone && m.worker != workerNone && m.workerFence == f {
			keep = append(keep, f)
			continue
		}
		m.out = append(m.out, ReleaseCmd{Seq: m.nextSeq(), Stale: true,
			Custody: fence.Custody{Lease: m.name, Holder: m.holder, Fence: f}})
	}
	m.handBacks = keep
}

func (m *Machine) startRelease(now time.Duration, cause stopCause, reason string) {
	m.cause = cause
	m.phase = PhaseReleasing
	m.releaseReason = reason
	m.releaseTries = 0
	m.releasing = false
	m.nextReleaseAt = now
}

func (m *Machine) onRelease(now time.Duration, r ReleaseResult) {
	if m.phase != PhaseReleasing || !m.releasing || r.Seq != m.releaseSeq {
		return
	}
	m.releasing = false
	switch {
	case r.Err == nil:
		m.emit(events.LeaseReleased, m.fence, m.releaseReason, nil)
	case errors.Is(r.Err, fence.ErrSuperseded):
		m.emit(events.LeaseLost, m.fence, events.ReasonSuperseded, r.Err)
	default:
		m.releaseTries++
		if m.releaseTries < releaseAttempts {
			m.nextReleaseAt = now + releaseRetryDelay<<(m.releaseTries-1)
			return
		}
		m.emit(events.LeaseLost, m.fence, events.ReasonError,
			fmt.Errorf("release failed %d times, the grant will run out its TTL: %w", m.releaseTries, r.Err))
	}
	m.afterRelease(now)
}

func (m *Machine) afterRelease(now time.Duration) {
	m.fence = 0
	if m.stopRequested {
		m.finish()
		return
	}
	m.phase = PhaseContending
	switch m.cause {
	case causeFailed:
		// Let another instance have a go before we try again.
		m.cooldownUntil = now + m.t.TTL
		m.nextAcquireAt = m.cooldownUntil
	default:
		m.nextAcquireAt = now
	}
	m.cause = causeNone
}

func (m *Machine) onWorkerStopped(now time.Duration, w WorkerStopped) {
	if w.Gen != m.workerGen || m.worker == workerNone {
		return
	}
	m.worker = workerNone
	if m.phase == PhaseHolding {
		// A worker must not end its own custody; count it as a failure
		// and start a fresh one after a backoff.
		m.emit(events.WorkerStopped, m.workerFence, "", errWorkerExited)
		m.recordFailure(now)
		if len(m.failures) > maxFailures {
			m.giveUp(now, errWorkerExited)
			return
		}
		m.respawn = true
		m.restartAt = now + m.backoff()
		return
	}
	m.emit(events.WorkerStopped, m.workerFence, "", nil)
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
		m.nextAcquireAt = max(now+m.jitter(m.t.RetryInterval), m.cooldownUntil)
	case causeShutdown:
		m.startRelease(now, causeShutdown, events.ReasonShutdown)
	case causeFailed:
		m.startRelease(now, causeFailed, events.ReasonWorkerFailed)
	}
}

func (m *Machine) onWorkerFailed(now time.Duration, f WorkerFailed) {
	if f.Gen != m.workerGen || m.worker == workerNone {
		return
	}
	reason := f.Reason
	if reason == nil {
		reason = errors.New("worker failed")
	}
	if m.worker == workerStopping {
		// Failed while draining: it is suspended now and would never read
		// a poison pill.
		m.out = append(m.out, StopWorkerCmd{Gen: m.workerGen})
		return
	}
	m.worker = workerSuspended
	if errors.Is(reason, fence.ErrSuperseded) {
		// A fenced write found another holder: the directive is Stop,
		// never Restart.
		if m.holdsCustody() {
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
	if len(m.failures) > maxFailures {
		m.giveUp(now, reason)
		return
	}
	m.lastWorkerErr = reason
	m.restartAt = now + m.backoff()
}

func (m *Machine) recordFailure(now time.Duration) {
	keep := m.failures[:0]
	for _, at := range m.failures {
		if now-at < failureWindow {
			keep = append(keep, at)
		}
	}
	m.failures = append(keep, now)
}

func (m *Machine) backoff() time.Duration {
	d := restartBackoffMin << min(len(m.failures)-1, 20)
	return min(d, restartBackoffMax)
}

// giveUp stops a worker that fails too often and releases the lease so
// another instance can try.
func (m *Machine) giveUp(now time.Duration, err error) {
	m.emit(events.WorkerFailed, m.workerFence, "", fmt.Errorf("%d failures within %s, giving the lease up: %w", len(m.failures), failureWindow, err))
	m.cause = causeFailed
	m.phase = PhaseStopping
	m.respawn = false
	m.stopWorker(now, false)
}

// advance issues what is due at now.
func (m *Machine) advance(now time.Duration) {
	if m.phase == PhaseDone {
		return
	}
	if m.call != callNone && now >= m.callStart+m.callTimeout {
		switch m.call {
		case callAcquire:
			m.abandoned[m.callSeq] = true
		case callRenew:
			m.abandonedRenews[m.callSeq] = m.callFence
		}
		m.lastErr = errCallTimeout
		m.call = callNone
		m.nudged = false
	}
	if m.phase == PhaseContending && m.stopRequested && m.call != callAcquire {
		// Only an acquire in flight is worth waiting for (its grant must
		// be handed back); a renew left over from a lost custody is not.
		m.finish()
		return
	}
	if m.releasing && now >= m.releaseStart+m.callTimeout {
		m.releasing = false
		m.onReleaseTimeout(now)
		if m.phase == PhaseDone {
			return
		}
	}
	switch m.phase {
	case PhaseContending:
		if m.call == callNone && !m.stopRequested && now >= m.nextAcquireAt && now >= m.cooldownUntil {
			m.call, m.callSeq, m.callStart = callAcquire, m.nextSeq(), now
			m.out = append(m.out, AcquireCmd{Seq: m.callSeq})
		}
	case PhaseHolding:
		switch {
		case m.worker == workerSuspended && now >= m.restartAt:
			m.worker = workerRunning
			m.out = append(m.out, RestartWorkerCmd{Gen: m.workerGen})
			m.out = append(m.out, EmitCmd{Event: events.Custody{Kind: events.WorkerRestarted,
				Lease: m.name, Instance: m.holder, Fence: m.workerFence,
				Attempt: len(m.failures), Err: m.lastWorkerErr}})
		case m.worker == workerNone && m.respawn && now >= m.restartAt:
			m.spawn()
		}
	case PhaseStopping:
		if m.cause == causeShutdown && m.worker == workerStopping && now >= m.workerStopBy {
			// The worker did not stop in time. Release anyway: its writes
			// are fenced, and once released they cannot land.
			m.emit(events.WorkerFailed, m.workerFence, "",
				fmt.Errorf("worker did not stop within %s; releasing anyway", workerStopTimeout))
			m.worker = workerNone
			m.afterWorkerStopped(now)
		}
	}
	if m.holdsCustody() && m.call == callNone && now >= m.nextRenewAt {
		m.call, m.callSeq, m.callStart, m.callFence = callRenew, m.nextSeq(), now, m.fence
		m.out = append(m.out, RenewCmd{Seq: m.callSeq, Custody: m.Custody()})
	}
	if m.phase == PhaseReleasing && !m.releasing && now >= m.nextReleaseAt {
		m.releasing, m.releaseSeq, m.releaseStart = true, m.nextSeq(), now
		m.out = append(m.out, ReleaseCmd{Seq: m.releaseSeq, Custody: m.Custody()})
	}
}

func (m *Machine) onReleaseTimeout(now time.Duration) {
	m.releaseTries++
	if m.releaseTries < releaseAttempts {
		m.nextReleaseAt = now
		return
	}
	m.emit(events.LeaseLost, m.fence, events.ReasonBlackout,
		fmt.Errorf("release unanswered %d times, the grant will run out its TTL: %w", m.releaseTries, errCallTimeout))
	m.afterRelease(now)
}

// nextWake is the earliest moment something is due (0: nothing).
func (m *Machine) nextWake() time.Duration {
	at := NoWake
	consider := func(t time.Duration) {
		if at == NoWake || t < at {
			at = t
		}
	}
	if m.call != callNone {
		consider(m.callStart + m.callTimeout)
	}
	if m.releasing {
		consider(m.releaseStart + m.callTimeout)
	}
	if m.holdsCustody() {
		consider(m.trustedUntil)
		if m.call == callNone {
			consider(m.nextRenewAt)
		}
	}
	switch m.phase {
	case PhaseContending:
		if m.call == callNone && !m.stopRequested {
			consider(max(m.nextAcquireAt, m.cooldownUntil))
		}
	case PhaseHolding:
		if m.worker == workerSuspended || (m.worker == workerNone && m.respawn) {
			consider(m.restartAt)
		}
	case PhaseStopping:
		if m.cause == causeShutdown && m.worker == workerStopping {
			consider(m.workerStopBy)
		}
	case PhaseReleasing:
		if !m.releasing {
			consider(m.nextReleaseAt)
		}
	}
	return at
}

func (m *Machine) jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*m.rng.Float64()))
}
