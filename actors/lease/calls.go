package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/rs/zerolog"
)

// calls tracks one incarnation's store calls so that no grant is left
// behind when the actor stops (the leader-election bug of a lease
// acquired as its context was cancelled, never released): a call may
// still run, or its answer wait in the mailbox, which protoactor drops.
// An acquire's grant is recorded until the machine takes its answer; on
// Stopped the actor releases what was never taken and waits, bounded, for
// the calls still running, which from then on release their own.
type calls struct {
	mu                  sync.Mutex
	stopped             bool
	obtained            map[uint64]fence.Custody // by AcquireCmd Seq
	running             sync.WaitGroup
	acquiring, renewing int
}

// begin counts a call of a kind (acquiring or renewing); false when
// maxStuckCalls of that kind are still running.
func (c *calls) begin(n *int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if *n >= maxStuckCalls {
		return false
	}
	*n++
	c.running.Add(1)
	return true
}

func (c *calls) end(n *int) {
	c.mu.Lock()
	*n--
	c.mu.Unlock()
	c.running.Done()
}

// deliver sends an answer (send) and records the grant it carries (Fence
// 0: none) until taken; once the actor has stopped it sends nothing and
// reports whether the caller must release the grant itself.
func (c *calls) deliver(seq uint64, got fence.Custody, send func()) (releaseIt bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return got.Fence > 0
	}
	if got.Fence > 0 {
		c.obtained[seq] = got
	}
	send()
	return false
}

func (c *calls) taken(seq uint64) {
	c.mu.Lock()
	delete(c.obtained, seq)
	c.mu.Unlock()
}

// stop marks the actor stopped and returns the grants never taken in.
func (c *calls) stop() []fence.Custody {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	var left []fence.Custody
	for _, g := range c.obtained {
		left = append(left, g)
	}
	clear(c.obtained)
	return left
}

// send delivers an answer of this incarnation to the actor.
func (a *leaseActor) send(in Input) func() {
	sys, self, from := a.sys, a.self, a.calls
	return func() { sys.Root.Send(self, &answer{from: from, in: in}) }
}

func (a *leaseActor) goAcquire(c AcquireCmd) {
	calls := a.calls
	if !calls.begin(&calls.acquiring) {
		a.send(AcquireResult{Seq: c.Seq, Err: ErrStoreStuck})()
		return
	}
	store, name, holder, metrics, log := a.o.Store, a.o.Name, a.o.Instance, a.o.Metrics, a.log
	go func() {
		defer calls.end(&calls.acquiring)
		start := time.Now()
		g, err := store.Acquire(context.Background(), name, holder)
		at := time.Now()
		metrics.observeCall(name, true, at.Sub(start), g, err)
		var got fence.Custody
		if err == nil && g.Granted {
			got = fence.Custody{Lease: name, Holder: holder, Fence: g.Fence}
		}
		if calls.deliver(c.Seq, got, a.send(AcquireResult{Seq: c.Seq, Grant: g, Err: err, At: at})) {
			handBack(a.o, log, got)
		}
	}()
}

func (a *leaseActor) goRenew(c RenewCmd) {
	calls := a.calls
	if !calls.begin(&calls.renewing) {
		a.send(RenewResult{Seq: c.Seq, Err: ErrStoreStuck})()
		return
	}
	store, metrics := a.o.Store, a.o.Metrics
	go func() {
		defer calls.end(&calls.renewing)
		start := time.Now()
		err := store.Renew(context.Background(), c.Custody)
		metrics.observeCall(c.Custody.Lease, false, time.Since(start), Grant{}, err)
		calls.deliver(c.Seq, fence.Custody{}, a.send(RenewResult{Seq: c.Seq, Err: err}))
	}()
}

// goRelease releases on a context of its own (a release must land when
// every caller's context is cancelled); the store nudges the contenders
// from the commit on (Store.Released).
func (a *leaseActor) goRelease(c ReleaseCmd) {
	store, bound := a.o.Store, a.o.Timing.RenewDeadline
	calls := a.calls
	calls.running.Add(1)
	go func() {
		defer calls.running.Done()
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		begun := time.Now() // before the commit: lease.released precedes any successor's grant
		err := store.Release(ctx, c.Custody)
		calls.deliver(c.Seq, fence.Custody{}, a.send(ReleaseResult{Seq: c.Seq, Err: err, At: begun}))
	}()
}

// handBack releases, bounded, a grant an acquire obtained after the actor
// stopped, and publishes both changes of custody (reason stale-grant). It
// may run on a store call's goroutine: it reads only what never changes.
func handBack(o Options, log zerolog.Logger, g fence.Custody) {
	begun, err := releaseBounded(o.Store, g)
	if err != nil && !errors.Is(err, fence.ErrSuperseded) {
		log.Warn().Err(err).Int64("fence", g.Fence).Msg("could not hand back a grant obtained as the lease actor stopped; it will run out its TTL")
		return
	}
	e := Event{Kind: LeaseAcquired, Lease: g.Lease, Instance: g.Holder, Fence: g.Fence, Reason: ReasonStaleGrant, At: begun}
	o.publish(e)
	e.Kind = LeaseReleased
	if err != nil {
		e.Kind, e.Reason, e.Err = LeaseLost, ReasonSuperseded, err
	}
	o.publish(e)
}

// releaseBounded releases c on a context of its own and waits at most
// callBound for the answer (the driver ignores contexts). It returns when
// the release began and its error.
func releaseBounded(store StoreAPI, c fence.Custody) (time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callBound)
	defer cancel()
	begun := time.Now()
	err := database.Bounded(ctx, func() error { return store.Release(ctx, c) })
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("release unanswered after %s", callBound)
	}
	return begun, err
}

// stopped runs when the actor has stopped. On the graceful path the
// machine has finished and holds nothing. Stopped outright (its worker
// already terminated: protoactor stops children first), it releases here,
// bounded, what it holds and what acquires obtained unbeknown to it, then
// waits, bounded, for the calls still running.
func (a *leaseActor) stopped() {
	left := a.calls.stop()
	if a.m != nil && !a.o.Unleased && a.m.HoldsCustody() {
		c := a.m.Custody()
		begun, err := releaseBounded(a.o.Store, c)
		e := Event{Kind: LeaseReleased, Lease: c.Lease, Instance: c.Holder, Fence: c.Fence, Reason: ReasonShutdown, At: begun}
		if err != nil {
			e.Kind, e.Reason, e.Err, e.At = LeaseLost, ReasonError, err, time.Time{}
		}
		a.publish(e)
	}
	for _, g := range left {
		handBack(a.o, a.log, g)
	}
	done := make(chan struct{})
	go func() { a.calls.running.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(callBound):
		a.log.Warn().Dur("waited_ms", callBound).Msg("lease store calls still running at stop: a grant one obtains is released by it, unless the process has exited by then (the grant then runs out its TTL)")
	}
}
