package lease

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/atcr-io/appview/actors/lease/internal/machine"
)

// Standby tells a LeaseActor that its lease's holder is about to release
// it (send a *Standby; leasestore.Contenders.Announce sends it through
// the admin endpoint POST /lease/standby). A contender then reads the
// lease row back to back, for at most StandbyFor, and makes its acquire
// attempt the moment the row is free, instead of waiting for the nudge
// that follows the release: waking an idle process costs more than the
// whole acquire (docs/performance.md). A holder, an actor not contending,
// one already standing by, or one whose last standby began less than
// standbySpacing ago ignores it. It only ever reads, and it can only
// cause an acquire attempt, rate-limited like a nudge's.
type Standby struct {
	// Watching, when not nil, is closed once the watch has made its first
	// read (or at once when the actor ignores the Standby), so the admin
	// endpoint answers the holder only when its release can no longer
	// land before the watch began.
	Watching chan struct{} `json:"-"`
}

// StandbyFor bounds one standby: a holder announces right before its
// release, which lands well within it unless the database is stalled,
// and then the nudge (or the next retry) serves. The reads keep one core
// busy for the first standbySpin of it and pause between reads after
// that (each read returns at once on a file database; it is one round
// trip on a libSQL server).
const StandbyFor = 50 * time.Millisecond

// standbySpin is how long a standby reads back to back, yielding only,
// before it pauses between reads (pauser): a holder announces right
// before its release, which most often lands within a few milliseconds.
const standbySpin = 10 * time.Millisecond

// standbySpacing is the least time between the starts of two standbys
// of one lease: a holder announces once per release, so a contender
// hears at most one a handover; more often is a misbehaving (or, without
// admin.token, any local) caller, whose standbys would otherwise keep a
// core busy. One ignored costs nothing but its speed: the nudge follows
// the release all the same.
const standbySpacing = time.Second

// VacancyReader is what a standby needs from the lease store besides
// StoreAPI: *leasestore.Store implements it (Store.Vacant). A store
// without it makes Standby a no-op.
type VacancyReader interface {
	// Vacant reports whether lease name is free to acquire now and the
	// fence its row carries (0 without a row).
	Vacant(ctx context.Context, name string) (vacant bool, fence int64, err error)
}

// standbyOver ends standby gen: vacant when the row was seen free.
type standbyOver struct {
	gen    uint64
	vacant bool
}

// standby state of a leaseActor: the generation of the watch running (0
// for none), its cancel, and when the last one started.
type standbyState struct {
	gen     uint64
	next    uint64
	cancel  context.CancelFunc
	started time.Time
}

// startStandby begins watching the lease row, when this actor contends
// for a lease it does not hold and no watch runs.
func (a *leaseActor) startStandby(watching chan struct{}) {
	reader, ok := a.o.Store.(VacancyReader)
	spaced := a.standby.started.IsZero() || time.Since(a.standby.started) >= standbySpacing
	if !ok || a.o.Unleased || a.o.StandbyFor < 0 || a.standby.gen != 0 || !spaced || a.m.Phase() != machine.PhaseContending {
		if watching != nil {
			close(watching)
		}
		return
	}
	a.standby.started = time.Now()
	a.standby.next++
	gen := a.standby.next
	bound := a.o.StandbyFor
	if bound <= 0 {
		bound = StandbyFor
	}
	ctx, cancel := context.WithTimeout(a.calls, bound)
	a.standby.gen, a.standby.cancel = gen, cancel
	sys, self, name, late, log := a.sys, a.self, a.o.Name, a.late, a.log
	late.calls.Add(1)
	go func() {
		defer late.calls.Done()
		defer cancel()
		vacant, polls, err := watchVacancy(ctx, reader, name, watching)
		late.sendOr(func() { sys.Root.Send(self, &standbyOver{gen: gen, vacant: vacant}) }, func() {})
		// Logged after the send: the line is a write to stderr, and the
		// acquire should not wait for it.
		log.Debug().Bool("vacant", vacant).Int("reads", polls).AnErr("error", err).Msg("lease standby ended")
	}()
}

// watchVacancy reads name's row until it is free (true), another grant
// replaces the one first read (a quicker contender won), a read fails, or
// ctx ends; it returns how many reads it made. It closes watching (when
// not nil) after the first read.
func watchVacancy(ctx context.Context, r VacancyReader, name string, watching chan struct{}) (bool, int, error) {
	if watching != nil {
		defer func() {
			if watching != nil {
				close(watching)
			}
		}()
	}
	p := newPauser()
	defer p.close()
	began := time.Now()
	first := int64(-1)
	polls := 0
	for ctx.Err() == nil {
		vacant, f, err := r.Vacant(ctx, name)
		polls++
		if watching != nil {
			close(watching)
			watching = nil
		}
		switch {
		case err != nil:
			return false, polls, err
		case vacant:
			return true, polls, nil
		case first < 0:
			first = f
		case f != first:
			return false, polls, nil
		}
		p.pause(time.Since(began))
	}
	return false, polls, nil
}

// standbyEnded takes the end of a watch in: a row seen free is acted on
// like a nudge.
func (a *leaseActor) standbyEnded(ctx actor.Context, msg *standbyOver) {
	if msg.gen != a.standby.gen {
		return
	}
	a.standby.gen, a.standby.cancel = 0, nil
	if msg.vacant {
		a.step(ctx, machine.Nudge{})
	}
}

// stopStandby cancels the watch running, if any: the actor no longer
// contends (it acquired, or is stopping).
func (a *leaseActor) stopStandby() {
	if a.standby.cancel != nil {
		a.standby.cancel()
		a.standby.gen, a.standby.cancel = 0, nil
	}
}
