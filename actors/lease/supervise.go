package lease

import (
	"errors"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/fence"
)

// stopWorker orders the worker to stop (supervision: doc.go), or if
// there is none moves on.
func (m *Machine) stopWorker(now time.Duration, graceful bool) {
	w := &m.worker
	switch w.phase {
	case workerNone:
		m.afterWorkerStopped(now)
		return
	case workerSuspended:
		graceful = false // a suspended mailbox would never read a poison pill
	case workerStopping:
		if graceful {
			return // already stopping
		}
		// a harsher order (a loss during a drain): a full bound from now
	}
	m.out = append(m.out, StopWorkerCmd{Gen: w.gen, Graceful: graceful})
	w.phase, w.stopBy = workerStopping, now+WorkerStopTimeout
}

func (m *Machine) spawn() {
	w := &m.worker
	w.gen++
	w.fence, w.phase, w.respawn = m.fence, workerRunning, false
	m.out = append(m.out, SpawnWorkerCmd{Gen: w.gen, Custody: m.Custody()})
	m.emit(WorkerStarted, m.fence, "", nil)
}

func (m *Machine) onWorkerStopped(now time.Duration, w WorkerTerminated) {
	if w.Gen != m.worker.gen || m.worker.phase == workerNone {
		return
	}
	m.worker.phase = workerNone
	if m.phase == PhaseHolding { // a worker must not end its own custody: a failure
		m.emit(WorkerStopped, m.worker.fence, "", errWorkerExited)
		if m.recordFailure(now, errWorkerExited) {
			m.worker.respawn = true
		}
		return
	}
	m.emit(WorkerStopped, m.worker.fence, "", nil)
	if m.phase == PhaseStopping {
		m.afterWorkerStopped(now)
	}
}

func (m *Machine) afterWorkerStopped(now time.Duration) {
	switch m.cause {
	case causeLost:
		if m.stopping {
			m.finish(now)
			return
		}
		// Whoever caused the loss is still there: a retry interval, not a
		// spin through acquire, lose, acquire.
		m.cause, m.phase = causeNone, PhaseContending
		m.acquireAt = max(now+m.jitter(m.t.RetryInterval), m.cooldownUntil)
	case causeShutdown:
		m.startRelease(now, causeShutdown, m.fence, ReasonShutdown)
	case causeFailed:
		m.startRelease(now, causeFailed, m.fence, ReasonWorkerFailed)
	case causeYield:
		m.startRelease(now, causeYield, m.fence, ReasonYielded)
	}
}

func (m *Machine) onWorkerFailed(now time.Duration, f WorkerPanicked) {
	if f.Gen != m.worker.gen || m.worker.phase == workerNone {
		return
	}
	reason := f.Reason
	if reason == nil {
		reason = errors.New("worker failed")
	}
	if m.worker.phase == workerStopping { // failed while draining: suspended, it reads no poison pill
		m.out = append(m.out, StopWorkerCmd{Gen: m.worker.gen})
		return
	}
	m.worker.phase = workerSuspended
	switch {
	case errors.Is(reason, fence.ErrSuperseded) && m.HoldsCustody():
		// A fenced write found another holder: Stop, never Restart.
		m.lose(now, ReasonSuperseded, reason)
	case m.phase != PhaseHolding:
		m.stopWorker(now, false)
	default:
		m.worker.lastErr = reason
		m.recordFailure(now, reason)
	}
}

// recordFailure counts a failure and schedules a restart after a
// backoff; past MaxFailures within failureWindow it gives the lease up
// instead (worker.failed, release, a TTL of cooldown) and returns false.
func (m *Machine) recordFailure(now time.Duration, err error) bool {
	w := &m.worker
	keep := w.failures[:0]
	for _, at := range w.failures {
		if now-at < failureWindow {
			keep = append(keep, at)
		}
	}
	w.failures = append(keep, now)
	if len(w.failures) > MaxFailures {
		m.emit(WorkerFailed, w.fence, "", fmt.Errorf("%d failures within %s, giving the lease up: %w", len(w.failures), failureWindow, err))
		m.cause, m.phase, w.respawn = causeFailed, PhaseStopping, false
		m.stopWorker(now, false)
		return false
	}
	w.restartAt = now + min(RestartBackoffMin<<min(len(w.failures)-1, 20), restartBackoffMax)
	return true
}
