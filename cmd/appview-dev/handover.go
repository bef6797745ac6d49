package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/harness"
)

// benchLease is the lease the handover scenarios measure: cleanup is the
// leased worker every instance runs by default.
const benchLease = "cleanup"

// waitBound bounds one wait for an event in a scenario.
const waitBound = 30 * time.Second

// wait returns the first event from index from on in inst's log that m
// matches.
func wait(ctx context.Context, inst *harness.Instance, from int, m harness.Match) (harness.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, waitBound)
	defer cancel()
	e, err := inst.Log.WaitFrom(ctx, from, m)
	if err != nil {
		return e, fmt.Errorf("%s: %w (last lines:\n%s)", inst.ID, err, inst.Tail(8))
	}
	return e, nil
}

// pair is a holder of benchLease and a contender registered for nudges.
type pair struct {
	c         *harness.Cluster
	holder    *harness.Instance
	contender *harness.Instance
	fence     int64
}

// startPair starts the holder, waits for its grant, then starts the
// contender.
func (r *runner) startPair(ctx context.Context, c *harness.Cluster, db string) (*pair, error) {
	p := &pair{c: c}
	h, err := c.Start(ctx, r.spec(db))
	if err != nil {
		return nil, err
	}
	e, err := wait(ctx, h, 0, harness.Is(harness.WorkerStarted, benchLease))
	if err != nil {
		return nil, err
	}
	p.holder, p.fence = h, e.Fence
	return p, r.newContender(ctx, p, db)
}

// newContender starts the next contender and waits for its second
// lease.contended: the first one records it as a contender (asynchronously),
// so by the second a releasing holder will nudge it.
func (r *runner) newContender(ctx context.Context, p *pair, db string) error {
	i, err := p.c.Start(ctx, r.spec(db))
	if err != nil {
		return err
	}
	first, err := wait(ctx, i, 0, harness.Is(harness.LeaseContended, benchLease))
	if err != nil {
		return err
	}
	if _, err := wait(ctx, i, first.Seq+1, harness.Is(harness.LeaseContended, benchLease)); err != nil {
		return err
	}
	p.contender = i
	return nil
}

// handover stops the holder with SIGTERM and returns the contender's
// grant; the contender becomes the holder.
func (r *runner) handover(ctx context.Context, p *pair) (harness.Event, error) {
	mark := p.contender.Log.Len()
	sctx, cancel := context.WithTimeout(ctx, waitBound)
	code, err := p.holder.Stop(sctx)
	cancel()
	if err != nil {
		return harness.Event{}, err
	}
	if code != 0 {
		return harness.Event{}, fmt.Errorf("%s exited %d on SIGTERM; want 0", p.holder.ID, code)
	}
	acq, err := wait(ctx, p.contender, mark, harness.And(harness.Is(harness.LeaseAcquired, benchLease), harness.Fence(p.fence+1)))
	if err != nil {
		return acq, err
	}
	p.holder, p.contender, p.fence = p.contender, nil, acq.Fence
	return acq, nil
}

// graceful measures graceful handovers on a file database or, with kind
// "sqld", on a sqld server started for the run (figures suffixed _sqld).
func (r *runner) graceful(ctx context.Context, kind string) error {
	rounds, suffix := r.n.graceful, ""
	if kind == "sqld" {
		if r.o.Sqld == "" {
			r.note("graceful_handover_p50_ms_sqld not measured: no sqld binary (--sqld)")
			return nil
		}
		rounds, suffix = r.n.gracefulSqld, "_sqld"
	}
	dir, err := r.scratch("graceful-" + kind)
	if err != nil {
		return err
	}
	c := harness.NewCluster(r.o.Bin, dir)
	defer c.Close()
	db := "file:" + filepath.Join(dir, "appview.db")
	if kind == "sqld" {
		q, err := harness.StartSqld(ctx, harness.SqldSpec{Bin: r.o.Sqld, Dir: filepath.Join(dir, "sqld")})
		if err != nil {
			return err
		}
		defer q.Stop()
		db = q.URL
	}
	p, err := r.startPair(ctx, c, db)
	if err != nil {
		return err
	}
	var samples []time.Duration
	for len(samples) < rounds {
		old, fence := p.holder, p.fence
		acq, err := r.handover(ctx, p)
		if err != nil {
			return err
		}
		rel, err := wait(ctx, old, 0, harness.And(harness.Is(harness.LeaseReleased, benchLease), harness.Fence(fence)))
		if err != nil {
			return fmt.Errorf("holder exited without releasing: %w", err)
		}
		samples = append(samples, acq.Time.Sub(rel.Time))
		if err := r.newContender(ctx, p, db); err != nil {
			return err
		}
	}
	r.note("graceful handovers (%s): %d, min %v, max %v", kind, len(samples), percentile(samples, 0.0001), percentile(samples, 100))
	// The target's own ratio, paired: the acquire round
	// trip is timed in this run, on this database, right after the
	// handovers (the last holder still running, as a contender would find
	// it), so each run's ratio compares figures of one moment of the host.
	reader, err := database.Open(ctx, database.Options{URL: db, BusyTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer reader.Close()
	acquire, _, err := acquireRoundTrips(ctx, reader, r.n.rtt)
	if err != nil {
		return fmt.Errorf("acquire round trips after the handovers: %w", err)
	}
	p50, rtt := percentile(samples, 50), percentile(acquire, 50)
	r.note("graceful (%s): acquire round trip on the same database p50 %v", kind, rtt)
	r.figure("graceful_handover_p50_ms"+suffix, ms(p50), "ms")
	r.figure("graceful_handover_p99_ms"+suffix, ms(percentile(samples, 99)), "ms")
	r.figure("graceful_handover_rtt_ratio"+suffix, p50.Seconds()/rtt.Seconds(), "ratio")
	return nil
}

func (r *runner) crash(ctx context.Context) error {
	dir, err := r.scratch("crash")
	if err != nil {
		return err
	}
	c := harness.NewCluster(r.o.Bin, dir)
	defer c.Close()
	path := filepath.Join(dir, "appview.db")
	db := "file:" + path
	p, err := r.startPair(ctx, c, db)
	if err != nil {
		return err
	}
	reader, err := database.Open(ctx, database.Options{URL: db, BusyTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer reader.Close()
	var samples []time.Duration
	for len(samples) < r.n.crash {
		killed, held := p.holder.ID, p.fence
		mark := p.contender.Log.Len()
		p.holder.Kill()
		rows, err := fence.List(ctx, reader)
		if err != nil {
			return err
		}
		var row *fence.Row
		for i := range rows {
			if rows[i].Name == benchLease {
				row = &rows[i]
			}
		}
		if row == nil || row.Holder != killed || row.Fence != held {
			return fmt.Errorf("lease row %+v right after killing %s; want its grant (fence %d)", row, killed, held)
		}
		acq, err := wait(ctx, p.contender, mark, harness.And(harness.Is(harness.LeaseAcquired, benchLease), harness.Fence(held+1)))
		if err != nil {
			return err
		}
		p.holder, p.fence = p.contender, acq.Fence
		samples = append(samples, acq.Time.Sub(time.UnixMilli(row.ExpiresAt)))
		if err := r.newContender(ctx, p, db); err != nil {
			return err
		}
	}
	r.note("crash handovers: %d, min %v, max %v (after expiry)", len(samples), percentile(samples, 0.0001), percentile(samples, 100))
	r.figure("crash_handover_minus_ttl_p50_ms", ms(percentile(samples, 50)), "ms")
	return nil
}
