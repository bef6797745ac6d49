package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/harness"
	"github.com/atcr-io/appview/internal/testsupport"
)

// Health check timing of the scenario: short rounds, and a timeout below
// the interval as the configuration requires.
const (
	healthInterval = time.Second
	healthTimeout  = 500 * time.Millisecond
	// healthRoundSlack is how late the unhealthy mark may come after one
	// interval: the refused check itself, a timer firing and the process
	// being scheduled under the race detector on two loaded cores. It is
	// below one interval, so a skipped round still fails the test.
	healthRoundSlack = 600 * time.Millisecond
)

// holdStatus is one hold of /debug/holds (actors/health.Status).
type holdStatus struct {
	HoldDID             string `json:"hold_did"`
	Healthy             bool   `json:"healthy"`
	LastCheckedMS       int64  `json:"last_checked_ms"`
	LastError           string `json:"last_error"`
	ConsecutiveFailures int    `json:"consecutive_failures"`
	LastHealthyMS       int64  `json:"last_healthy_ms"`
}

// debugHolds is an instance's /debug/holds document.
type debugHolds struct {
	Instance string       `json:"instance"`
	RoundMS  int64        `json:"round_at_ms"`
	Holds    []holdStatus `json:"holds"`
}

// holds reads i's /debug/holds, by hold DID.
func holds(ctx context.Context, i *harness.Instance) (debugHolds, map[string]holdStatus, error) {
	var d debugHolds
	if err := adminJSON(ctx, i, "/debug/holds", &d); err != nil {
		return d, nil, err
	}
	by := map[string]holdStatus{}
	for _, h := range d.Holds {
		by[h.HoldDID] = h
	}
	return d, by, nil
}

// waitHolds polls i's /debug/holds until want (hold DID → healthy) holds
// for every hold named, and returns the statuses.
func waitHolds(ctx context.Context, i *harness.Instance, want map[string]bool) (map[string]holdStatus, error) {
	var last map[string]holdStatus
	err := poll(ctx, feedsPoll, fmt.Sprintf("%s's /debug/holds to show %v", i.ID, want), func() (bool, error) {
		_, by, err := holds(ctx, i)
		if err != nil {
			return false, err
		}
		last = by
		for did, healthy := range want {
			if s, ok := by[did]; !ok || s.Healthy != healthy {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w (last: %+v)", err, last)
	}
	return last, nil
}

// TestEveryInstanceChecksHoldsIntoItsOwnCacheAndSeesAHoldGoDownWithinOneInterval
// runs the unleased health checker on two instances against two holds
// known from captain records. Each instance serves its own cache on
// /debug/holds; when one hold goes down (its port refuses), both mark it
// unhealthy by the round that follows, within one health.check_interval,
// and the other hold stays healthy.
func TestEveryInstanceChecksHoldsIntoItsOwnCacheAndSeesAHoldGoDownWithinOneInterval(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	db := fileDB(t)
	reader := newDBReader(t, db)
	ctx := within(t, 60*time.Second)
	plc := testsupport.NewPLC(t)
	up, down := testsupport.NewHold(t), testsupport.NewHold(t)
	const upDID, downDID = "did:plc:holdup", "did:plc:holddown"
	plc.RegisterHold(upDID, up.URL())
	plc.RegisterHold(downDID, down.URL())
	for _, did := range []string{upDID, downDID} {
		reader.exec(t, ctx, `INSERT INTO hold_captains (hold_did, owner_did, public, allow_all_crew, enable_bluesky_posts, deployed_at)
VALUES (?1, 'did:plc:captain', 1, 0, 0, ?2)`, did, time.Now().UnixMilli())
	}
	spec := func(id string) harness.Spec {
		return feedSpec(id, db, map[string]any{
			"health.check_interval": healthInterval.String(),
			"health.timeout":        healthTimeout.String(),
			"identity.plc_url":      plc.URL(),
		})
	}
	insts, err := c.StartAll(ctx, spec("a"), spec("b"))
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range insts {
		if _, err := waitHolds(ctx, i, map[string]bool{upDID: true, downDID: true}); err != nil {
			t.Fatal(err)
		}
		d, _, err := holds(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		if d.Instance != i.ID {
			t.Errorf("%s serves the cache of instance %q; want its own", i.ID, d.Instance)
		}
	}
	if n := down.HealthChecks(); n < 2 {
		t.Errorf("the hold answered %d health checks; want at least one from each instance", n)
	}

	downAt := time.Now()
	down.Down()
	for _, i := range insts {
		e, err := i.Wait(ctx, func(e harness.Event) bool { return e.Event == "hold.unhealthy" && e.Str("hold") == downDID })
		if err != nil {
			t.Fatalf("%s never logged %s unhealthy: %v", i.ID, downDID, err)
		}
		by, err := waitHolds(ctx, i, map[string]bool{downDID: false, upDID: true})
		if err != nil {
			t.Fatal(err)
		}
		s := by[downDID]
		// hold.unhealthy is logged once, by the first check that failed
		// (however late this poll of /debug/holds comes).
		found := e.Time.Sub(downAt)
		t.Logf("%s: the hold went down; marked unhealthy %v later (by now %d consecutive failures, last error %q)",
			i.ID, found, s.ConsecutiveFailures, s.LastError)
		if found > healthInterval+healthRoundSlack {
			t.Errorf("%s marked the hold unhealthy %v after it went down; want the next round, within %v (+%v slack)",
				i.ID, found, healthInterval, healthRoundSlack)
		}
		if s.LastHealthyMS == 0 || time.UnixMilli(s.LastHealthyMS).After(downAt) {
			t.Errorf("%s: the down hold's last healthy check is at %d ms; want one before it went down", i.ID, s.LastHealthyMS)
		}
	}
	for _, i := range insts {
		checkStopped(t, ctx, i)
	}
	tl := c.Timeline()
	if g := harness.Grants(tl)[workerHealth]; len(g) != 0 {
		t.Errorf("the health checker was granted a lease (%s); it must run unleased on every instance", g[0].Event)
	}
	for _, i := range insts {
		if _, err := i.Wait(ctx, harness.Is(harness.WorkerStarted, workerHealth)); err != nil {
			t.Errorf("the health checker did not run on %s: %v", i.ID, err)
		}
	}
}
