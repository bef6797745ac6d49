package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/harness"
	"github.com/atcr-io/appview/internal/testsupport"
)

// billingHold is the hold DID of the billing scenarios (a did:plc, so a
// real process resolves it through the fake PLC directory to a hold on
// loopback).
const billingHold = "did:plc:billinghold"

// billingInterval is how often the holder runs a round: short, so that a
// change not pushed, or pushed twice, shows within a second.
const billingInterval = 200 * time.Millisecond

// tierStripe is a scriptable Stripe: GET /v1/subscriptions lists one
// active subscription per subscriber, its price carrying the subscriber's
// tier rank in metadata (see actors/billing's Stripe mapping).
type tierStripe struct {
	*httptest.Server
	mu    sync.Mutex
	ranks map[string]int // subscriber DID → tier rank
}

func newTierStripe(t *testing.T) *tierStripe {
	s := &tierStripe{ranks: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/subscriptions" {
			http.NotFound(w, r)
			return
		}
		data := []map[string]any{}
		s.mu.Lock()
		if r.URL.Query().Get("status") == "active" {
			for did, rank := range s.ranks {
				data = append(data, map[string]any{
					"id": "sub_" + did, "object": "subscription", "status": "active",
					"metadata": map[string]string{"did": did}, "customer": "cus_" + did,
					"items": map[string]any{"object": "list", "data": []map[string]any{{"price": map[string]any{
						"id": "price_" + strconv.Itoa(rank), "metadata": map[string]string{"tier_rank": strconv.Itoa(rank), "tier": fmt.Sprintf("plan-%d", rank)},
					}}}},
				})
			}
		}
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data, "has_more": false})
	}))
	t.Cleanup(s.Close)
	return s
}

// set makes did a subscriber of the given rank.
func (s *tierStripe) set(did string, rank int) {
	s.mu.Lock()
	s.ranks[did] = rank
	s.mu.Unlock()
}

// billingWorld is a hold with two crew members and the Stripe account
// their tiers come from.
type billingWorld struct {
	stripe *tierStripe
	hold   *testsupport.Hold
	plc    *testsupport.PLC
}

func newBillingWorld(t *testing.T, ctx context.Context, reader *dbReader) *billingWorld {
	w := &billingWorld{stripe: newTierStripe(t), hold: testsupport.NewHold(t), plc: testsupport.NewPLC(t)}
	w.plc.RegisterHold(billingHold, w.hold.URL())
	for i, member := range []string{"did:plc:alice", "did:plc:bob"} {
		reader.exec(t, ctx, `INSERT INTO hold_crew (hold_did, rkey, member_did, role, added_at) VALUES (?1, ?2, ?3, 'write', ?4)`,
			billingHold, fmt.Sprintf("crew%d", i), member, time.Now().UnixMilli())
	}
	return w
}

func (w *billingWorld) spec(id, db string) harness.Spec {
	return feedSpec(id, db, map[string]any{
		"billing.enabled":           true,
		"billing.interval":          billingInterval.String(),
		"billing.stripe_secret_key": "sk_test_feeds",
		"billing.stripe_api_url":    w.stripe.URL,
		"identity.plc_url":          w.plc.URL(),
	})
}

// pushed waits until the hold's last push to user was recorded at rank
// under fence (billing_tier_pushes: what makes a change done).
func pushed(ctx context.Context, reader *dbReader, user string, rank int, fence int64) error {
	return reader.pollInt(ctx, 1, `SELECT COUNT(*) FROM billing_tier_pushes
WHERE hold_did = ?1 AND user_did = ?2 AND tier_rank = ?3 AND outcome = 'pushed' AND fence = ?4`, billingHold, user, rank, fence)
}

// billingRound matches a completed round of the refresh under fence.
func billingRound(fence int64) harness.Match {
	return func(e harness.Event) bool { return e.Event == "billing.round" && e.Fence == fence }
}

// settled reads i's rounds under fence from index from on: they must
// push exactly pushes changes in all, then run idle more rounds that find
// nothing due, so a change pushed is not pushed again. Every round must
// end ok. from must come before the custody's grant: custody events are
// written by a relay goroutine, so a worker's own lines may precede its
// lease.acquired in the log.
func settled(ctx context.Context, i *harness.Instance, fence int64, from, pushes, idle int) error {
	total := 0
	for idle > 0 {
		e, err := i.Log.WaitFrom(ctx, from, billingRound(fence))
		if err != nil {
			return fmt.Errorf("%s ran no billing round under fence %d (%d of %d pushes seen): %w", i.ID, fence, total, pushes, err)
		}
		from = e.Seq + 1
		n, err := strconv.Atoi(string(e.Fields["pushed"]))
		switch {
		case err != nil || e.Str("outcome") != "ok":
			return fmt.Errorf("%s: a billing round failed: %s", i.ID, e.Line)
		case total == pushes && (n > 0 || string(e.Fields["due"]) != "0"):
			return fmt.Errorf("%s: a round found something due after every change was pushed: %s", i.ID, e.Line)
		case total == pushes:
			idle--
		}
		if total += n; total > pushes {
			return fmt.Errorf("%s pushed %d changes under fence %d; want %d: %s", i.ID, total, fence, pushes, e.Line)
		}
	}
	return nil
}

// wantCalls checks the hold received exactly want, each once.
func wantCalls(t *testing.T, hold *testsupport.Hold, want ...testsupport.CrewTier) {
	t.Helper()
	got := hold.Calls()
	sort.Slice(got, func(i, j int) bool {
		return got[i].UserDID < got[j].UserDID || got[i].UserDID == got[j].UserDID && got[i].TierRank < got[j].TierRank
	})
	if !slices.Equal(got, want) {
		t.Errorf("the hold received updateCrewTier %v; want exactly %v (one push per change)", got, want)
	}
}

// TestBillingPushesEachTierChangeOnceAcrossAGracefulHandover runs two
// instances with the billing tier refresh: one change (alice to rank 1)
// is pushed by the first holder, which is then stopped; the other takes
// over, reads what was recorded and pushes only the changes made after
// (alice to 2, bob to 3). The hold counts one updateCrewTier per change.
func TestBillingPushesEachTierChangeOnceAcrossAGracefulHandover(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	db := fileDB(t)
	reader := newDBReader(t, db)
	ctx := within(t, 60*time.Second)
	w := newBillingWorld(t, ctx, reader)
	w.stripe.set("did:plc:alice", 1)
	insts, err := c.StartAll(ctx, w.spec("a", db), w.spec("b", db))
	if err != nil {
		t.Fatal(err)
	}
	holder, started, err := harness.WaitAny(ctx, harness.Is(harness.WorkerStarted, leaseBilling), insts...)
	if err != nil {
		t.Fatal(err)
	}
	next := other(insts, holder)
	if err := pushed(ctx, reader, "did:plc:alice", 1, started.Fence); err != nil {
		t.Fatal(err)
	}
	if err := settled(ctx, holder, started.Fence, 0, 1, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := next.Wait(ctx, harness.Is(harness.LeaseContended, leaseBilling)); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, w.hold, testsupport.CrewTier{UserDID: "did:plc:alice", TierRank: 1})

	mark := next.Log.Len()
	stopCleanly(t, ctx, holder)
	acq, err := next.Log.WaitFrom(ctx, mark, harness.Is(harness.LeaseAcquired, leaseBilling))
	if err != nil {
		t.Fatal(err)
	}
	if acq.Fence != started.Fence+1 {
		t.Errorf("%s took billing over with fence %d; want %d", next.ID, acq.Fence, started.Fence+1)
	}
	// The new holder finds alice's rank 1 recorded: nothing due.
	if err := settled(ctx, next, acq.Fence, mark, 0, 2); err != nil {
		t.Fatal(err)
	}
	mark = next.Log.Len()
	w.stripe.set("did:plc:alice", 2)
	w.stripe.set("did:plc:bob", 3)
	if err := pushed(ctx, reader, "did:plc:alice", 2, acq.Fence); err != nil {
		t.Fatal(err)
	}
	if err := pushed(ctx, reader, "did:plc:bob", 3, acq.Fence); err != nil {
		t.Fatal(err)
	}
	if err := settled(ctx, next, acq.Fence, mark, 2, 2); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, w.hold,
		testsupport.CrewTier{UserDID: "did:plc:alice", TierRank: 1},
		testsupport.CrewTier{UserDID: "did:plc:alice", TierRank: 2},
		testsupport.CrewTier{UserDID: "did:plc:bob", TierRank: 3})
	stopCleanly(t, ctx, next)
	tl := c.Timeline()
	if err := harness.CheckExclusive(tl, leaseBilling); err != nil {
		t.Error(err)
	}
	if err := harness.CheckFences(tl, map[string]int64{leaseBilling: 1}); err != nil {
		t.Error(err)
	}
}

// slowHoldAnswer is how long the hold takes to answer the push in flight
// at SIGTERM: far longer than the stop takes to cancel the job, far
// shorter than the bound on waiting for a stopping job (5 s).
const slowHoldAnswer = time.Second

// TestABillingPushInFlightAtSigtermIsRecordedAndNotRepeated stops the
// holder while the hold is still answering a push: a graceful stop lets
// the push finish and records it under the custody still held, so the
// next holder does not push the change again.
func TestABillingPushInFlightAtSigtermIsRecordedAndNotRepeated(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	db := fileDB(t)
	reader := newDBReader(t, db)
	ctx := within(t, 60*time.Second)
	w := newBillingWorld(t, ctx, reader)
	inflight := make(chan struct{})
	var once sync.Once
	w.hold.Intercept(func(_ http.ResponseWriter, r *http.Request, _ testsupport.CrewTier) bool {
		once.Do(func() { close(inflight) })
		select {
		case <-time.After(slowHoldAnswer):
		case <-r.Context().Done(): // the client gave up; the hold has acted on the call anyway
		}
		return false
	})
	a, err := c.Start(ctx, w.spec("a", db))
	if err != nil {
		t.Fatal(err)
	}
	started, err := a.Wait(ctx, harness.Is(harness.WorkerStarted, leaseBilling))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Start(ctx, w.spec("b", db))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(ctx, harness.Is(harness.LeaseContended, leaseBilling)); err != nil {
		t.Fatal(err)
	}
	w.stripe.set("did:plc:alice", 1)
	select {
	case <-inflight:
	case <-ctx.Done():
		t.Fatalf("a never pushed alice's tier: %v", ctx.Err())
	}
	mark := b.Log.Len()
	stopCleanly(t, ctx, a)
	acq, err := b.Log.WaitFrom(ctx, mark, harness.Is(harness.LeaseAcquired, leaseBilling))
	if err != nil {
		t.Fatal(err)
	}
	if err := settled(ctx, b, acq.Fence, mark, 0, 2); err != nil {
		t.Error(err)
	}
	wantCalls(t, w.hold, testsupport.CrewTier{UserDID: "did:plc:alice", TierRank: 1})
	if n := reader.int(t, ctx, `SELECT COUNT(*) FROM billing_tier_pushes WHERE user_did = 'did:plc:alice' AND tier_rank = 1 AND fence = ?1`, started.Fence); n != 1 {
		t.Errorf("the push a sent is not recorded under a's fence %d", started.Fence)
	}
}
