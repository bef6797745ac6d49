package main

import (
	"context"
	"path/filepath"

	"github.com/atcr-io/appview/internal/harness"
)

// rssWarmRenewals is how many renewals an instance does before its RSS is
// read: by then it has opened its database, started every worker and run
// each code path of its steady state at least once.
const rssWarmRenewals = 4

func (r *runner) idleRSS(ctx context.Context) error {
	dir, err := r.scratch("rss")
	if err != nil {
		return err
	}
	c := harness.NewCluster(r.o.Bin, dir)
	defer c.Close()
	i, err := c.Start(ctx, r.spec("file:"+filepath.Join(dir, "appview.db")))
	if err != nil {
		return err
	}
	from := 0
	for range rssWarmRenewals {
		e, err := wait(ctx, i, from, harness.Is(harness.LeaseRenewed, benchLease))
		if err != nil {
			return err
		}
		from = e.Seq + 1
	}
	rss, err := i.RSS()
	if err != nil {
		return err
	}
	r.figure("idle_rss_mb", float64(rss)/(1<<20), "MB")
	return nil
}
