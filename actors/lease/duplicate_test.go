package lease

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

// gatedErrorStore holds its first acquire until released, then fails it
// without having reached the database (an answer lost on the way).
type gatedErrorStore struct {
	StoreAPI
	entered, release chan struct{}
	n                atomic.Int32
}

func (s *gatedErrorStore) Acquire(ctx context.Context, name, holder string) (Grant, error) {
	if s.n.Add(1) == 1 {
		close(s.entered)
		<-s.release
		return Grant{}, errors.New("connection reset by peer (answer lost)")
	}
	return s.StoreAPI.Acquire(ctx, name, holder)
}

// Two processes configured with the same instance_id. While
// A's acquire is out (and then errs, so A cannot tell whether it
// committed), B acquires. A's next attempt reads a grant under its own
// holder string, made since its errored call started: it must not take
// it for its own and release it (B's worker would then run beside A's).
func TestAProcessSharingOurInstanceIDKeepsItsGrant(t *testing.T) {
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	timing := config.Timing{TTL: 20 * time.Second, RenewInterval: 100 * time.Millisecond, RenewDeadline: time.Second, RetryInterval: 200 * time.Millisecond}
	a := &gatedErrorStore{StoreAPI: NewStore(db, timing.TTL), entered: make(chan struct{}), release: make(chan struct{})}
	pa, pb := &probe{}, &probe{}
	h.start(Options{Name: "cleanup", Instance: "same", Timing: timing, Store: a, Worker: pa.props})
	<-a.entered
	h.start(Options{Name: "cleanup", Instance: "same", Timing: timing, Store: NewStore(db, timing.TTL), Worker: pb.props})
	testsupport.Eventually(t, "process B's worker running", func() bool { return pb.started.Load() > 0 })
	held := readRow(t, db, "cleanup")
	close(a.release)
	contended := is(LeaseContended, "same")
	testsupport.Eventually(t, "process A contending twice (or, wrongly, running)", func() bool {
		return h.events.count(contended) >= 2 || pa.started.Load() > 0
	})
	if n := pa.started.Load(); n > 0 {
		t.Fatalf("process A started %d workers while process B (same instance_id) held fence %d", n, held.Fence)
	}
	if row := readRow(t, db, "cleanup"); row.Fence != held.Fence || row.State() != fence.StateHeld {
		t.Fatalf("process B's grant %+v became %+v: process A took it for its own", held, row)
	}
}

// LiveElsewhere finds this
// instance_id's grants and recent contender records made by another
// process start, and never this process's own.
func TestLiveElsewhereFindsAnotherProcessWithOurInstanceID(t *testing.T) {
	db := testsupport.OpenDB(t)
	ctx := context.Background()
	ttl := 20 * time.Second
	a, b := NewStore(db, ttl), NewStore(db, ttl)
	g, err := a.Acquire(ctx, "cleanup", "same")
	if err != nil || !g.Granted {
		t.Fatalf("acquire: %+v, %v", g, err)
	}
	HoldTurn(t, a)() // the grant's nonce is written after Acquire returns, within its turn
	c := &Contenders{DB: db, Instance: "same", URL: "http://127.0.0.1:1/lease/nudge", TTL: ttl, Nonce: a.Nonce()}
	c.Register("billing-tier-refresh", true)
	c.Wait()
	check := func(s *Store, want string) {
		t.Helper()
		names, err := s.LiveElsewhere(ctx, "same", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(names); got != want {
			t.Fatalf("LiveElsewhere = %s, want %s", got, want)
		}
	}
	check(b, "[billing-tier-refresh cleanup]")
	check(a, "[]")
	if err := a.Release(ctx, fence.Custody{Lease: "cleanup", Holder: "same", Fence: g.Fence}); err != nil {
		t.Fatal(err)
	}
	check(b, "[billing-tier-refresh]")
	// Another process's release (a hand-back) of our grant matches
	// nothing. (A renewal is only ever of a fence the renewing process's
	// own acquire returned, and fences are never reused.)
	g, _ = b.Acquire(ctx, "cleanup", "same")
	if err := a.Release(ctx, fence.Custody{Lease: "cleanup", Holder: "same", Fence: g.Fence}); !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("another process's release of our grant: %v, want ErrSuperseded", err)
	}
	if row := readRow(t, db, "cleanup"); row.State() != fence.StateHeld || row.Fence != g.Fence {
		t.Fatalf("row %+v after another process's release, want held at fence %d", row, g.Fence)
	}
}
