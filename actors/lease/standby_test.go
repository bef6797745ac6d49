package lease

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/events"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/leasestore"
	"github.com/atcr-io/appview/internal/testsupport"
)

// waitClosed fails t unless ch is closed within a bound no healthy run
// comes near.
func waitClosed(t *testing.T, what string, ch chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10 s", what)
	}
}

// standingBy starts instance-b contending for lease name on db, waits
// until it has seen the lease held, and has it stand by (Standby) until
// its first read of the row.
func standingBy(t *testing.T, h *harness, db *sql.DB, name string) *runner {
	t.Helper()
	r := h.start(Options{Name: name, Instance: "instance-b", Timing: slowRetry, Store: leasestore.NewStore(db, slowRetry.TTL),
		Worker: (&probe{}).props, StandbyFor: time.Minute})
	h.events.wait(t, 0, "b's lease.contended", is(events.LeaseContended, "instance-b"))
	watching := make(chan struct{})
	h.sys.Root.Send(r.pid, &Standby{Watching: watching})
	waitClosed(t, "the standby's first read", watching)
	return r
}

// A contender told that the release is coming takes the lease when the
// release lands, with no nudge and long before its own retry.
func TestAStandbyAcquiresWhenTheReleaseLandsWithoutANudge(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	h := newHarness(t)
	const name = "cleanup"
	holder := leasestore.NewStore(db, time.Minute)
	c := mustAcquire(t, holder, name, "instance-a")
	standingBy(t, h, db, name)
	if err := holder.Release(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	acquired, _ := h.events.wait(t, 0, "lease.acquired by b", is(events.LeaseAcquired, "instance-b"))
	// b's own retry is 8-12 s away and nothing nudges it: an acquire
	// before that is the standby's.
	if d := acquired.At.Sub(released); d > 5*time.Second {
		t.Fatalf("b acquired %s after the release: the standby did not see it", d)
	}
	if acquired.Fence != c.Fence+1 {
		t.Fatalf("b's fence %d after a's %d", acquired.Fence, c.Fence)
	}
}

// A holder, or a contender already standing by, answers a Standby at once
// and changes nothing.
func TestAStandbyIsIgnoredByAHolderAndByAContenderAlreadyStandingBy(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	h := newHarness(t)
	r := h.start(Options{Name: "cleanup", Instance: "instance-a", Timing: slowRetry, Store: leasestore.NewStore(db, slowRetry.TTL),
		Worker: (&probe{}).props})
	h.events.wait(t, 0, "lease.acquired", is(events.LeaseAcquired, "instance-a"))
	watching := make(chan struct{})
	h.sys.Root.Send(r.pid, &Standby{Watching: watching})
	waitClosed(t, "the holder's answer", watching)

	store := leasestore.NewStore(db, slowRetry.TTL)
	b := h.start(Options{Name: "cleanup", Instance: "instance-b", Timing: slowRetry, Store: store,
		Worker: (&probe{}).props, StandbyFor: time.Minute})
	h.events.wait(t, 0, "lease.contended", is(events.LeaseContended, "instance-b"))
	first, second := make(chan struct{}), make(chan struct{})
	h.sys.Root.Send(b.pid, &Standby{Watching: first})
	waitClosed(t, "the first standby's first read", first)
	h.sys.Root.Send(b.pid, &Standby{Watching: second})
	waitClosed(t, "the second standby's answer", second)
}

// countingStore counts the reads of standbys.
type countingStore struct {
	*leasestore.Store
	reads atomic.Int64
}

func (c *countingStore) Watch(ctx context.Context, name, holder string) (leasestore.Vacancy, error) {
	c.reads.Add(1)
	return c.Store.Watch(ctx, name, holder)
}

// A second standby within standbySpacing of the first's start, after the
// first ended, starts no watch: a caller cannot keep a core busy.
func TestStandbysAreSpacedBySpacing(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	h := newHarness(t)
	mustAcquire(t, leasestore.NewStore(db, time.Minute), "cleanup", "instance-a")
	store := &countingStore{Store: leasestore.NewStore(db, slowRetry.TTL)}
	logs := &testsupport.LockedBuffer{}
	r := h.start(Options{Name: "cleanup", Instance: "instance-b", Timing: slowRetry, Store: store,
		Worker: (&probe{}).props, StandbyFor: time.Millisecond, Log: zerolog.New(logs)})
	h.events.wait(t, 0, "lease.contended", is(events.LeaseContended, "instance-b"))
	first := make(chan struct{})
	h.sys.Root.Send(r.pid, &Standby{Watching: first})
	waitClosed(t, "the first standby's first read", first)
	// The watch hands its end to the actor, then logs it: once the line
	// is out and a request sent after it is answered, the actor has taken
	// the end in, and no watch runs.
	testsupport.Eventually(t, "the first standby ended", func() bool {
		return strings.Contains(logs.String(), "lease standby ended")
	})
	if _, err := h.sys.Root.RequestFuture(r.pid, &StatusRequest{}, 10*time.Second).Result(); err != nil {
		t.Fatal(err)
	}
	before := store.reads.Load()
	second := make(chan struct{})
	h.sys.Root.Send(r.pid, &Standby{Watching: second})
	waitClosed(t, "the second standby's answer", second)
	if n := store.reads.Load(); n != before {
		t.Fatalf("the second standby, within %v of the first, read the lease (%d reads, %d before it)", standbySpacing, n, before)
	}
}

// With standbys off (a libSQL server), a Standby reads nothing.
func TestAStandbyIsIgnoredWhenStandbysAreOff(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	h := newHarness(t)
	mustAcquire(t, leasestore.NewStore(db, time.Minute), "cleanup", "instance-a")
	store := &countingStore{Store: leasestore.NewStore(db, slowRetry.TTL)}
	r := h.start(Options{Name: "cleanup", Instance: "instance-b", Timing: slowRetry, Store: store,
		Worker: (&probe{}).props, StandbyFor: -1})
	h.events.wait(t, 0, "lease.contended", is(events.LeaseContended, "instance-b"))
	watching := make(chan struct{})
	h.sys.Root.Send(r.pid, &Standby{Watching: watching})
	waitClosed(t, "the answer", watching)
	if n := store.reads.Load(); n != 0 {
		t.Fatalf("%d standby reads with standbys off", n)
	}
}

// vacancies answers Watch from a script, then keeps the last answer.
type vacancies struct {
	script []vacancy
	reads  int
}

type vacancy struct {
	vacant bool
	fence  int64
	err    error
	ours   bool
}

func (v *vacancies) Watch(context.Context, string, string) (leasestore.Vacancy, error) {
	a := v.script[min(v.reads, len(v.script)-1)]
	v.reads++
	return leasestore.Vacancy{Free: a.vacant, Fence: a.fence, Ours: a.ours}, a.err
}

func TestWatchVacancyEndsOnAFreeRowANewGrantAnErrorOrItsContext(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name      string
		script    []vacancy
		want      bool
		wantReads int
		wantErr   error
	}{
		{"freed on the third read", []vacancy{{false, 4, nil, false}, {false, 4, nil, false}, {true, 4, nil, false}}, true, 3, nil},
		{"another contender won", []vacancy{{false, 4, nil, false}, {false, 4, nil, false}, {false, 5, nil, false}}, false, 3, nil},
		{"a read failed", []vacancy{{false, 4, nil, false}, {false, 0, boom, false}}, false, 2, boom},
		{"free at once", []vacancy{{true, 0, nil, false}}, true, 1, nil},
		// A holder handed the lease to this process (Store.Transfer):
		// the watch ends with the grant, which is not free.
		{"handed over on the second read", []vacancy{{false, 4, nil, false}, {false, 5, nil, true}}, false, 2, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &vacancies{script: tc.script}
			watching := make(chan struct{})
			var began atomic.Bool
			got, reads, err := watchVacancy(context.Background(), v, "cleanup", "instance-b", watching, &began)
			last := tc.script[min(reads, len(tc.script))-1]
			if got.Free != tc.want || got.Ours != last.ours || reads != tc.wantReads || !errors.Is(err, tc.wantErr) {
				t.Fatalf("watchVacancy = %+v after %d reads, %v; want free %v, ours %v after %d, %v", got, reads, err, tc.want, last.ours, tc.wantReads, tc.wantErr)
			}
			// The watch offers this process as the successor only when
			// its first read found the lease held by another.
			first := tc.script[0]
			if want := first.err == nil && !first.vacant && !first.ours; began.Load() != want {
				t.Fatalf("began = %v after a first read %+v; want %v", began.Load(), first, want)
			}
			waitClosed(t, "watching", watching)
		})
	}
	t.Run("context ended", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		watching := make(chan struct{})
		got, reads, err := watchVacancy(ctx, &vacancies{script: []vacancy{{false, 4, nil, false}}}, "cleanup", "instance-b", watching, nil)
		if got.Free || reads != 0 || err != nil {
			t.Fatalf("watchVacancy on an ended context = %v after %d reads, %v; want false after none", got, reads, err)
		}
		waitClosed(t, "watching", watching)
	})
}

// acquireCounter counts the acquires of a store that also reads
// vacancies.
type acquireCounter struct {
	*countingStore
	acquires atomic.Int64
}

func (c *acquireCounter) Acquire(ctx context.Context, name, holder string) (leasestore.Grant, error) {
	c.acquires.Add(1)
	return c.countingStore.Acquire(ctx, name, holder)
}

// A contender that stops while it stands by calls the watch off at once
// and makes no acquire after it (the holder never released).
func TestAStopDuringAStandbyCallsTheWatchOffWithoutAnAcquire(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	h := newHarness(t)
	mustAcquire(t, leasestore.NewStore(db, time.Minute), "cleanup", "instance-a")
	store := &acquireCounter{countingStore: &countingStore{Store: leasestore.NewStore(db, slowRetry.TTL)}}
	r := h.start(Options{Name: "cleanup", Instance: "instance-b", Timing: slowRetry, Store: store,
		Worker: (&probe{}).props, StandbyFor: time.Minute})
	h.events.wait(t, 0, "lease.contended", is(events.LeaseContended, "instance-b"))
	before := store.acquires.Load()
	watching := make(chan struct{})
	h.sys.Root.Send(r.pid, &Standby{Watching: watching})
	waitClosed(t, "the standby's first read", watching)
	h.stopAndWait(r)
	if n := store.acquires.Load() - before; n != 0 {
		t.Fatalf("%d acquires after a standby called off by a stop", n)
	}
	if n := h.events.count(is(events.LeaseAcquired, "instance-b")); n != 0 {
		t.Fatalf("instance-b acquired %d times", n)
	}
}

// One watch of the process spins at a time: a second one begun while
// the first spins pauses on a timer, and the spin is free again once the
// first has spun for standbySpin or ended.
func TestOneWatchOfTheProcessSpinsAtATime(t *testing.T) {
	first := newWatchPauser()
	second := newWatchPauser()
	if !first.spins || second.spins {
		t.Fatalf("first spins %v, second %v; want only the first", first.spins, second.spins)
	}
	second.close()
	first.pause(standbySpin) // its spin is over
	third := newWatchPauser()
	if !third.spins {
		t.Fatal("a watch begun after the first stopped spinning does not spin")
	}
	first.close()
	if !third.spins {
		t.Fatal("closing a pauser that gave its spin up took the spin from another")
	}
	third.close()
	if fourth := newWatchPauser(); !fourth.spins {
		t.Fatal("the spin was not given back on close")
	} else {
		fourth.close()
	}
}

// returnLateStore commits each release, then holds its return until let
// is closed: a releasing goroutine descheduled as its statement returns.
type returnLateStore struct {
	*leasestore.Store
	committed chan struct{}
	let       chan struct{}
}

func (s *returnLateStore) Release(ctx context.Context, c fence.Custody) error {
	err := s.Store.Release(ctx, c)
	close(s.committed)
	<-s.let
	return err
}

// lease.released's "at" precedes the successor's lease.acquired's even
// when the release returns only after the successor has its grant
// (docs/spec.md §5): it is stamped when the release began.
func TestAReleaseIsStampedBeforeTheGrantThatFollowsIt(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	h := newHarness(t)
	const name = "cleanup"
	slow := &returnLateStore{Store: leasestore.NewStore(db, slowRetry.TTL), committed: make(chan struct{}), let: make(chan struct{})}
	a := h.start(Options{Name: name, Instance: "instance-a", Timing: slowRetry, Store: slow, Worker: (&probe{}).props})
	h.events.wait(t, 0, "a's lease.acquired", is(events.LeaseAcquired, "instance-a"))
	standingBy(t, h, db, name)

	h.stop(a)
	waitClosed(t, "a's release committed", slow.committed)
	acquired, _ := h.events.wait(t, 0, "b's lease.acquired", is(events.LeaseAcquired, "instance-b"))
	close(slow.let)
	released, _ := h.events.wait(t, 0, "a's lease.released", is(events.LeaseReleased, "instance-a"))
	if !released.At.Before(acquired.At) {
		t.Fatalf("a's lease.released at %s, b's lease.acquired (fence %d) at %s: the successor's grant is stamped first",
			released.At.Format(events.AtFormat), acquired.Fence, acquired.At.Format(events.AtFormat))
	}
}

// pendingStore records, in order, a standby's pending mark, its reads and
// its acquire.
type pendingStore struct {
	*leasestore.Store
	mu  sync.Mutex
	log []string
}

func (p *pendingStore) note(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.log); n > 0 && p.log[n-1] == s {
		return // one entry for a run of reads
	}
	p.log = append(p.log, s)
}

func (p *pendingStore) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.log)
}

func (p *pendingStore) PendingAcquire() func() {
	p.note("pending")
	done := p.Store.PendingAcquire()
	return func() { p.note("done"); done() }
}

func (p *pendingStore) Watch(ctx context.Context, name, holder string) (leasestore.Vacancy, error) {
	p.note("read")
	return p.Store.Watch(ctx, name, holder)
}

func (p *pendingStore) Acquire(ctx context.Context, name, holder string) (leasestore.Grant, error) {
	p.note("acquire")
	g, err := p.Store.Acquire(ctx, name, holder)
	p.note("answered")
	return g, err
}

// A standby's acquire is a pending lease write from the watch's first
// read until the acquire has answered: this process's fenced worker
// transactions hold back for it, so a worker of another lease does not
// take the write lock the acquire (or the holder's release) needs.
func TestAStandbysAcquireIsAPendingLeaseWriteFromItsWatchOn(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	h := newHarness(t)
	holder := leasestore.NewStore(db, time.Minute)
	c := mustAcquire(t, holder, "cleanup", "instance-a")
	store := &pendingStore{Store: leasestore.NewStore(db, slowRetry.TTL)}
	r := h.start(Options{Name: "cleanup", Instance: "instance-b", Timing: slowRetry, Store: store,
		Worker: (&probe{}).props, StandbyFor: time.Minute})
	h.events.wait(t, 0, "lease.contended", is(events.LeaseContended, "instance-b"))
	before := len(store.seen())
	watching := make(chan struct{})
	h.sys.Root.Send(r.pid, &Standby{Watching: watching})
	waitClosed(t, "the standby's first read", watching)
	if err := holder.Release(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	h.events.wait(t, 0, "lease.acquired by b", is(events.LeaseAcquired, "instance-b"))
	testsupport.Eventually(t, "the pending mark's end", func() bool { return slices.Contains(store.seen()[before:], "done") })
	if got, want := store.seen()[before:], []string{"pending", "read", "acquire", "answered", "done"}; !slices.Equal(got, want) {
		t.Fatalf("standby's calls %q, want %q", got, want)
	}
}
