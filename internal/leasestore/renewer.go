package leasestore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/atcr-io/appview/internal/fence"
)

// ErrRenewerClosed fails a renewal asked of a Renewer after Close.
var ErrRenewerClosed = errors.New("lease renewer closed")

// Renewer is a Store whose renewals are batched: every LeaseActor of a
// process renews through one Renewer, and renewals asked while one
// statement is in flight all go into the next (group commit), so a renew
// tick of N leases costs one statement (RenewAll), not N. A renewal asked
// while none is in flight starts its statement at once: batching adds no
// latency to a lone renewal. A statement carries at most MaxRenewBatch
// grants; more wait for the next one. Acquire, Release and the rest are
// the Store's own, unbatched.
//
// Each caller still learns its own outcome (Renew's errors: nil,
// fence.ErrSuperseded, or the statement's error), and a caller whose
// context ends first returns ctx.Err() at once (its grant is left out of
// any statement not yet begun; one already begun may still land, as a
// renewal the driver could not cancel always could).
type Renewer struct {
	*Store
	mu      sync.Mutex
	queue   []*renewRequest
	running bool // a flush goroutine is at work
	closed  bool
	wg      sync.WaitGroup
}

type renewRequest struct {
	ctx  context.Context
	c    fence.Custody
	done chan error // buffered: the flush never blocks on a caller that left
}

// NewRenewer returns a Renewer over s. Close it when the process stops.
func NewRenewer(s *Store) *Renewer { return &Renewer{Store: s} }

// Renew extends the grant c as Store.Renew does, in a statement shared
// with the other renewals asked meanwhile. It returns an error wrapping
// ErrRenewerClosed after Close, and ctx.Err() (wrapped) when ctx ends
// before its statement answers.
func (r *Renewer) Renew(ctx context.Context, c fence.Custody) error {
	// The renewal is pending from now on, also while it waits for the
	// statement in flight: fenced worker transactions hold back for it.
	defer fence.LeaseWrite(r.db)()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("renew lease %q: %w", c.Lease, err)
	}
	req := &renewRequest{ctx: ctx, c: c, done: make(chan error, 1)}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("renew lease %q: %w", c.Lease, ErrRenewerClosed)
	}
	r.queue = append(r.queue, req)
	if !r.running {
		r.running = true
		r.wg.Add(1)
		go r.flush()
	}
	r.mu.Unlock()
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("renew lease %q: %w", c.Lease, ctx.Err())
	}
}

// flush runs statements while renewals are queued, then ends: there is no
// goroutine while nothing is asked.
func (r *Renewer) flush() {
	defer r.wg.Done()
	for {
		batch := r.next()
		if batch == nil {
			return
		}
		cs := make([]fence.Custody, len(batch))
		for i, req := range batch {
			cs[i] = req.c
		}
		// The driver ignores contexts; each caller bounds its own wait.
		errs := r.Store.RenewAll(context.Background(), cs)
		for i, req := range batch {
			req.done <- errs[i]
		}
	}
}

// next takes up to MaxRenewBatch queued renewals whose callers still
// wait; nil (and the flush goroutine's end) when none is queued.
func (r *Renewer) next() []*renewRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	var batch []*renewRequest
	taken := 0
	for _, req := range r.queue {
		taken++
		if req.ctx.Err() != nil {
			continue // its caller has returned; nothing to renew for it
		}
		batch = append(batch, req)
		if len(batch) == MaxRenewBatch {
			break
		}
	}
	r.queue = append(r.queue[:0:0], r.queue[taken:]...)
	if len(batch) == 0 {
		r.running = false
		return nil
	}
	return batch
}

// Close refuses further renewals, fails those still queued with
// ErrRenewerClosed, and waits until the statement in flight, if any, has
// answered or ctx ends (the driver cannot cancel a statement; it returns
// ctx.Err() then).
func (r *Renewer) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	for _, req := range r.queue {
		req.done <- fmt.Errorf("renew lease %q: %w", req.c.Lease, ErrRenewerClosed)
	}
	r.queue = nil
	inFlight := r.running
	r.mu.Unlock()
	if !inFlight {
		return nil
	}
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close lease renewer: a renewal statement still in flight: %w", ctx.Err())
	}
}
