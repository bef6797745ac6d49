package lease

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
)

// nudgeDriver runs one Machine on a virtual clock as a contender for a
// lease held elsewhere: every acquire attempt is answered "contended, 30 s
// left" after rtt, wake-ups are delivered on time, and the test injects
// nudges.
type nudgeDriver struct {
	t        *testing.T
	m        *Machine
	now      time.Duration
	wake     time.Duration
	pending  map[uint64]time.Duration // acquire seq -> answer time
	attempts []time.Duration
	rtt      time.Duration
}

func newNudgeDriver(t *testing.T, rtt time.Duration) *nudgeDriver {
	d := &nudgeDriver{t: t, rtt: rtt, wake: NoWake, pending: map[uint64]time.Duration{},
		m: NewMachine("cleanup", "instance-b", slowRetry, rand.New(rand.NewPCG(1, 2)), 0)}
	d.step(Start{})
	return d
}

func (d *nudgeDriver) step(in Input) {
	for _, c := range d.m.Step(d.now, in) {
		switch c := c.(type) {
		case AcquireCmd:
			d.attempts = append(d.attempts, d.now)
			d.pending[c.Seq] = d.now + d.rtt
		case WakeCmd:
			d.wake = c.At
		case SpawnWorkerCmd, RenewCmd, ReleaseCmd:
			d.t.Fatalf("unexpected %T for a contender", c)
		}
	}
}

// advance moves the clock to until, delivering answers and wake-ups due.
func (d *nudgeDriver) advance(until time.Duration) {
	for {
		next, seq := until, uint64(0)
		for s, at := range d.pending {
			if at <= next {
				next, seq = at, s
			}
		}
		if d.wake != NoWake && d.wake < next {
			next, seq = d.wake, 0
		}
		if next >= until && seq == 0 && (d.wake == NoWake || d.wake > until) {
			d.now = until
			return
		}
		d.now = next
		if seq != 0 {
			delete(d.pending, seq)
			d.step(AcquireResult{Seq: seq, Grant: Grant{Holder: "instance-a", Fence: 1, TimeLeft: 30 * time.Second}})
		} else {
			d.wake = NoWake
			d.step(Tick{})
		}
	}
}

func TestAFloodOfNudgesIsSpacedWhetherOrNotAnAttemptIsInFlight(t *testing.T) {
	for _, rtt := range []time.Duration{100 * time.Microsecond, time.Millisecond, 4 * time.Millisecond, 25 * time.Millisecond} {
		t.Run(rtt.String(), func(t *testing.T) {
			d := newNudgeDriver(t, rtt)
			d.advance(time.Second) // first attempt answered: contended, next retry 8-12 s away
			before := len(d.attempts)
			start := d.now
			const flood = 200 * time.Millisecond
			for d.now < start+flood {
				d.step(Nudge{})
				d.advance(d.now + 50*time.Microsecond)
			}
			got := len(d.attempts) - before
			limit := int(flood/NudgeSpacing) + 1
			if got > limit {
				t.Fatalf("%d acquire attempts in %s of nudges (round trip %s); want at most one per %s (%d)", got, flood, rtt, NudgeSpacing, limit)
			}
			for i := before + 1; i < len(d.attempts); i++ {
				if gap := d.attempts[i] - d.attempts[i-1]; gap < NudgeSpacing {
					t.Fatalf("attempts %s apart (at %s and %s)", gap, d.attempts[i-1], d.attempts[i])
				}
			}
			if got == 0 {
				t.Fatal("nudges caused no attempt")
			}
		})
	}
}

// A nudge is never lost, only deferred: one arriving while an attempt is
// in flight, or within the spacing of the last nudged attempt, still
// brings the next attempt forward from the slow retry.
func TestANudgeIsDeferredByTheSpacingNeverDropped(t *testing.T) {
	d := newNudgeDriver(t, time.Millisecond)
	d.advance(time.Second)
	n := len(d.attempts)

	d.step(Nudge{}) // attempt at once
	if len(d.attempts) != n+1 {
		t.Fatalf("a nudge did not cause an attempt")
	}
	d.advance(d.now + 2*time.Millisecond) // answered: contended
	d.step(Nudge{})                       // within the spacing of the last nudged attempt
	d.advance(d.now + 100*time.Millisecond)
	if len(d.attempts) != n+2 {
		t.Fatalf("%d attempts after a second nudge within the spacing, want exactly one more", len(d.attempts)-n-1)
	}
	if gap := d.attempts[n+1] - d.attempts[n]; gap < NudgeSpacing || gap > NudgeSpacing+time.Millisecond {
		t.Fatalf("deferred attempt came %s after the previous one, want %s", gap, NudgeSpacing)
	}

	// A nudge while an attempt is in flight: acted on when it answers.
	d.step(Nudge{})
	inFlight := len(d.attempts)
	d.advance(d.now + 200*time.Microsecond)
	d.step(Nudge{})
	d.advance(d.now + 100*time.Millisecond)
	if len(d.attempts) != inFlight+1 {
		t.Fatalf("%d attempts after a nudge during an attempt in flight, want exactly one more", len(d.attempts)-inFlight)
	}
}

// holder drives one Machine through a grant, collecting its commands.
type holder struct {
	t   *testing.T
	m   *Machine
	now time.Duration
	out []Command
}

func newHolder(t *testing.T) *holder {
	h := &holder{t: t, m: NewMachine("jetstream-consumer", "instance-a", fastTiming, rand.New(rand.NewPCG(3, 4)), 0)}
	h.step(Start{})
	acq := h.only(AcquireCmd{}).(AcquireCmd)
	h.step(AcquireResult{Seq: acq.Seq, Grant: Grant{Granted: true, Fence: 1}})
	h.only(SpawnWorkerCmd{})
	return h
}

func (h *holder) step(in Input) {
	h.out = h.m.Step(h.now, in)
}

func (h *holder) at(now time.Duration, in Input) {
	h.now = now
	h.step(in)
}

// only returns the one command of like's type in the last output (fails
// if there is not exactly one).
func (h *holder) only(like Command) Command {
	h.t.Helper()
	var found []Command
	for _, c := range h.out {
		if sameType(c, like) {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		h.t.Fatalf("want one %T in %+v", like, h.out)
	}
	return found[0]
}

// commands returns the commands of like's type in the last output.
func (h *holder) commands(like Command) []Command {
	var found []Command
	for _, c := range h.out {
		if sameType(c, like) {
			found = append(found, c)
		}
	}
	return found
}

func (h *holder) none(like Command) {
	h.t.Helper()
	for _, c := range h.out {
		if sameType(c, like) {
			h.t.Fatalf("unexpected %+v in %+v", c, h.out)
		}
	}
}

func sameType(a, b Command) bool {
	return reflect.TypeOf(a) == reflect.TypeOf(b)
}

// loseToBlackout lets the first renewal hang past the renew deadline and
// returns its seq; the machine has lost custody and ordered the worker
// stopped.
func (h *holder) loseToBlackout() uint64 {
	h.t.Helper()
	h.at(fastTiming.RenewInterval, Tick{})
	first := h.only(RenewCmd{}).(RenewCmd)
	h.at(fastTiming.RenewInterval+fastTiming.RenewDeadline/2, Tick{}) // abandoned; a second renewal goes out
	h.only(RenewCmd{})
	h.at(fastTiming.RenewDeadline, Tick{})
	h.only(StopWorkerCmd{})
	if h.m.WorkerActive() || h.m.Phase() != PhaseStopping {
		h.t.Fatalf("not lost at the deadline: phase %s", h.m.Phase())
	}
	return first.Seq
}

// A renewal that lands after the holder gave custody up (a blackout) has
// extended a grant no worker uses. It is never adopted; the machine's next
// acquire, once the worker has stopped, finds it as this process's own and
// hands it back, so the lease does not sit idle for a TTL; a stop hands
// back the grant given up without waiting for that attempt.
func TestALateRenewalSuccessAfterLossIsHandedBackOnceTheWorkerStopped(t *testing.T) {
	h := newHolder(t)
	seq := h.loseToBlackout()
	h.at(h.now+time.Millisecond, RenewResult{Seq: seq})
	h.none(ReleaseCmd{})
	h.none(SpawnWorkerCmd{})
	h.at(h.now+time.Millisecond, WorkerTerminated{Gen: 1})
	h.none(ReleaseCmd{}) // the worker has stopped; the next attempt decides
	for i := 0; i < 10 && len(h.commands(AcquireCmd{})) == 0; i++ {
		h.at(h.wake(), Tick{})
	}
	acq := h.only(AcquireCmd{}).(AcquireCmd)
	h.at(h.now+time.Millisecond, AcquireResult{Seq: acq.Seq, Grant: Grant{Holder: "instance-a", Fence: 1, Own: true, TimeLeft: time.Second}})
	if rel := h.only(ReleaseCmd{}).(ReleaseCmd); rel.Custody.Fence != 1 || rel.Custody.Holder != "instance-a" {
		t.Fatalf("hand-back %+v, want a release of fence 1", rel)
	}
	if h.m.WorkerActive() {
		t.Fatal("the late grant was adopted")
	}
}

func TestALateRenewalSuccessAfterTheWorkerStoppedIsHandedBackAtAStop(t *testing.T) {
	h := newHolder(t)
	seq := h.loseToBlackout()
	h.at(h.now+time.Millisecond, WorkerTerminated{Gen: 1})
	h.at(h.now+time.Millisecond, RenewResult{Seq: seq})
	h.none(ReleaseCmd{})
	h.at(h.now+time.Millisecond, StopRequested{})
	if rel := h.only(ReleaseCmd{}).(ReleaseCmd); rel.Custody.Fence != 1 {
		t.Fatalf("hand-back %+v, want a release of the grant given up", rel)
	}
	if h.m.Phase() == PhaseDone {
		t.Fatal("finished before the hand-back answered")
	}
}

func TestALateRenewalSuccessUnderCustodyStillHeldReleasesNothing(t *testing.T) {
	h := newHolder(t)
	h.at(fastTiming.RenewInterval, Tick{})
	first := h.only(RenewCmd{}).(RenewCmd)
	h.at(fastTiming.RenewInterval+fastTiming.RenewDeadline/2, Tick{}) // abandoned
	second := h.only(RenewCmd{}).(RenewCmd)
	h.at(h.now+time.Millisecond, RenewResult{Seq: second.Seq})
	h.at(h.now+time.Millisecond, RenewResult{Seq: first.Seq}) // late, custody still ours
	h.none(ReleaseCmd{})
	if !h.m.WorkerActive() {
		t.Fatal("a late renewal success ended custody")
	}
}

func TestARenewalInFlightAtShutdownIsNotHandedBackTwice(t *testing.T) {
	h := newHolder(t)
	h.at(fastTiming.RenewInterval, Tick{})
	renew := h.only(RenewCmd{}).(RenewCmd)
	h.at(h.now+time.Millisecond, StopRequested{})
	h.at(h.now+time.Millisecond, WorkerTerminated{Gen: 1})
	rel := h.only(ReleaseCmd{}).(ReleaseCmd)
	if rel.Custody.Fence != 1 {
		t.Fatalf("shutdown release %+v, want fence 1", rel)
	}
	// The renewal answers while the machine's own release is in flight.
	h.at(h.now+time.Millisecond, RenewResult{Seq: renew.Seq})
	h.none(ReleaseCmd{})
}

// A live grant of this process (its nonce) that the machine does not use
// (an errored acquire's lost answer, an acquire given up on that committed
// later) is handed back, not left idle for its TTL; a grant under this
// holder's name made by another process configured with the same
// instance_id (another nonce) is never touched: taking it would make the
// two fight over the lease.
func TestAnOwnUnusedGrantIsHandedBackAndATwinsNever(t *testing.T) {
	for _, tc := range []struct {
		name     string
		own      bool // the grant carries this process's nonce
		handBack bool
	}{
		{"this process's (an errored call's lost answer)", true, true},
		{"another process's with our instance_id", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMachine("cleanup", "same", fastTiming, rand.New(rand.NewPCG(1, 2)), 0)
			seqOf := func(cmds []Command) uint64 {
				for _, c := range cmds {
					if a, ok := c.(AcquireCmd); ok {
						return a.Seq
					}
				}
				t.Fatalf("no acquire in %v", cmds)
				return 0
			}
			now := time.Second
			seq := seqOf(m.Step(now, Start{}))
			now += 100 * time.Millisecond
			m.Step(now, AcquireResult{Seq: seq, Err: errors.New("connection reset by peer")})
			now += fastTiming.RetryInterval * 2
			seq = seqOf(m.Step(now, Tick{}))
			now += time.Millisecond
			cmds := m.Step(now, AcquireResult{Seq: seq, Grant: Grant{Holder: "same", Fence: 1, TimeLeft: time.Second, Own: tc.own}})
			var rel *ReleaseCmd
			for _, c := range cmds {
				if r, ok := c.(ReleaseCmd); ok && r.Custody.Fence == 1 {
					rel = &r
				}
			}
			if (rel != nil) != tc.handBack {
				t.Fatalf("hand-back of fence 1 = %v, want %v (commands %v)", rel != nil, tc.handBack, cmds)
			}
			if rel == nil {
				return
			}
			// Answered: both changes of custody are published, and the
			// machine tries for the lease again at once.
			cmds = m.Step(now+time.Millisecond, ReleaseResult{Seq: rel.Seq})
			var kinds []string
			for _, c := range cmds {
				if e, ok := c.(EmitCmd); ok {
					kinds = append(kinds, string(e.Event.Kind)+"/"+e.Event.Reason)
				}
			}
			if want := []string{"lease.acquired/stale-grant", "lease.released/stale-grant"}; !reflect.DeepEqual(kinds, want) {
				t.Fatalf("events %v, want %v", kinds, want)
			}
			seqOf(cmds)
		})
	}
}

// emitted returns the events of kind in the last output.
func (h *holder) emitted(kind EventKind) []Event {
	var out []Event
	for _, c := range h.out {
		if e, ok := c.(EmitCmd); ok && e.Event.Kind == kind {
			out = append(out, e.Event)
		}
	}
	return out
}

// wake is the WakeCmd of the last output.
func (h *holder) wake() time.Duration {
	h.t.Helper()
	return h.out[len(h.out)-1].(WakeCmd).At
}

// A worker that does not stop after a loss of custody no
// longer keeps the machine in stopping for good: after WorkerStopTimeout
// it publishes worker.stuck and contends again; and the same bound holds
// for a worker that failed too often (it releases) and on shutdown.
func TestAWorkerThatWillNotStopIsReportedAndLeftBehind(t *testing.T) {
	t.Run("after a loss", func(t *testing.T) {
		h := newHolder(t)
		h.loseToBlackout()
		stopAt := h.now
		if got := h.wake(); got > stopAt+WorkerStopTimeout {
			t.Fatalf("next wake %s, want no later than the stop bound %s", got, stopAt+WorkerStopTimeout)
		}
		h.at(stopAt+WorkerStopTimeout-time.Millisecond, Tick{})
		if len(h.emitted(WorkerStuck)) != 0 || h.m.Phase() != PhaseStopping {
			t.Fatalf("stuck before the bound: phase %s, %+v", h.m.Phase(), h.out)
		}
		h.at(stopAt+WorkerStopTimeout, Tick{})
		stuck := h.emitted(WorkerStuck)
		if len(stuck) != 1 || stuck[0].Fence != 1 || !strings.Contains(stuck[0].Err.Error(), "contending again") {
			t.Fatalf("worker.stuck events %+v, want one for fence 1 saying what follows", stuck)
		}
		if h.m.Phase() != PhaseContending {
			t.Fatalf("phase %s after worker.stuck, want contending", h.m.Phase())
		}
		// It contends again (after a retry interval), and a late
		// termination of the stuck worker changes nothing.
		h.at(h.wake(), Tick{})
		h.only(AcquireCmd{})
		h.step(WorkerTerminated{Gen: 1})
		if h.m.Phase() != PhaseContending {
			t.Fatalf("phase %s after the stuck worker stopped late", h.m.Phase())
		}
	})
	t.Run("on shutdown", func(t *testing.T) {
		h := newHolder(t)
		h.at(time.Millisecond, StopRequested{})
		h.only(StopWorkerCmd{})
		// Renewals go on (and succeed) while the worker drains; the
		// worker never stops.
		for h.now < time.Millisecond+WorkerStopTimeout {
			at := h.wake()
			h.at(at, Tick{})
			for _, c := range h.out {
				if r, ok := c.(RenewCmd); ok {
					h.at(at, RenewResult{Seq: r.Seq})
				}
			}
			if len(h.emitted(LeaseLost)) > 0 {
				t.Fatalf("custody lost while renewing: %+v", h.out)
			}
		}
		if stuck := h.emitted(WorkerStuck); len(stuck) != 1 || !strings.Contains(stuck[0].Err.Error(), "releasing anyway") {
			t.Fatalf("at %s, worker.stuck events %+v, want one saying it releases", h.now, stuck)
		}
		h.only(ReleaseCmd{})
	})
}

// A yield is taken only while holding and only after the
// minimum holding time; the holder drains its worker, releases with
// reason yielded and stays out for one TTL so the contender gets there
// first.
func TestAYieldWaitsForTheMinimumHoldThenReleasesAndCoolsDown(t *testing.T) {
	h := newHolder(t)
	h.m.minHold = 300 * time.Millisecond // within the first grant's 1 s of trust
	h.at(200*time.Millisecond, YieldRequested{Reason: errors.New("no upstream")})
	h.none(StopWorkerCmd{})
	if h.m.Phase() != PhaseHolding || len(h.emitted(LeaseYielded)) != 0 {
		t.Fatalf("yielded after 200ms of a 300ms minimum hold: phase %s", h.m.Phase())
	}
	h.at(300*time.Millisecond, YieldRequested{Reason: errors.New("no upstream")})
	if y := h.emitted(LeaseYielded); len(y) != 1 || y[0].Fence != 1 {
		t.Fatalf("lease.yielded events %+v, want one for fence 1", y)
	}
	if stop := h.only(StopWorkerCmd{}).(StopWorkerCmd); !stop.Graceful {
		t.Fatal("a yield stops the worker at once; want a graceful drain (custody is still held)")
	}
	h.at(300*time.Millisecond+10*time.Millisecond, WorkerTerminated{Gen: 1})
	rel := h.only(ReleaseCmd{}).(ReleaseCmd)
	h.at(300*time.Millisecond+20*time.Millisecond, ReleaseResult{Seq: rel.Seq})
	if r := h.emitted(LeaseReleased); len(r) != 1 || r[0].Reason != ReasonYielded {
		t.Fatalf("release events %+v, want one with reason %s", r, ReasonYielded)
	}
	if h.m.Phase() != PhaseContending {
		t.Fatalf("phase %s after the yield's release", h.m.Phase())
	}
	released := 300*time.Millisecond + 20*time.Millisecond
	h.at(released+fastTiming.TTL-time.Millisecond, Tick{})
	h.none(AcquireCmd{})
	h.at(released+fastTiming.TTL, Tick{})
	h.only(AcquireCmd{})
	// A yield request while contending changes nothing.
	h.at(released+fastTiming.TTL+time.Millisecond, YieldRequested{})
	h.none(ReleaseCmd{})
	h.none(StopWorkerCmd{})
}

// A renewal refused because the database file was deleted or replaced can
// never succeed where the other instances look, and one of them may hold
// the lease in the new file already: custody ends at that answer, not at
// the renew deadline (the worker went on committing into the deleted file
// for five seconds before).
func TestARenewalRefusedForAReplacedFileEndsCustodyAtOnce(t *testing.T) {
	h := newHolder(t)
	h.at(fastTiming.RenewInterval, Tick{})
	renew := h.only(RenewCmd{}).(RenewCmd)
	h.at(fastTiming.RenewInterval+time.Millisecond, RenewResult{Seq: renew.Seq,
		Err: fmt.Errorf("renew lease %q: appview.db: %w", "jetstream-consumer", database.ErrFileReplaced)})
	h.only(StopWorkerCmd{})
	lost := h.emitted(LeaseLost)
	if len(lost) != 1 || lost[0].Reason != ReasonError {
		t.Fatalf("lost events %+v, want one with reason error", lost)
	}
	if h.m.WorkerActive() || h.m.HoldsCustody() {
		t.Fatalf("custody kept after the file was replaced: phase %s", h.m.Phase())
	}
}

// The grant of an attempt given up on is left to a later attempt, which
// finds it as this process's own, until the machine stops: then no
// attempt may come, and Stray tells the shell to hand it back.
func TestAGrantOfAnAbandonedAttemptIsStrayOnceTheMachineStops(t *testing.T) {
	h := &holder{t: t, m: NewMachine("jetstream-consumer", "instance-a", fastTiming, rand.New(rand.NewPCG(5, 6)), 0)}
	h.step(Start{})
	first := h.only(AcquireCmd{}).(AcquireCmd)
	h.at(10*fastTiming.RenewDeadline, Tick{}) // given up on; the next attempt goes out
	final := h.commands(AcquireCmd{})
	late := AcquireResult{Seq: first.Seq, Grant: Grant{Granted: true, Fence: 1}}
	if len(final) != 1 || h.m.Stray(late) {
		t.Fatalf("want a next attempt and the late grant left to it, got %+v", h.out)
	}
	h.step(StopRequested{}) // the attempt in flight decides
	if !h.m.Stray(late) {
		t.Fatal("not stray once stopping: nothing releases the grant")
	}
	if h.m.Stray(AcquireResult{Seq: final[0].(AcquireCmd).Seq, Grant: Grant{Granted: true, Fence: 1}}) {
		t.Fatal("the awaited attempt's grant is stray: the machine releases it itself")
	}
	h.step(AcquireResult{Seq: final[0].(AcquireCmd).Seq, Grant: Grant{Holder: "instance-a", Fence: 1, Own: true, TimeLeft: time.Second}})
	if h.m.Stray(late) {
		t.Fatal("stray although the final attempt found it as its own and releases it")
	}
}
