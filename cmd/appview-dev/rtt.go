package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/fence"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/harness"
)

// openDB opens and migrates a database for an in-process measurement: a
// file database in dir, or a sqld server started in dir (stopped by the
// returned func).
func (r *runner) openDB(ctx context.Context, kind, dir string) (*database.DB, func(), error) {
	url := "file:" + filepath.Join(dir, "appview.db")
	stop := func() {}
	if kind == "sqld" {
		q, err := harness.StartSqld(ctx, harness.SqldSpec{Bin: r.o.Sqld, Dir: filepath.Join(dir, "sqld")})
		if err != nil {
			return nil, nil, err
		}
		url, stop = q.URL, q.Stop
	}
	db, err := database.Open(ctx, database.Options{URL: url, BusyTimeout: 5 * time.Second})
	if err != nil {
		stop()
		return nil, nil, err
	}
	if _, err := db.Migrate(ctx); err != nil {
		db.Close()
		stop()
		return nil, nil, err
	}
	return db, func() { db.Close(); stop() }, nil
}

// roundTrips measures lease.Store.Acquire of a released row (what a
// contender does at a handover) and lease.Store.Renew, one call at a time.
func (r *runner) roundTrips(ctx context.Context, kind string) error {
	if kind == "sqld" && r.o.Sqld == "" {
		r.note("acquire_rtt_p50_ms_sqld and renew_rtt_p50_ms_sqld not measured: no sqld binary (--sqld)")
		return nil
	}
	dir, err := r.scratch("rtt-" + kind)
	if err != nil {
		return err
	}
	db, closeDB, err := r.openDB(ctx, kind, dir)
	if err != nil {
		return err
	}
	defer closeDB()
	acquire, renew, err := acquireRoundTrips(ctx, db, r.n.rtt)
	if err != nil {
		return err
	}
	r.figure("acquire_rtt_p50_ms_"+kind, ms(percentile(acquire, 50)), "ms")
	r.figure("renew_rtt_p50_ms_"+kind, ms(percentile(renew, 50)), "ms")
	return nil
}

// rttLease is the lease the round-trip loops acquire, renew and release.
const rttLease = "bench-rtt"

// acquireRoundTrips times rounds acquires of a released lease
// (lease.Store.Acquire, what a contender does at a handover) and as
// many renewals (Store.Renew) on db, one call at a time, each grant
// released after its renewal. It returns the durations of both.
func acquireRoundTrips(ctx context.Context, db *database.DB, rounds int) (acquire, renew []time.Duration, err error) {
	store := lease.NewStore(db, Timing.TTL)
	for range rounds {
		start := time.Now()
		g, err := store.Acquire(ctx, rttLease, "bench")
		d := time.Since(start)
		if err != nil {
			return nil, nil, err
		}
		if !g.Granted {
			return nil, nil, fmt.Errorf("acquire of a released lease not granted: %+v", g)
		}
		acquire = append(acquire, d)
		c := fence.Custody{Lease: rttLease, Holder: "bench", Fence: g.Fence}
		start = time.Now()
		err = store.Renew(ctx, c)
		d = time.Since(start)
		if err != nil {
			return nil, nil, err
		}
		renew = append(renew, d)
		if err := store.Release(ctx, c); err != nil {
			return nil, nil, err
		}
	}
	return acquire, renew, nil
}

// renewCostInstances is how many instances (connection pools) renew at once.
const renewCostInstances = 3

// bareRenewSQL is the cheapest statement that extends a grant: no
// database clock, no holder or fence match.
const bareRenewSQL = `UPDATE leases SET renewed_at = ?1, expires_at = ?2 WHERE name = ?3`

// renewCostSizes are the leases per instance renew_cost_ratio is
// reported for besides r.n.renewLeases (renew_cost_ratio itself):
// renew_cost_ratio_<size>.
var renewCostSizes = []int{5, 100}

// renewCostWork is about how many leases one side of a pair renews per
// instance: a round of 5 leases is repeated until it renews as many, so
// that the small sizes are not timed at the clock's and the scheduler's
// resolution.
const renewCostWork = 1000

// renewCost times rounds in which every instance renews all its leases
// the way a renew tick does, through lease.Store.RenewAll (one
// statement per instance per round: the batched path the LeaseActors take
// through lease.Renewer), against rounds of bare single-row UPDATEs
// of the same rows, interleaved so that drift in the host's speed falls
// on both alike. It is measured for r.n.renewLeases leases per instance
// (renew_cost_ratio) and for each of renewCostSizes below it
// (renew_cost_ratio_<size>).
func (r *runner) renewCost(ctx context.Context) error {
	dir, err := r.scratch("renew-cost")
	if err != nil {
		return err
	}
	first, closeFirst, err := r.openDB(ctx, "file", dir)
	if err != nil {
		return err
	}
	defer closeFirst()
	insts := make([]*renewInstance, renewCostInstances)
	for k := range insts {
		db := first
		if k > 0 {
			db, err = database.Open(ctx, database.Options{URL: "file:" + filepath.Join(dir, "appview.db"), BusyTimeout: 5 * time.Second})
			if err != nil {
				return err
			}
			defer db.Close()
		}
		in := &renewInstance{db: db, store: lease.NewStore(db, time.Hour)}
		holder := fmt.Sprintf("bench-%d", k)
		for j := range r.n.renewLeases {
			name := fmt.Sprintf("bench-renew-%d-%04d", k, j)
			g, err := in.store.Acquire(ctx, name, holder)
			if err != nil {
				return err
			}
			in.grants = append(in.grants, fence.Custody{Lease: name, Holder: holder, Fence: g.Fence})
		}
		insts[k] = in
	}
	for _, size := range renewCostSizes {
		if size >= r.n.renewLeases {
			continue
		}
		ratio, err := r.renewCostOf(ctx, insts, size)
		if err != nil {
			return err
		}
		r.figure(fmt.Sprintf("renew_cost_ratio_%d", size), ratio, "ratio")
	}
	ratio, err := r.renewCostOf(ctx, insts, r.n.renewLeases)
	if err != nil {
		return err
	}
	r.figure("renew_cost_ratio", ratio, "ratio")
	return nil
}

// renewInstance is one instance of the renew-cost step: its own
// connection pool and store, and the grants it holds.
type renewInstance struct {
	db     *database.DB
	store  *lease.Store
	grants []fence.Custody
}

// renewCostOf returns the median over r.n.renewRounds pairs of (batched
// round time / bare round time), each instance renewing its first size
// grants.
func (r *runner) renewCostOf(ctx context.Context, insts []*renewInstance, size int) (float64, error) {
	reps := max(1, renewCostWork/size)
	// slow counts bare renewals that took a millisecond or more: on a
	// file database that is a writer that found the lock taken and slept
	// in SQLite's busy handler (whose first sleep is 1 ms).
	var slow atomic.Int64
	round := func(renew func(in *renewInstance, grants []fence.Custody) error) (time.Duration, error) {
		var wg sync.WaitGroup
		errs := make([]error, len(insts))
		start := time.Now()
		for k, in := range insts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range reps {
					if err := renew(in, in.grants[:size]); err != nil {
						errs[k] = err
						return
					}
				}
			}()
		}
		wg.Wait()
		d := time.Since(start)
		return d, errors.Join(errs...)
	}
	batched := func(in *renewInstance, grants []fence.Custody) error {
		t := time.Now()
		err := errors.Join(in.store.RenewAll(ctx, grants)...)
		if time.Since(t) >= time.Millisecond {
			slow.Add(1)
		}
		return err
	}
	bare := func(in *renewInstance, grants []fence.Custody) error {
		for _, c := range grants {
			t := time.Now()
			now := t.UnixMilli()
			if _, err := in.db.ExecContext(ctx, bareRenewSQL, now, now+time.Hour.Milliseconds(), c.Lease); err != nil {
				return err
			}
			if time.Since(t) >= time.Millisecond {
				slow.Add(1)
			}
		}
		return nil
	}
	var storeRounds, bareRounds []time.Duration
	var ratios []float64
	for k := range r.n.renewRounds {
		// Alternate which goes first, so neither always follows the other
		// (a WAL checkpoint falls on whichever round fills the log).
		var s, b time.Duration
		var sSlow, bSlow int64
		var err error
		storeRound := func() {
			slow.Store(0)
			if s, err = round(batched); err == nil {
				sSlow = slow.Load()
			}
		}
		bareRound := func() {
			slow.Store(0)
			if b, err = round(bare); err == nil {
				bSlow = slow.Load()
			}
		}
		if k%2 == 0 {
			if storeRound(); err == nil {
				bareRound()
			}
		} else {
			if bareRound(); err == nil {
				storeRound()
			}
		}
		if err != nil {
			return 0, err
		}
		r.note("renew round %d (%d leases × %d instances × %d): batched %v (%d statements >= 1 ms), bare %v (%d)", k, size, len(insts), reps, s, sSlow, b, bSlow)
		storeRounds, bareRounds = append(storeRounds, s), append(bareRounds, b)
		ratios = append(ratios, float64(s)/float64(b))
	}
	s, b := percentile(storeRounds, 50), percentile(bareRounds, 50)
	r.note("renew rounds of %d×%d leases (×%d): batched median %v, bare median %v", len(insts), size, reps, s, b)
	// The median of the paired per-round ratios: each pair ran back to
	// back, so the host's drift and the writers' lock contention (SQLite's
	// busy handler sleeps 1 ms at a time) fall on both sides of one ratio.
	sort.Float64s(ratios)
	return ratios[len(ratios)/2], nil
}
