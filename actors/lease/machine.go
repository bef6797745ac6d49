package lease

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// Supervision and retry policy, on the local monotonic clock.
const (
	// RestartBackoffMin is the first restart's delay, doubled per failure.
	RestartBackoffMin = 100 * time.Millisecond
	restartBackoffMax = 10 * time.Second
	// MaxFailures failures within failureWindow give the lease up
	// (worker.failed) so another instance can try.
	MaxFailures   = 5
	failureWindow = time.Minute
	// WorkerStopTimeout bounds every stop of the worker: then worker.stuck
	// is published and the machine moves on as if it had stopped (its
	// writes are fenced under a custody that has ended or is released).
	WorkerStopTimeout = 10 * time.Second
	releaseAttempts   = 3
	releaseRetryDelay = 100 * time.Millisecond
	minRenewRetry     = 50 * time.Millisecond
	// NudgeSpacing is the minimum gap between nudged acquire attempts.
	NudgeSpacing = 10 * time.Millisecond
	expiryMargin = time.Millisecond // an attempt lands just after the grant's expiry
)

// ErrStoreStuck fails an attempt the shell did not make because earlier
// store calls of the same kind have not returned (the driver ignores
// contexts, so each keeps a goroutine and a pool connection until the
// database answers). It never reached the database.
var ErrStoreStuck = errors.New("earlier lease store calls have not returned (the database is slow to answer, or another writer holds its write lock); not starting another")

var (
	errCallTimeout  = errors.New("lease store call timed out")
	errWorkerExited = errors.New("worker stopped on its own")
)

// Phase is the custody phase (see doc.go for the diagram).
type Phase int

// Phases.
const (
	PhaseIdle       Phase = iota // not started
	PhaseContending              // no custody; acquire attempts
	PhaseHolding                 // custody; worker running (or being restarted)
	PhaseStopping                // worker being stopped (custody lost, failed, yielded or shutting down)
	PhaseReleasing               // release in flight
	PhaseDone                    // nothing more will happen
)

var phaseNames = [...]string{"idle", "contending", "holding", "stopping", "releasing", "done"}

func (p Phase) String() string { return phaseNames[p] }

// stopCause says why the worker stops or the lease is released: what
// follows.
type stopCause int

const (
	causeNone     stopCause = iota
	causeLost               // custody lost: never release; contend again or finish
	causeShutdown           // stop requested: release, then finish
	causeFailed             // worker failed too often: release, cool down, contend again
	causeYield              // worker unhealthy, a contender healthy: release, cool down, contend again
	causeUnused             // a grant of this process that no worker uses: release, go on
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

// Machine is the custody state machine of one lease in one instance. It
// is pure: time (a monotonic duration) and inputs in, commands out,
// randomness from its seeded source. Not safe for concurrent use.
type Machine struct {
	name, holder string
	t            config.Timing
	callTimeout  time.Duration
	rng          *rand.Rand
	minHold      time.Duration // no yield before custody has lasted this long (no flapping)

	phase    Phase
	cause    stopCause
	stopping bool  // StopRequested arrived
	lastErr  error // the last store error (nil after a success)
	seq      uint64
	out      []Command

	// The custody held (fence 0: none), trusted until the start of the
	// last successful attempt + RenewDeadline. heldFence is the highest
	// fence ever granted; lostFence a grant given up unreleased (blackout,
	// error), released when the machine finishes.
	fence, heldFence, lostFence  int64
	since, trustedUntil, renewAt time.Duration

	// Contending. unsure: the last acquire failed, and may have committed
	// before its answer was lost; a stop makes one more attempt, which
	// finds (and releases) such a grant.
	acquireAt, cooldownUntil time.Duration
	lastNudge                time.Duration // when the last nudged attempt was due (-1: never)
	nudged, unsure           bool          // nudged: while an acquire was in flight

	// The acquire or renew call in flight (at most one).
	call      callKind
	callSeq   uint64
	callStart time.Duration

	// rel is the release in flight or due (PhaseReleasing); late the
	// releases given up on unanswered, by each attempt's Seq: a late
	// success is published all the same.
	rel  release
	late map[uint64]release

	// The worker of the current custody.
	worker struct {
		phase             workerPhase
		gen               int
		fence             int64 // the fence worker gen was spawned under
		stopBy, restartAt time.Duration
		respawn           bool // holding with no worker: spawn one at restartAt
		failures          []time.Duration
		lastErr           error
	}
}

// release is the release of a grant: its attempts, and what publishing
// its outcome takes.
type release struct {
	inFlight      bool
	seq           uint64
	seqs          []uint64 // every attempt's
	start, nextAt time.Duration
	tries         int
	fence         int64
	reason        string
	acquired      bool // an unused grant this machine never published: lease.acquired first
}

// NewMachine returns a machine for lease name held as holder. rng
// supplies the retry jitter; pass a seeded source for reproducible runs.
// minHold is leases.min_hold (see YieldRequested).
func NewMachine(name, holder string, t config.Timing, rng *rand.Rand, minHold time.Duration) *Machine {
	return &Machine{name: name, holder: holder, t: t, rng: rng, minHold: minHold,
		callTimeout: t.RenewDeadline / 2, lastNudge: -1}
}

// Phase is the current phase.
func (m *Machine) Phase() Phase { return m.phase }

// Custody is the custody this machine holds (Fence 0 when none).
func (m *Machine) Custody() fence.Custody {
	return fence.Custody{Lease: m.name, Holder: m.holder, Fence: m.fence}
}

// TrustedUntil is the local deadline of the current custody (0 when none).
func (m *Machine) TrustedUntil() time.Duration {
	if !m.HoldsCustody() {
		return 0
	}
	return m.trustedUntil
}

// LastErr is the last store error seen (nil after a success).
func (m *Machine) LastErr() error { return m.lastErr }

// WorkerActive reports whether a worker is alive (running, restarting or
// draining) under custody the machine still trusts.
func (m *Machine) WorkerActive() bool { return m.HoldsCustody() && m.worker.phase != workerNone }

// HeldFor is how long the current custody has lasted at now (0 when none).
func (m *Machine) HeldFor(now time.Duration) time.Duration {
	if m.phase != PhaseHolding {
		return 0
	}
	return now - m.since
}

// HoldsCustody reports whether the machine holds a grant it has not given
// up: holding, or stopping its worker for a reason other than loss.
func (m *Machine) HoldsCustody() bool {
	return m.phase == PhaseHolding || (m.phase == PhaseStopping && m.cause != causeLost)
}

// Stray reports whether r (not yet stepped) grants a fence the machine
// never learned of, to an attempt given up on, once it is stopping or has
// finished: no later attempt finds it as its own to hand it back; the shell must.
func (m *Machine) Stray(r AcquireResult) bool {
	awaited := m.phase != PhaseDone && m.call == callAcquire && r.Seq == m.callSeq
	return r.Err == nil && r.Grant.Granted && !awaited && (m.stopping || m.phase == PhaseDone) && r.Grant.Fence > m.heldFence
}

// Step feeds one input at time now and returns the commands to carry out,
// in order, the last always a WakeCmd.
func (m *Machine) Step(now time.Duration, in Input) []Command {
	m.out = nil
	if m.phase == PhaseDone {
		return []Command{WakeCmd{At: NoWake}}
	}
	m.expire(now) // time first: a late success cannot revive custody
	switch in := in.(type) {
	case Start:
		if m.phase == PhaseIdle {
			m.phase, m.acquireAt = PhaseContending, now
		}
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
	case WorkerTerminated:
		m.onWorkerStopped(now, in)
	case WorkerPanicked:
		m.onWorkerFailed(now, in)
	case YieldRequested:
		m.onYield(now, in)
	}
	m.advance(now)
	if m.phase == PhaseDone {
		return append(m.out, FinishedCmd{}, WakeCmd{At: NoWake})
	}
	return append(m.out, WakeCmd{At: m.nextWake()})
}

func (m *Machine) emit(kind EventKind, fence int64, reason string, err error) {
	m.emitEvent(Event{Kind: kind, Fence: fence, Reason: reason, Err: err})
}

func (m *Machine) emitEvent(e Event) {
	e.Lease, e.Instance = m.name, m.holder
	m.out = append(m.out, EmitCmd{Event: e})
}

func (m *Machine) nextSeq() uint64 { m.seq++; return m.seq }

// expire gives custody up once its trust window has passed: a blackout
// when the database did not answer (a call pending or abandoned, or
// database.Unavailable), an error when it answered that something is
// wrong (an I/O error, a read-only file).
func (m *Machine) expire(now time.Duration) {
	if !m.HoldsCustody() || now < m.trustedUntil {
		return
	}
	reason, err := ReasonBlackout, m.lastErr
	if m.call == callNone && err != nil && !errors.Is(err, errCallTimeout) && !database.Unavailable(err) {
		reason = ReasonError
	}
	if err == nil {
		err = fmt.Errorf("no renewal succeeded within %s", m.t.RenewDeadline)
	}
	m.lose(now, reason, err)
}

// lose gives custody up without a release: the database may already have
// granted it to someone else, so the worker stops at once.
func (m *Machine) lose(now time.Duration, reason string, err error) {
	m.emit(LeaseLost, m.fence, reason, err)
	if reason != ReasonSuperseded {
		m.lostFence = m.fence
	}
	m.fence, m.cause, m.phase = 0, causeLost, PhaseStopping
	m.worker.respawn = false
	m.stopWorker(now, false)
}

func (m *Machine) onStop(now time.Duration) {
	if m.stopping {
		return
	}
	m.stopping = true
	switch m.phase {
	case PhaseIdle:
		m.finish(now)
	case PhaseContending:
		switch {
		case m.call == callAcquire:
			// its answer decides: a grant is released
		case m.unsure:
			m.startCall(now, callAcquire) // finds out whether the last one committed
		default:
			m.finish(now)
		}
	case PhaseHolding:
		m.cause, m.phase = causeShutdown, PhaseStopping
		m.worker.respawn = false
		m.stopWorker(now, true)
	case PhaseStopping:
		if m.cause == causeFailed || m.cause == causeYield {
			m.cause = causeShutdown
		}
	}
}

func (m *Machine) onYield(now time.Duration, y YieldRequested) {
	if m.phase != PhaseHolding || m.stopping || now-m.since < m.minHold {
		return
	}
	reason := y.Reason
	if reason == nil {
		reason = errors.New("worker unhealthy, a contender healthy")
	}
	m.emit(LeaseYielded, m.fence, ReasonYielded, reason)
	m.cause, m.phase = causeYield, PhaseStopping
	m.worker.respawn = false
	m.stopWorker(now, true)
}

// finish ends the machine, releasing first a grant it gave up unreleased,
// so the next holder need not wait out its TTL.
func (m *Machine) finish(now time.Duration) {
	if m.lostFence > 0 {
		f := m.lostFence
		m.lostFence = 0
		m.startRelease(now, causeUnused, f, ReasonStaleGrant)
		return
	}
	m.phase, m.fence = PhaseDone, 0
}

func (m *Machine) onNudge(now time.Duration) {
	if m.phase != PhaseContending || m.stopping {
		return
	}
	if m.call == callAcquire {
		m.nudged = true // acted on when the attempt in flight answers
		return
	}
	m.nudgeAttempt(now)
}

// nudgeAttempt brings the next attempt forward to now, or NudgeSpacing
// after the last nudged one: a nudge inside the spacing is deferred, not
// dropped (it may announce a release the last attempt missed).
func (m *Machine) nudgeAttempt(now time.Duration) {
	at := now
	if m.lastNudge >= 0 {
		at = max(at, m.lastNudge+NudgeSpacing)
	}
	if at < m.acquireAt {
		m.acquireAt, m.lastNudge = at, at
	}
}

func (m *Machine) startCall(now time.Duration, kind callKind) {
	m.call, m.callSeq, m.callStart = kind, m.nextSeq(), now
	if kind == callAcquire {
		m.out = append(m.out, AcquireCmd{Seq: m.callSeq})
		return
	}
	m.out = append(m.out, RenewCmd{Seq: m.callSeq, Custody: m.Custody()})
}

func (m *Machine) onAcquire(now time.Duration, r AcquireResult) {
	if m.call != callAcquire || r.Seq != m.callSeq {
		return // an attempt given up on: a grant it made is found as our own by the next one
	}
	m.call = callNone
	nudged := m.nudged
	m.nudged = false
	if r.Err != nil {
		m.lastErr = r.Err
		// It may have committed before its answer was lost, unless it
		// never reached the database as a write.
		m.unsure = m.unsure || !(errors.Is(r.Err, ErrStoreStuck) || errors.Is(r.Err, database.ErrFileReplaced))
		if m.stopping {
			m.finish(now)
			return
		}
		m.acquireAt = now + m.jitter(m.t.RetryInterval)
		return
	}
	m.lastErr, m.unsure = nil, false
	g := r.Grant
	if !g.Granted {
		m.onContended(now, g, nudged)
		return
	}
	m.fence, m.heldFence, m.lostFence = g.Fence, max(m.heldFence, g.Fence), 0
	m.emitEvent(Event{Kind: LeaseAcquired, Fence: g.Fence, At: r.At})
	switch {
	case m.stopping:
		m.startRelease(now, causeShutdown, g.Fence, ReasonShutdown)
	case now-m.callStart >= m.t.RenewDeadline:
		// Answered too late to trust: hand it back.
		m.startRelease(now, causeUnused, g.Fence, ReasonStaleGrant)
	default:
		m.phase, m.cause = PhaseHolding, causeNone
		m.since, m.trustedUntil, m.renewAt = m.callStart, m.callStart+m.t.RenewDeadline, m.callStart+m.t.RenewInterval
		m.worker.failures = m.worker.failures[:0]
		m.spawn()
	}
}

// onContended takes an acquire that did not grant.
func (m *Machine) onContended(now time.Duration, g Grant, nudged bool) {
	if g.Own && g.TimeLeft > 0 {
		// A live grant of this very process that no worker uses (doc.go,
		// Contending): handed back, not contended against for a TTL.
		m.lostFence = 0
		m.emitEvent(Event{Kind: LeaseContended, Fence: g.Fence, Holder: g.Holder, TimeLeft: g.TimeLeft, Reason: ReasonStaleGrant})
		m.startRelease(now, causeUnused, g.Fence, ReasonStaleGrant)
		m.rel.acquired = g.Fence > m.heldFence
		m.heldFence = max(m.heldFence, g.Fence)
		return
	}
	m.emitEvent(Event{Kind: LeaseContended, Fence: g.Fence, Holder: g.Holder, TimeLeft: g.TimeLeft})
	if m.stopping {
		m.finish(now)
		return
	}
	// A crashed holder's grant runs out in TimeLeft on the database's
	// clock: try just after, not a full retry interval later.
	wait := min(m.jitter(m.t.RetryInterval), max(g.TimeLeft, 0)+expiryMargin)
	m.acquireAt = max(now+wait, m.cooldownUntil)
	if nudged {
		m.nudgeAttempt(now)
	}
}

// RenewalEndsCustody reports whether a renewal's error ends custody at
// once, not retried until the renew deadline: the row no longer carries
// the grant (fence.ErrSuperseded), or the database file was deleted or
// replaced under the process (database.ErrFileReplaced).
func RenewalEndsCustody(err error) bool {
	return errors.Is(err, fence.ErrSuperseded) || errors.Is(err, database.ErrFileReplaced)
}

func (m *Machine) onRenew(now time.Duration, r RenewResult) {
	if m.call != callRenew || r.Seq != m.callSeq {
		return
	}
	m.call = callNone
	if !m.HoldsCustody() {
		return // given up meanwhile; a late success cannot revive it
	}
	switch {
	case r.Err == nil:
		m.lastErr = nil // trust runs from the attempt's start: a slow success cannot stretch it
		m.trustedUntil = max(m.trustedUntil, m.callStart+m.t.RenewDeadline)
		m.renewAt = m.callStart + m.t.RenewInterval
		m.emit(LeaseRenewed, m.fence, "", nil)
	case RenewalEndsCustody(r.Err):
		m.lastErr = r.Err
		reason := ReasonError
		if errors.Is(r.Err, fence.ErrSuperseded) {
			reason = ReasonSuperseded
		}
		m.lose(now, reason, r.Err)
	default:
		m.lastErr = r.Err
		m.renewAt = now + max(m.t.RenewInterval/4, minRenewRetry)
	}
}

// advance issues what is due at now.
func (m *Machine) advance(now time.Duration) {
	if m.call != callNone && now >= m.callStart+m.callTimeout {
		// Given up on: its late answer is ignored.
		m.unsure = m.unsure || m.call == callAcquire
		m.lastErr, m.call, m.nudged = errCallTimeout, callNone, false
	}
	if m.phase == PhaseContending && m.stopping && m.call != callAcquire {
		m.finish(now)
	}
	if m.rel.inFlight && now >= m.rel.start+m.callTimeout {
		m.rel.inFlight = false
		m.rel.tries++
		if m.rel.tries < releaseAttempts {
			m.rel.nextAt = now
		} else {
			if m.rel.acquired || m.cause != causeUnused {
				m.emit(LeaseLost, m.rel.fence, ReasonBlackout,
					fmt.Errorf("release unanswered %d times, the grant will run out its TTL: %w", m.rel.tries, errCallTimeout))
			}
			if m.late == nil {
				m.late = map[uint64]release{}
			}
			for _, seq := range m.rel.seqs {
				m.late[seq] = m.rel
			}
			m.afterRelease(now)
		}
	}
	w := &m.worker
	switch m.phase {
	case PhaseContending:
		if m.call == callNone && !m.stopping && now >= m.acquireAt && now >= m.cooldownUntil {
			m.startCall(now, callAcquire)
		}
	case PhaseHolding:
		switch {
		case w.phase == workerSuspended && now >= w.restartAt:
			w.phase = workerRunning
			m.out = append(m.out, RestartWorkerCmd{Gen: w.gen})
			m.emitEvent(Event{Kind: WorkerRestarted, Fence: w.fence, Attempt: len(w.failures), Err: w.lastErr})
		case w.phase == workerNone && w.respawn && now >= w.restartAt:
			m.spawn()
		}
	case PhaseStopping:
		if w.phase == workerStopping && now >= w.stopBy { // stuck: move on without it
			next := "contending again"
			switch {
			case m.cause == causeShutdown || m.stopping:
				next = "releasing anyway and stopping"
			case m.cause == causeFailed || m.cause == causeYield:
				next = "releasing anyway"
			}
			m.emit(WorkerStuck, w.fence, "", fmt.Errorf("worker did not stop within %s; %s", WorkerStopTimeout, next))
			w.phase = workerNone
			m.afterWorkerStopped(now)
		}
	}
	if m.HoldsCustody() && m.call == callNone && now >= m.renewAt {
		m.startCall(now, callRenew)
	}
	if m.phase == PhaseReleasing && !m.rel.inFlight && now >= m.rel.nextAt {
		m.rel.inFlight, m.rel.seq, m.rel.start = true, m.nextSeq(), now
		m.rel.seqs = append(m.rel.seqs, m.rel.seq)
		m.out = append(m.out, ReleaseCmd{Seq: m.rel.seq, Custody: fence.Custody{Lease: m.name, Holder: m.holder, Fence: m.rel.fence}})
	}
}

// nextWake is the earliest moment something is due (NoWake: nothing).
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
	if m.HoldsCustody() {
		consider(m.trustedUntil)
		if m.call == callNone {
			consider(m.renewAt)
		}
	}
	w := &m.worker
	switch m.phase {
	case PhaseContending:
		if m.call == callNone && !m.stopping {
			consider(max(m.acquireAt, m.cooldownUntil))
		}
	case PhaseHolding:
		if w.phase == workerSuspended || (w.phase == workerNone && w.respawn) {
			consider(w.restartAt)
		}
	case PhaseStopping:
		if w.phase == workerStopping {
			consider(w.stopBy)
		}
	case PhaseReleasing:
		if m.rel.inFlight {
			consider(m.rel.start + m.callTimeout)
		} else {
			consider(m.rel.nextAt)
		}
	}
	return at
}

func (m *Machine) jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*m.rng.Float64()))
}
