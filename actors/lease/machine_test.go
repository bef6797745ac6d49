package lease

import (
	"math/rand/v2"
	"testing"
	"time"
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
		m: NewMachine("cleanup", "instance-b", slowRetry, rand.New(rand.NewPCG(1, 2)))}
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
			limit := int(flood/nudgeSpacing) + 1
			if got > limit {
				t.Fatalf("%d acquire attempts in %s of nudges (round trip %s); want at most one per %s (%d)", got, flood, rtt, nudgeSpacing, limit)
			}
			for i := before + 1; i < len(d.attempts); i++ {
				if gap := d.attempts[i] - d.attempts[i-1]; gap < nudgeSpacing {
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
	if gap := d.attempts[n+1] - d.attempts[n]; gap < nudgeSpacing || gap > nudgeSpacing+time.Millisecond {
		t.Fatalf("deferred attempt came %s after the previous one, want %s", gap, nudgeSpacing)
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
