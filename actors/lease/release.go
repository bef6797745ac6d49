package lease

import (
	"errors"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/fence"
)

// startRelease releases grant f (the custody held, or an unused grant of
// this process) for reason; cause decides what follows.
func (m *Machine) startRelease(now time.Duration, cause stopCause, f int64, reason string) {
	m.cause, m.phase = cause, PhaseReleasing
	m.rel = release{nextAt: now, fence: f, reason: reason}
}

func (m *Machine) onRelease(now time.Duration, r ReleaseResult) {
	if late, ok := m.late[r.Seq]; ok {
		// A release given up on has landed after all.
		for _, seq := range late.seqs {
			delete(m.late, seq)
		}
		if r.Err == nil {
			m.emitReleased(late, r.At)
		}
		return
	}
	if m.phase != PhaseReleasing || !m.rel.inFlight || r.Seq != m.rel.seq {
		return
	}
	m.rel.inFlight = false
	switch {
	case r.Err == nil:
		m.emitReleased(m.rel, r.At)
	case errors.Is(r.Err, fence.ErrSuperseded):
		if m.rel.acquired {
			m.emitEvent(Event{Kind: LeaseAcquired, Fence: m.rel.fence, Reason: ReasonStaleGrant, At: r.At})
		}
		if m.rel.acquired || m.cause != causeUnused {
			m.emit(LeaseLost, m.rel.fence, ReasonSuperseded, r.Err)
		}
	default:
		m.rel.tries++
		if m.rel.tries < releaseAttempts {
			m.rel.nextAt = now + releaseRetryDelay<<(m.rel.tries-1)
			return
		}
		m.emit(LeaseLost, m.rel.fence, ReasonError,
			fmt.Errorf("release failed %d times, the grant will run out its TTL: %w", m.rel.tries, r.Err))
	}
	m.afterRelease(now)
}

// emitReleased publishes the end of rel's grant, announcing first one
// no earlier event did (every change of custody is published).
func (m *Machine) emitReleased(rel release, at time.Time) {
	if rel.acquired {
		m.emitEvent(Event{Kind: LeaseAcquired, Fence: rel.fence, Reason: ReasonStaleGrant, At: at})
	}
	m.emitEvent(Event{Kind: LeaseReleased, Fence: rel.fence, Reason: rel.reason, At: at})
}

func (m *Machine) afterRelease(now time.Duration) {
	m.fence = 0
	if m.stopping {
		m.finish(now)
		return
	}
	m.phase = PhaseContending
	switch m.cause {
	case causeFailed, causeYield:
		// Let another instance have a go before we try again.
		m.cooldownUntil = now + m.t.TTL
		m.acquireAt = m.cooldownUntil
	default:
		m.acquireAt = max(now, m.cooldownUntil)
	}
	m.cause = causeNone
}
