package system

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// unleasedMark keeps this instance's unleased_instances record while it
// runs with leases off, so that an instance started beside it (leased or
// not) sees it and refuses to start (cmd/appview, besideUnleased), and
// watches, at each refresh, for one that started beside it at the same
// moment and so passed that check.
type unleasedMark struct {
	stop     chan struct{}
	done     chan struct{}
	conflict chan error // one error, then closed by nobody: read once
}

// markUnleased writes the record at once, waiting for it at most one
// renew interval (a stalled database does not hold the start up longer),
// so that an instance started after this one has said it started finds
// it, and refreshes it every leases.renew_interval until stopUnleased. A
// failed write is logged at warn, once until one succeeds again: the
// workers run all the same, but an instance started meanwhile would not
// see this one.
//
// After each refresh it looks for an instance beside it (unleasedConflict):
// a lease held on the database, or another live leases-off record that
// started earlier. The first one found is sent on Conflict, once, and the
// refreshes go on until the stop.
func (s *System) markUnleased() {
	m := &unleasedMark{stop: make(chan struct{}), done: make(chan struct{}), conflict: make(chan error, 1)}
	s.mark = m
	id, every := s.o.Config.InstanceID, s.o.Config.Leases.RenewInterval
	failing, reported := false, false
	refresh := func() {
		err := MarkUnleased(context.Background(), s.o.DB, id, s.store.Nonce(), every)
		if err != nil && !failing {
			s.log.Warn().Err(err).Msg("could not record this instance as running with leases off: an instance started beside it now would not see it")
		}
		failing = err != nil
		if err != nil || reported {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		defer cancel()
		if c := s.unleasedConflict(ctx); c != nil {
			reported = true
			m.conflict <- c
		}
	}
	first := make(chan struct{})
	go func() {
		defer close(m.done)
		refresh()
		close(first)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
				refresh()
			}
		}
	}()
	wait := time.NewTimer(every)
	defer wait.Stop()
	select {
	case <-first:
	case <-wait.C:
	}
}

// ErrBesideUnleased is wrapped by what Conflict reports.
var ErrBesideUnleased = errors.New("another instance runs beside this one, which runs with leases off")

// unleasedConflict returns why this instance, running with leases off,
// must stop, or nil: a lease held on the database (a leased instance runs
// its workers, fenced, beside this one's unfenced copies), or another
// process start's live leases-off record that started before this one's
// (UnleasedBefore: of two unleased instances that started at
// the same moment, the later one yields). A read that fails says nothing.
func (s *System) unleasedConflict(ctx context.Context) error {
	if rows, err := fence.ListBounded(ctx, s.o.DB); err == nil {
		var held []string
		for _, r := range rows {
			if r.State() == fence.StateHeld {
				held = append(held, fmt.Sprintf("%s by %s (fence %d)", r.Name, r.Holder, r.Fence))
			}
		}
		if len(held) > 0 {
			return fmt.Errorf("%w: leases are held on this database (%s)", ErrBesideUnleased, strings.Join(held, "; "))
		}
	}
	all, err := ListUnleased(ctx, s.o.DB)
	if err != nil {
		return nil
	}
	var self *UnleasedInstance
	for i := range all {
		if all[i].Nonce == s.store.Nonce() && all[i].Instance == s.o.Config.InstanceID {
			self = &all[i]
		}
	}
	if self == nil {
		return nil
	}
	for _, u := range all {
		if u.Nonce != self.Nonce && u.Live() && UnleasedBefore(u, *self) {
			return fmt.Errorf("%w: %s started before this one with leases off too", ErrBesideUnleased, u)
		}
	}
	return nil
}

// Conflict delivers, at most once, why this instance, running with leases
// off, found another beside it after its start (see markUnleased); the
// caller stops it. Nil (never ready) when leases are on.
func (s *System) Conflict() <-chan error {
	if s.mark == nil {
		return nil
	}
	return s.mark.conflict
}

// stopUnleased ends the refreshes and deletes the record, bounded by ctx
// (a write stuck in the driver is left behind; the record is then
// overdue two refresh intervals after its last refresh).
func (s *System) stopUnleased(ctx context.Context) {
	m := s.mark
	if m == nil {
		return
	}
	close(m.stop)
	select {
	case <-m.done:
	case <-ctx.Done():
		return
	}
	err := database.Bounded(ctx, func() error { return UnmarkUnleased(ctx, s.o.DB, s.o.Config.InstanceID, s.store.Nonce()) })
	if err != nil {
		s.log.Debug().Err(err).Msg("could not delete this instance's leases-off record; it is overdue two refresh intervals after its last")
	}
}
