package lease

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/actors/lease/internal/machine"
	"github.com/atcr-io/appview/internal/leasestore"
)

// Standby tells a LeaseActor that its lease's holder is about to release
// it (send a *Standby; leasestore.Contenders.Announce sends it through
// the admin endpoint POST /lease/standby). A contender then reads the
// lease row back to back, for at most StandbyFor (and a quarter of the
// renew deadline), and makes its acquire attempt the moment the row is
// free, instead of waiting for the nudge that follows the release: waking
// an idle process costs more than the whole acquire (docs/performance.md).
// The attempt is the machine's next one brought forward
// (machine.Standby), made by the goroutine that saw the row free, with no
// trip through the mailbox in between; it is made when the watch ends
// without seeing the row free too, and not at all when the instance stops
// meanwhile. A holder, an actor not contending or with an attempt in
// flight, or one whose last standby began less than standbySpacing ago
// ignores it. So a Standby costs reads and at most one acquire attempt,
// at most one a standbySpacing.
type Standby struct {
	// Watching, when not nil, is closed once the watch has made its first
	// read (or at once when the actor ignores the Standby), so the admin
	// endpoint answers the holder only when its release can no longer
	// land before the watch began.
	Watching chan struct{} `json:"-"`
	// Began, when not nil, is set before Watching is closed if the watch
	// made its first read: the watch will find the lease handed to this
	// process (leasestore.Store.Transfer), so the endpoint's answer offers
	// this process as the successor.
	Began *atomic.Bool `json:"-"`
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
// StoreAPI: *leasestore.Store implements it (Store.Watch). A store
// without it makes Standby a no-op.
type VacancyReader interface {
	// Watch reads whether lease name is free to acquire now, the fence
	// its row carries (0 without a row), and whether the grant is this
	// process's under holder (a holder handed it over:
	// leasestore.Store.Transfer).
	Watch(ctx context.Context, name, holder string) (leasestore.Vacancy, error)
}

// PendingAcquirer is a VacancyReader that can mark the acquire a standby
// is about to make as a pending lease write of this process, from the
// watch's start until done is called: *leasestore.Store implements it
// (Store.PendingAcquire), and this process's fenced worker transactions
// hold back for it (fence.LeaseWrite). A process standing by often runs
// the worker of another lease of the same holder, granted a moment
// before (a stopping holder releases all it holds); that worker's first
// transactions took the write lock just as the holder's next release or
// this acquire needed it, and the one that met the lock slept in SQLite's
// busy handler (1 ms and more: docs/performance.md, twelfth pass).
type PendingAcquirer interface {
	PendingAcquire() (done func())
}

// spinning is held by the one watch of the process that spins (see
// newWatchPauser).
var spinning atomic.Bool

// newWatchPauser returns the pauser of a watch: the process's spinning
// one (yields for its first standbySpin) when no other watch of the
// process spins, else one that pauses on a timer from the first read.
// Each spinning watch keeps a core busy, and a process contends for
// several leases, whose holder announces them all at its stop: two
// spinning watches on a 2-core host left the releasing holder and the
// acquire itself waiting for a core (graceful_handover_p50_ms, five
// alternating runs each: 0.45–0.67 ms, median 0.56, with every watch
// spinning; 0.32–0.70, median 0.42, with one). close gives the spin up.
func newWatchPauser() *pauser {
	p := newPauser()
	if spinning.CompareAndSwap(false, true) {
		p.spins = true
	}
	return p
}

// errStandbyOff is the cause with which stopStandby calls a watch off.
var errStandbyOff = errors.New("standby called off")

// standby state of a leaseActor: the announcement's channel waiting for
// the watch to take it, the cancel of the watch running (nil for none),
// and when the last one started.
type standbyState struct {
	watching chan struct{}
	began    *atomic.Bool
	cancel   context.CancelCauseFunc
	seq      uint64 // the AcquireCmd whose watch cancel calls off
	started  time.Time
}

// startStandby takes an announcement in: when this actor contends for a
// lease it does not hold, with standbys on and spaced, the machine issues
// its next attempt as an AcquireCmd with AfterVacancy (machine.Standby;
// not while an attempt is in flight), whose goroutine watches the row
// (goAcquire, watchFirst) and takes watching; otherwise watching is
// closed at once.
func (a *leaseActor) startStandby(ctx actor.Context, watching chan struct{}, began *atomic.Bool) {
	_, ok := a.o.Store.(VacancyReader)
	spaced := a.standby.started.IsZero() || time.Since(a.standby.started) >= standbySpacing
	if ok && !a.o.Unleased && a.o.StandbyFor >= 0 && spaced && a.m.Phase() == machine.PhaseContending {
		a.standby.watching, a.standby.began = watching, began
		a.step(ctx, machine.Standby{})
		watching, a.standby.watching, a.standby.began = a.standby.watching, nil, nil
	}
	if watching != nil {
		close(watching)
	}
}

// standbyBound bounds a standby's watch: StandbyFor (or Options.StandbyFor),
// and at most a quarter of the renew deadline, so the acquire after it
// still answers well within the machine's call timeout (half of it).
func (a *leaseActor) standbyBound() time.Duration {
	bound := a.o.StandbyFor
	if bound <= 0 {
		bound = StandbyFor
	}
	return min(bound, a.o.Timing.RenewDeadline/4)
}

// watchFirst runs, on an AfterVacancy acquire's goroutine, the watch of
// the row that comes before the acquire (begun in goAcquire, which gave
// it wctx and watching). It reports whether the acquire is still to be
// made (false when the watch was called off by stopStandby, the instance
// stopping, or the actor's calls were cancelled) and a func that logs the
// watch's end: call it after the acquire, which should not wait for a
// write to stderr.
//
// When the watch found the lease handed to this process (Vacancy.Ours),
// it returns that read (no acquire is to be made: the grant is made).
func watchFirst(wctx, calls context.Context, reader VacancyReader, name, holder string, watching chan struct{}, began *atomic.Bool, log zerolog.Logger) (bool, leasestore.Vacancy, func()) {
	v, polls, err := watchVacancy(wctx, reader, name, holder, watching, began)
	attempt := !v.Ours && calls.Err() == nil && !errors.Is(context.Cause(wctx), errStandbyOff)
	return attempt, v, func() {
		log.Debug().Bool("vacant", v.Free).Bool("handed_over", v.Ours).Int("reads", polls).AnErr("error", err).Bool("acquire", attempt).Msg("lease standby ended")
	}
}

// release gives the process's spin back, if this pauser held it.
func (p *pauser) release() {
	if p.spins {
		p.spins = false
		spinning.Store(false)
	}
}

// watchVacancy reads name's row until it is free (Free), handed to this
// process (Ours), another grant replaces the one first read (a quicker
// contender won), a read fails, or ctx ends; it returns the last read
// and how many reads it made. It closes watching (when not nil) after the
// first read, having set began (when not nil) if that read succeeded and
// the watch goes on.
func watchVacancy(ctx context.Context, r VacancyReader, name, holder string, watching chan struct{}, began *atomic.Bool) (leasestore.Vacancy, int, error) {
	if watching != nil {
		defer func() {
			if watching != nil {
				close(watching)
			}
		}()
	}
	p := newWatchPauser()
	defer p.close()
	start := time.Now()
	first := int64(-1)
	polls := 0
	for ctx.Err() == nil {
		v, err := r.Watch(ctx, name, holder)
		polls++
		if watching != nil {
			if began != nil && err == nil && !v.Free && !v.Ours {
				began.Store(true)
			}
			close(watching)
			watching = nil
		}
		switch {
		case err != nil:
			return leasestore.Vacancy{}, polls, err
		case v.Free || v.Ours:
			return v, polls, nil
		case first < 0:
			first = v.Fence
		case v.Fence != first:
			return leasestore.Vacancy{}, polls, nil
		}
		p.pause(time.Since(start))
	}
	return leasestore.Vacancy{}, polls, nil
}

// stopStandby calls the watch running off, if any: the actor no longer
// contends (it acquired, or is stopping). Its acquire then answers
// machine.ErrNotAttempted.
func (a *leaseActor) stopStandby() {
	if a.standby.cancel != nil {
		a.standby.cancel(errStandbyOff)
		a.standby.cancel = nil
	}
}
