package system

import (
	"context"
	"time"

	"github.com/atcr-io/appview/internal/database"
)

// unleasedMark keeps this instance's leasestore.UnleasedMark record while
// it runs with leases off, so that an instance started beside it (leased
// or not) sees it and refuses to start (cmd/appview, besideUnleased).
type unleasedMark struct {
	stop chan struct{}
	done chan struct{}
}

// markUnleased writes the record at once, waiting for it at most one
// renew interval (a stalled database does not hold the start up longer),
// so that an instance started after this one has said it started finds
// it, and refreshes it every leases.renew_interval (under half of
// leases.ttl, the window within which other instances count it) until
// stopUnleased. A failed write is logged at warn, once until one succeeds
// again: the workers run all the same, but an instance started meanwhile
// would not see this one.
func (s *System) markUnleased() {
	m := &unleasedMark{stop: make(chan struct{}), done: make(chan struct{})}
	s.mark = m
	id, every := s.o.Config.InstanceID, s.o.Config.Leases.RenewInterval
	write := func(failing bool) bool {
		err := s.store.MarkUnleased(context.Background(), id)
		if err != nil && !failing {
			s.log.Warn().Err(err).Msg("could not record this instance as running with leases off: an instance started beside it now would not see it")
		}
		return err != nil
	}
	first := make(chan struct{})
	go func() {
		defer close(m.done)
		failing := write(false)
		close(first)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
				failing = write(failing)
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

// stopUnleased ends the refreshes and deletes the record, bounded by ctx
// (a write stuck in the driver is left behind; the record then stops
// counting leases.ttl after its last refresh).
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
	err := database.Bounded(ctx, func() error { return s.store.UnmarkUnleased(ctx, s.o.Config.InstanceID) })
	if err != nil {
		s.log.Debug().Err(err).Msg("could not delete this instance's leases-off record; it stops counting after leases.ttl")
	}
}
