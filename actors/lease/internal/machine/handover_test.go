package machine

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/events"
	"github.com/atcr-io/appview/internal/leasestore"
)

// contender returns a holder-style driver of a Machine that contends: its
// first acquire is out, issued at now.
func contender(t *testing.T, now time.Duration) (*holder, AcquireCmd) {
	h := &holder{t: t, now: now, m: New("cleanup", "instance-b", fastTiming, rand.New(rand.NewPCG(5, 6)))}
	h.step(Start{})
	return h, h.only(AcquireCmd{}).(AcquireCmd)
}

// A grant the former holder handed to this process while the call ran
// (leasestore.Store.Transfer), found by a standby's watch or by the
// acquire, is taken into custody: lease.acquired (handed-over), the
// worker spawned, trusted from the call's start less the attribution's
// slack, so never past the database's grant plus the renew deadline.
func TestAGrantHandedOverDuringTheCallIsAdopted(t *testing.T) {
	for _, handedOver := range []bool{true, false} {
		h, acq := contender(t, time.Second)
		h.at(time.Second+3*time.Millisecond, AcquireResult{Seq: acq.Seq, HandedOver: handedOver, Elapsed: 3 * time.Millisecond,
			Grant: leasestore.Grant{Holder: "instance-b", Fence: 7, Own: true, Age: time.Millisecond, TimeLeft: fastTiming.TTL}})
		h.only(SpawnWorkerCmd{})
		acquired := h.emitted(events.LeaseAcquired)
		if len(acquired) != 1 || acquired[0].Fence != 7 || acquired[0].Reason != events.ReasonHandedOver {
			t.Fatalf("handedOver %v: lease.acquired %+v; want one, fence 7, reason %s", handedOver, acquired, events.ReasonHandedOver)
		}
		if got, want := h.m.TrustedUntil(), time.Second-adoptSlack(3*time.Millisecond)+fastTiming.RenewDeadline; got != want || got > time.Second-unsureSlack+fastTiming.RenewDeadline {
			t.Fatalf("handedOver %v: trusted until %v; want the call's start less the slack plus the renew deadline, %v", handedOver, got, want)
		}
	}
}

// A grant of this process older than the call (not handed over while it
// ran) is not adopted; one a watch found handed over is then handed back,
// so the lease does not sit idle for its TTL.
func TestAHandedOverGrantOlderThanTheCallIsHandedBack(t *testing.T) {
	h, acq := contender(t, time.Second)
	h.at(time.Second+3*time.Millisecond, AcquireResult{Seq: acq.Seq, HandedOver: true, Elapsed: 3 * time.Millisecond,
		Grant: leasestore.Grant{Holder: "instance-b", Fence: 7, Own: true, Age: 500 * time.Millisecond, TimeLeft: time.Second}})
	h.none(SpawnWorkerCmd{})
	rel := h.only(ReleaseCmd{}).(ReleaseCmd)
	if !rel.Stale || rel.Custody.Fence != 7 {
		t.Fatalf("release %+v; want the stale hand-back of fence 7", rel)
	}
	if got := h.emitted(events.LeaseAcquired); len(got) != 0 {
		t.Fatalf("lease.acquired %+v for a grant not adopted", got)
	}
}

// A grant handed over to a call the machine had abandoned (its answer
// came after the machine stopped waiting) is handed back; and a fence once
// handed back is never adopted later.
func TestAHandedOverGrantOfAnAbandonedCallIsHandedBackAndNeverAdopted(t *testing.T) {
	h, acq := contender(t, time.Second)
	// The call is abandoned at half the renew deadline; the next attempt
	// goes out at the retry.
	h.at(time.Second+fastTiming.RenewDeadline/2+time.Millisecond, Tick{})
	late := AcquireResult{Seq: acq.Seq, HandedOver: true, Elapsed: fastTiming.RenewDeadline / 2,
		Grant: leasestore.Grant{Holder: "instance-b", Fence: 7, Own: true, Age: time.Millisecond, TimeLeft: fastTiming.TTL}}
	h.at(h.now+time.Millisecond, late)
	if rel := h.only(ReleaseCmd{}).(ReleaseCmd); !rel.Stale || rel.Custody.Fence != 7 {
		t.Fatalf("release %+v; want the stale hand-back of fence 7", rel)
	}
	var next AcquireCmd
	for i := 0; i < 100 && next.Seq == 0; i++ {
		h.at(h.now+fastTiming.RetryInterval/2, Tick{})
		for _, c := range h.out {
			if a, ok := c.(AcquireCmd); ok {
				next = a
			}
		}
	}
	if next.Seq == 0 {
		t.Fatal("no acquire after the abandoned one")
	}
	h.at(h.now+time.Millisecond, AcquireResult{Seq: next.Seq, Elapsed: time.Millisecond,
		Grant: leasestore.Grant{Holder: "instance-b", Fence: 7, Own: true, Age: 0, TimeLeft: fastTiming.TTL}})
	h.none(SpawnWorkerCmd{})
}

// A grant of this process that no call of the machine made and that it
// cannot adopt (a handover that landed after the call that could have
// taken it) is handed back, not left idle for its TTL.
func TestAnOwnGrantLandedAfterTheCallIsHandedBack(t *testing.T) {
	h, acq := contender(t, time.Second)
	h.at(time.Second+2*time.Millisecond, AcquireResult{Seq: acq.Seq, Elapsed: 2 * time.Millisecond,
		Grant: leasestore.Grant{Holder: "instance-b", Fence: 9, Own: true, Age: 300 * time.Millisecond, TimeLeft: time.Second}})
	h.none(SpawnWorkerCmd{})
	if rel := h.only(ReleaseCmd{}).(ReleaseCmd); !rel.Stale || rel.Custody.Fence != 9 {
		t.Fatalf("release %+v; want the stale hand-back of fence 9", rel)
	}
}

// A release that handed the lease over says so: lease.released keeps the
// release's reason and names the successor as its holder.
func TestAHandoverReleaseNamesTheSuccessor(t *testing.T) {
	for _, to := range []string{"instance-b", ""} {
		h := newHolder(t)
		h.at(h.now+time.Millisecond, StopRequested{})
		h.at(h.now+time.Millisecond, WorkerStopped{Gen: 1})
		rel := h.only(ReleaseCmd{}).(ReleaseCmd)
		h.at(h.now+time.Millisecond, ReleaseResult{Seq: rel.Seq, HandedTo: to})
		got := h.emitted(events.LeaseReleased)
		if len(got) != 1 || got[0].Holder != to || got[0].Reason != events.ReasonShutdown || got[0].Fence != 1 {
			t.Fatalf("handed to %q: lease.released %+v; want one, reason shutdown, fence 1, holder %q", to, got, to)
		}
	}
}
