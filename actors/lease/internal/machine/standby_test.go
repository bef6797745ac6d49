package machine

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/events"
	"github.com/atcr-io/appview/internal/leasestore"
)

// acquireCmds returns the AcquireCmds among cmds.
func acquireCmds(cmds []Command) []AcquireCmd {
	var out []AcquireCmd
	for _, c := range cmds {
		if a, ok := c.(AcquireCmd); ok {
			out = append(out, a)
		}
	}
	return out
}

// contended answers attempt seq: another holder, 30 s left.
func contended(seq uint64) AcquireResult {
	return AcquireResult{Seq: seq, Grant: leasestore.Grant{Holder: "instance-a", Fence: 1, TimeLeft: 30 * time.Second}}
}

// A Standby makes the next attempt at once, to be carried out after the
// row is seen free; one that arrives while an attempt is in flight, or at
// a holder, issues nothing.
func TestAStandbyIssuesOneAttemptAfterVacancyOnlyWhenNoneIsInFlight(t *testing.T) {
	m := New("cleanup", "instance-b", slowRetry, rand.New(rand.NewPCG(1, 2)))
	now := time.Second
	first := acquireCmds(m.Step(now, Start{}))
	if len(first) != 1 || first[0].AfterVacancy {
		t.Fatalf("start: %v", first)
	}
	if got := acquireCmds(m.Step(now, Standby{})); len(got) != 0 {
		t.Fatalf("a Standby with an attempt in flight issued %v", got)
	}
	now += time.Millisecond
	m.Step(now, contended(first[0].Seq)) // next retry 8-12 s away
	now += time.Millisecond
	got := acquireCmds(m.Step(now, Standby{}))
	if len(got) != 1 || !got[0].AfterVacancy {
		t.Fatalf("a Standby while contending issued %v; want one AcquireCmd with AfterVacancy", got)
	}
	if again := acquireCmds(m.Step(now, Standby{})); len(again) != 0 {
		t.Fatalf("a second Standby during the first's attempt issued %v", again)
	}
	now += time.Millisecond
	cmds := m.Step(now, AcquireResult{Seq: got[0].Seq, Grant: leasestore.Grant{Granted: true, Fence: 2}, At: time.Now()})
	if m.Phase() != PhaseHolding || len(acquireCmds(cmds)) != 0 {
		t.Fatalf("the standby's grant: phase %v, commands %v", m.Phase(), cmds)
	}
	if got := acquireCmds(m.Step(now, Standby{})); len(got) != 0 {
		t.Fatalf("a Standby at the holder issued %v", got)
	}
}

// A stop while the standby's attempt waits for the release: the shell
// calls the watch off and answers ErrNotAttempted; the machine finishes
// without counting it as an attempt that may have committed.
func TestAStandbyCalledOffByAStopFinishesWithoutAnUnsureAttempt(t *testing.T) {
	m := New("cleanup", "instance-b", slowRetry, rand.New(rand.NewPCG(1, 2)))
	now := time.Second
	start := acquireCmds(m.Step(now, Start{}))
	now += time.Millisecond
	m.Step(now, contended(start[0].Seq))
	got := acquireCmds(m.Step(now, Standby{}))
	if len(got) != 1 {
		t.Fatalf("standby: %v", got)
	}
	m.Step(now, StopRequested{})
	if m.Phase() == PhaseDone {
		t.Fatal("finished with the standby's attempt unanswered")
	}
	m.Step(now+time.Millisecond, AcquireResult{Seq: got[0].Seq, Err: ErrNotAttempted})
	if m.Phase() != PhaseDone {
		t.Fatalf("phase %v after the called-off attempt's answer at a stop", m.Phase())
	}
	if m.contend.acquireUnsure {
		t.Fatal("an attempt never made was taken for one that may have committed")
	}
}

// A contended answer naming a grant of this very process (Own) says so
// (stale-grant), whether or not this answer is the one that hands it
// back; another instance's grant carries no reason.
func TestAContendedAnswerMarksThisProcesssOwnGrant(t *testing.T) {
	for _, tc := range []struct {
		own  bool
		want string
	}{{true, "stale-grant"}, {false, ""}} {
		m := New("cleanup", "me", slowRetry, rand.New(rand.NewPCG(1, 2)))
		seq := acquireCmds(m.Step(time.Second, Start{}))[0].Seq
		cmds := m.Step(time.Second+time.Millisecond, AcquireResult{Seq: seq,
			Grant: leasestore.Grant{Holder: "me", Fence: 16, TimeLeft: 15 * time.Second, Age: time.Hour, Own: tc.own}})
		var got []string
		for _, c := range cmds {
			if e, ok := c.(EmitCmd); ok && e.Event.Kind == events.LeaseContended {
				got = append(got, e.Event.Reason)
			}
		}
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("own %v: lease.contended reasons %q, want [%q]", tc.own, got, tc.want)
		}
	}
}
