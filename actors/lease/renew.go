package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// MaxRenewBatch is the most grants one renewal statement carries, so a
// statement's time (and the write lock it holds) stays bounded.
const MaxRenewBatch = 2000

// A batched renewal takes one holder's grants as one JSON object of name:
// fence (one statement text for any count, no 32,766-variable cap),
// joined on the primary key, with renewSQL's conditions per grant.
var (
	renewAllSQL = `UPDATE leases SET renewed_at = ` + database.NowMS + `, expires_at = ` + database.NowMS + ` + ?1
FROM json_each(?2) AS r
WHERE leases.name = r.key AND leases.holder = ?3 AND leases.fence = r.value
  AND leases.renewed_at <> leases.expires_at`

	// renewedSQL finds the listed grants still carried unreleased: after
	// renewAllSQL renewed fewer rows than listed, exactly the renewed ones
	// (a grant that matched no row never matches again).
	renewedSQL = `SELECT ` + database.Text("leases.name") + `, leases.fence FROM leases, json_each(?1) AS r
WHERE leases.name = r.key AND leases.holder = ?2 AND leases.fence = r.value
  AND leases.renewed_at <> leases.expires_at`
)

// RenewAll renews every grant of cs, on the database's clock, with one
// statement per holder and MaxRenewBatch grants (a process renews under
// one holder, its instance_id), and returns one error per grant, in the
// order of cs: nil when renewed, an error wrapping fence.ErrSuperseded
// when the row no longer carries that holder and fence or the grant was
// released, or the statement's error. The file check runs once per call;
// each outcome goes into the write health as Renew's would.
func (s *Store) RenewAll(ctx context.Context, cs []fence.Custody) []error {
	errs := make([]error, len(cs))
	if len(cs) == 0 {
		return errs
	}
	defer s.db.Urgent()()
	checked := s.check()
	byHolder := map[string][]int{}
	for i, c := range cs {
		byHolder[c.Holder] = append(byHolder[c.Holder], i)
	}
	for holder, idx := range byHolder {
		for start := 0; start < len(idx); start += MaxRenewBatch {
			chunk := idx[start:min(start+MaxRenewBatch, len(idx))]
			err := checked
			var got map[grantKey]bool
			if err == nil {
				got, err = s.renewChunk(ctx, holder, cs, chunk)
			}
			for _, i := range chunk {
				c := cs[i]
				var out error
				switch {
				case err != nil:
					out = fmt.Errorf("renew lease %q: %w", c.Lease, err)
				case got != nil && !got[grantKey{c.Lease, c.Fence}]:
					out = fmt.Errorf("renew lease %q (fence %d): %w", c.Lease, c.Fence, fence.ErrSuperseded)
				}
				errs[i] = s.note(c.Lease, out)
			}
		}
	}
	return errs
}

// grantKey singles out a grant: a name holds one fence at a time and
// fences are never reused.
type grantKey struct {
	name  string
	fence int64
}

// renewChunk runs one statement for the grants cs[i], i in idx, all of
// holder. It returns nil when it renewed as many rows as distinct grants
// were listed (every one: the common case reads nothing back), else the
// set of grants renewed.
func (s *Store) renewChunk(ctx context.Context, holder string, cs []fence.Custody, idx []int) (map[grantKey]bool, error) {
	seen := make(map[grantKey]bool, len(idx))
	b := []byte{'{'}
	for _, i := range idx {
		k := grantKey{cs[i].Lease, cs[i].Fence}
		if seen[k] {
			continue
		}
		seen[k] = true
		if len(seen) > 1 {
			b = append(b, ',')
		}
		name, err := json.Marshal(k.name)
		if err != nil {
			return nil, fmt.Errorf("encode the grants to renew: %w", err)
		}
		b = strconv.AppendInt(append(append(b, name...), ':'), k.fence, 10)
	}
	list := string(append(b, '}'))
	release, err := s.db.UrgentTurn(ctx)
	if err != nil {
		return nil, err
	}
	res, err := s.db.ExecContext(ctx, renewAllSQL, s.ttl.Milliseconds(), list, holder)
	release()
	if err != nil {
		return nil, err
	}
	if n, err := res.RowsAffected(); err != nil || n == int64(len(seen)) {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, renewedSQL, list, holder)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	renewed := make(map[grantKey]bool, len(seen))
	for rows.Next() {
		var k grantKey
		if err := rows.Scan(&k.name, &k.fence); err != nil {
			return nil, err
		}
		renewed[k] = true
	}
	return renewed, rows.Err()
}

// ErrRenewerClosed fails a renewal asked of a Renewer after Close.
var ErrRenewerClosed = errors.New("lease renewer closed")

// Renewer is a Store whose renewals are batched: the LeaseActors of a
// process renew through one, and renewals asked while a statement is in
// flight go into the next (group commit); a lone renewal starts at once.
// Each caller learns its own outcome, or returns when its context ends.
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
	defer r.db.Urgent()() // pending while it waits for the statement in flight too
	req := &renewRequest{ctx: ctx, c: c, done: make(chan error, 1)}
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		return fmt.Errorf("renew lease %q: %w", c.Lease, ErrRenewerClosed)
	case ctx.Err() != nil:
		r.mu.Unlock()
		return fmt.Errorf("renew lease %q: %w", c.Lease, ctx.Err())
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

// flush runs statements while renewals are queued, then ends.
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
		for i, err := range r.Store.RenewAll(context.Background(), cs) {
			batch[i].done <- err
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
			continue // its caller has returned
		}
		if batch = append(batch, req); len(batch) == MaxRenewBatch {
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
// answered or ctx ends (the driver cannot cancel a statement).
func (r *Renewer) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	for _, req := range r.queue {
		req.done <- fmt.Errorf("renew lease %q: %w", req.c.Lease, ErrRenewerClosed)
	}
	r.queue = nil
	r.mu.Unlock()
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close lease renewer: a renewal statement still in flight: %w", ctx.Err())
	}
}
