package tests

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/harness"
)

// sqldPort is sqld's port inside its namespace (its own port space).
const sqldPort = "18080"

// partitionSlack is added to renew_deadline and ttl for the time it takes
// a timer to fire and a process to log under a race-enabled build.
const partitionSlack = 500 * time.Millisecond

func TestAHolderCutOffFromTheDatabaseStopsWithinItsRenewDeadlineAndStaysSuperseded(t *testing.T) {
	t.Parallel()
	n := newPartitionNet(t)
	ctx := within(t, 2*time.Minute)
	dbA := "http://" + n.dbForA + ":" + sqldPort
	dbB := "http://" + n.dbForB + ":" + sqldPort
	leasesFromB := func() (map[string]harness.LeaseRow, error) {
		return harness.Leases(ctx, bin, dbB, wrap(n.b)...)
	}
	q, err := harness.StartSqld(ctx, harness.SqldSpec{
		Bin: sqldBin(t), Dir: filepath.Join(t.TempDir(), "sqld"),
		Listen: "0.0.0.0:" + sqldPort, Wrap: wrap(n.db),
		// Reached from b's namespace, a fresh database answers that it has
		// no leases table yet (`appview leases` only reads): sqld is up.
		Probe: func(context.Context) error {
			_, err := leasesFromB()
			if err != nil && strings.Contains(err.Error(), "has appview serve run against it?") {
				return nil
			}
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Stop)
	c := newCluster(t)
	// The Stripe stub listens on the host's loopback, out of the
	// namespaces' reach: billing rounds fail there (refused at once) while
	// the worker keeps running and its lease held, which is all this
	// test needs of it.
	const stripe = "http://127.0.0.1:1"

	specA := leasedSpec("a", dbA, stripe)
	// a's periodic jobs run once, at their grant, and then idle: a
	// transaction of a's that is open at the cut keeps sqld's write lock
	// until sqld's own transaction timeout (about 5 s, the limit README
	// Operations documents for renew_deadline on sqld), which no lease
	// timing can beat. With cleanup every 200 ms that was the case in about
	// one run in ten, and b took over after 5 s instead of within the TTL.
	// What this test checks is a holder cut off between its writes.
	specA.Set["cleanup.interval"], specA.Set["billing.interval"] = "1h", "1h"
	// Admin ports on non-loopback addresses need a token; the
	// nudges between the two instances carry it.
	specA.Wrap, specA.AdminAddr, specA.Set["admin.token"] = wrap(n.a), n.addrA+":0", partitionToken
	a, err := c.Start(ctx, specA)
	if err != nil {
		t.Fatal(err)
	}
	fences := map[string]int64{}
	for _, l := range leasedWorkers {
		e, err := a.Wait(ctx, harness.Is(harness.WorkerStarted, l))
		if err != nil {
			t.Fatal(err)
		}
		fences[l] = e.Fence
	}
	specB := leasedSpec("b", dbB, stripe)
	specB.Wrap, specB.AdminAddr, specB.Set["admin.token"] = wrap(n.b), n.addrB+":0", partitionToken
	b, err := c.Start(ctx, specB)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leasedWorkers {
		if _, err := b.Wait(ctx, harness.Is(harness.LeaseContended, l)); err != nil {
			t.Fatal(err)
		}
	}

	// Lines a logged before the cut may still be on their way to the
	// harness when mark is taken: the check below ignores events that
	// happened (their "at") before the link was down.
	mark := a.Log.Len()
	n.cutA()
	// The link is down once `ip link set down` has returned, not before:
	// the bounds below are measured from there, so the time the command
	// took to start on a loaded host does not count against a, and a
	// renewal that a made while the command was starting (one run saw
	// one 12 ms before the command returned) is not an act after the cut.
	cut := time.Now()
	rows, err := leasesFromB()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leasedWorkers {
		lost, err := a.Log.WaitFrom(ctx, mark, harness.Is(harness.LeaseLost, l))
		if err != nil {
			t.Fatalf("a was cut off and never declared %s lost: %v", l, err)
		}
		stopped, err := a.Log.WaitFrom(ctx, mark, harness.Is(harness.WorkerStopped, l))
		if err != nil {
			t.Fatalf("a was cut off and never stopped its %s worker: %v", l, err)
		}
		t.Logf("%s: a cut off at %s; lost it (%s) after %v, worker stopped after %v",
			l, cut.Format("15:04:05.000"), lost.Reason, lost.Time.Sub(cut), stopped.Time.Sub(cut))
		if d := stopped.Time.Sub(cut); d > timing.RenewDeadline+partitionSlack {
			t.Errorf("%s: a's worker stopped %v after the cut; want within renew_deadline %v (+%v)", l, d, timing.RenewDeadline, partitionSlack)
		}
		acq, err := b.Wait(ctx, harness.Is(harness.LeaseAcquired, l))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: b took over with fence %d after %v", l, acq.Fence, acq.Time.Sub(cut))
		if acq.Fence != fences[l]+1 {
			t.Errorf("%s: b acquired fence %d; want a's %d + 1", l, acq.Fence, fences[l])
		}
		if d := acq.Time.Sub(cut); d > timing.TTL+partitionSlack {
			t.Errorf("%s: b took over %v after the cut; want within ttl %v (+%v)", l, d, timing.TTL, partitionSlack)
		}
		if r := rows[l]; r.Holder == "a" && time.UnixMilli(r.ExpiresAt).Sub(acq.Time) > time.Millisecond {
			t.Errorf("%s: b acquired before a's grant expired (row %+v, %s)", l, r, acq)
		}
	}

	healMark := a.Log.Len()
	n.healA()
	// Healed, a reaches the database again and finds b holding every lease.
	for _, l := range leasedWorkers {
		e, err := a.Log.WaitFrom(ctx, healMark, harness.And(harness.Is(harness.LeaseContended, l), func(e harness.Event) bool {
			return e.Str("holder") == "b"
		}))
		if err != nil {
			t.Fatalf("a was healed and never saw b holding %s: %v", l, err)
		}
		t.Logf("%s: a healed; contends against b after %v", l, e.Time.Sub(cut))
		from := b.Log.Len()
		for range 2 {
			r, err := b.Log.WaitFrom(ctx, from, harness.Is(harness.LeaseRenewed, l))
			if err != nil {
				t.Fatal(err)
			}
			from = r.Seq + 1
		}
	}
	for _, e := range a.Log.Find(mark, func(e harness.Event) bool {
		return (e.Event == harness.LeaseRenewed || e.Event == harness.LeaseAcquired ||
			e.Event == harness.WorkerStarted && e.Lease != workerHealth || sweep("ok")(e)) && !e.Time.Before(cut)
	}) {
		t.Errorf("a acted as a holder after it was cut off: %s\n  %s", e, e.Line)
	}
	rows, err = leasesFromB()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leasedWorkers {
		if r := rows[l]; r.Holder != "b" || r.Fence != fences[l]+1 || r.State != "held" {
			t.Errorf("%s row %+v after the heal; want held by b with fence %d", l, r, fences[l]+1)
		}
	}
	for _, i := range []*harness.Instance{a, b} {
		checkStopped(t, ctx, i)
	}
	if err := harness.CheckFences(c.Timeline(), nil); err != nil {
		t.Error(err)
	}
}

// partitionToken is admin.token of both instances of the partition test.
const partitionToken = "partition-test-admin-token"
