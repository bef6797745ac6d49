package lease

import (
	"context"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/fence"
)

// lateOutcomes keeps the grants that store calls obtained (an acquire that
// granted, a renewal that extended) until the LeaseActor has taken them
// in, so that none is left behind when the actor stops.
//
// The driver ignores contexts, so a call may still be running, or its
// answer still be queued in the mailbox, when the actor stops: protoactor
// drops the queued message and nobody would act on a call that finishes
// later. Either way the database holds a grant for this instance that
// nobody uses, and the next holder waits its TTL (the Kubernetes
// leader-election bug of a lease acquired as the context was cancelled
// and never released). On Stopped the actor collects what was never
// taken in and waits (bounded) for the calls still running, which from
// then on release their own grants.
type lateOutcomes struct {
	mu      sync.Mutex
	stopped bool
	pending map[uint64]lateGrant // by command Seq: obtained, not yet taken in
	calls   sync.WaitGroup       // store calls running
}

// lateGrant is a grant a store call obtained; acquired is true when an
// acquire obtained it (a renewal only extended it).
type lateGrant struct {
	c        fence.Custody
	acquired bool
}

func newLateOutcomes() *lateOutcomes { return &lateOutcomes{pending: map[uint64]lateGrant{}} }

// deliver records the grant c obtained by command seq (Fence 0: nothing
// was obtained) and sends the answer with send, unless the actor has
// stopped: then it releases the grant itself, bounded by bound.
func (l *lateOutcomes) deliver(seq uint64, g lateGrant, send func(), store StoreAPI, bound time.Duration, onLate func(lateGrant, time.Time, error)) {
	l.mu.Lock()
	if !l.stopped {
		if g.c.Fence > 0 {
			l.pending[seq] = g
		}
		send()
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	if g.c.Fence > 0 {
		begun, err := releaseBounded(store, g.c, bound)
		onLate(g, begun, err)
	}
}

// sendOr runs send unless the actor has stopped, else orElse.
func (l *lateOutcomes) sendOr(send, orElse func()) {
	l.mu.Lock()
	if !l.stopped {
		send()
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	orElse()
}

// taken marks command seq's answer as handled by the machine.
func (l *lateOutcomes) taken(seq uint64) {
	l.mu.Lock()
	delete(l.pending, seq)
	l.mu.Unlock()
}

// stop marks the actor stopped and returns the grants whose answers were
// sent but never taken in.
func (l *lateOutcomes) stop() []lateGrant {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	byFence := map[int64]lateGrant{}
	for _, g := range l.pending {
		prev, seen := byFence[g.c.Fence]
		byFence[g.c.Fence] = lateGrant{c: g.c, acquired: g.acquired || (seen && prev.acquired)}
	}
	l.pending = map[uint64]lateGrant{}
	left := make([]lateGrant, 0, len(byFence))
	for _, g := range byFence {
		left = append(left, g)
	}
	return left
}

// wait waits up to bound for the running store calls; it reports whether
// they all returned.
func (l *lateOutcomes) wait(bound time.Duration) bool {
	done := make(chan struct{})
	go func() { l.calls.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(bound):
		return false
	}
}

// releaseBounded releases c on its own context (the caller's may be gone),
// giving up after bound. It returns when the release began (the "at" of
// the lease.released it ends in: see events.Custody.At) and its error.
func releaseBounded(store StoreAPI, c fence.Custody, bound time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	done := make(chan error, 1)
	begun := time.Now()
	go func() { done <- store.Release(ctx, c) }()
	select {
	case err := <-done:
		return begun, err
	case <-ctx.Done():
		return begun, ctx.Err()
	}
}
