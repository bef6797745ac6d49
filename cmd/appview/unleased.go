package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/system"
	"github.com/rs/zerolog"
)

// The start's checks of an instance running with leases off beside
// others (system.MarkUnleased records each such process start).

// unleasedBesideHolders refuses leases.enabled false (exit 2) on a
// database where a lease is held now: an instance runs its workers there
// under fences, and this one would run every worker unfenced beside it
// (two consumers, two backfills: doubled webhooks, overwritten stats). A
// grant of this instance's previous run refuses it too until it runs
// out. When the table cannot be read, the start goes on (the workers'
// own writes will say what is wrong) after a warning.
func unleasedBesideHolders(db *database.DB, cfg config.Config, log zerolog.Logger) error {
	if cfg.Leases.Enabled {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), leaseCheckBound)
	defer cancel()
	rows, err := fence.ListBounded(ctx, db)
	if err != nil {
		log.Warn().Err(err).Msg("leases.enabled is false and the lease table could not be read to see whether another instance holds a lease here")
		return nil
	}
	var held []string
	for _, r := range rows {
		if r.State() == fence.StateHeld {
			held = append(held, fmt.Sprintf("%s by %s (fence %d, %s left)", r.Name, r.Holder, r.Fence, r.TimeLeft().Round(time.Millisecond)))
		}
	}
	if len(held) == 0 {
		return nil
	}
	return cli.Refuse("leases.enabled", "false, but leases are held on this database now (%s): another instance runs its workers here under fences, and this one would run every worker unfenced beside it; stop it, or set leases.enabled: true (a grant of this instance's own earlier run clears when its TTL runs out)", strings.Join(held, "; "))
}

// besideUnleased refuses a start (exit 2) on a database where another
// instance runs with leases off now (system.ListUnleased): that
// instance runs every worker unfenced, on the understanding that it is
// alone, so a leased instance would run its workers beside those (two
// consumers: doubled webhooks, stats written twice), and a second
// unleased one would run every worker twice.
//
// A record whose refreshes are not overdue yet may still be a process
// that has just died (kill -9, an OOM kill: a restart under systemd comes
// 2 s later), and refusing it with exit 2 would leave the service down for
// good (RestartPreventExitStatus=2). So the start watches such records
// until each is either refreshed (the instance runs: refused) or overdue
// (it is gone: the start goes on), at most two of its refresh intervals
// and system.UnleasedGrace; a signal meanwhile aborts the start
// (aborted, exit 0). When the table cannot be read, the start goes on
// after a warning, as in unleasedBesideHolders.
func besideUnleased(db *database.DB, cfg config.Config, log zerolog.Logger, sigs <-chan os.Signal) (aborted bool, err error) {
	read := func() ([]system.UnleasedInstance, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), leaseCheckBound)
		defer cancel()
		all, err := system.ListUnleased(ctx, db)
		if err != nil {
			log.Warn().Err(err).Msg("could not read whether another instance runs with leases off on this database")
			return nil, false
		}
		return all, true
	}
	all, ok := read()
	watched := map[string]int64{} // nonce → seen_at at the first read
	for _, u := range all {
		if u.Live() {
			watched[u.Nonce] = u.SeenAt
		}
	}
	if !ok || len(watched) == 0 {
		return false, nil
	}
	// Nothing is logged while waiting: a refusal is one line on stderr.
	names, began := unleasedNames(all, watched), time.Now()
	tick := time.NewTicker(max(min(cfg.Leases.RenewInterval/4, 250*time.Millisecond), 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case sig := <-sigs:
			log.Info().Stringer("signal", sig).Strs("instances", names).
				Msg("start aborted by a signal while waiting to see whether an instance running with leases off here is still running")
			return true, nil
		case <-tick.C:
		}
		all, ok = read()
		if !ok {
			return false, nil
		}
		var running []string
		pending := false
		for _, u := range all {
			first, isWatched := watched[u.Nonce]
			switch {
			case !isWatched || !u.Live():
			case u.SeenAt != first:
				running = append(running, u.String())
			default:
				pending = true
			}
		}
		if len(running) > 0 {
			list := strings.Join(running, ", ")
			if cfg.Leases.Enabled {
				return false, cli.Refuse("leases.enabled", "true, but instances run with leases.enabled false on this database now: %s; such an instance runs every worker unfenced, and this one's workers would run beside them; stop it first", list)
			}
			return false, cli.Refuse("leases.enabled", "false, but other instances already run with leases off on this database: %s; each would run every worker, so there would be two of each; run one unleased instance only, or set leases.enabled: true on all of them", list)
		}
		if !pending {
			log.Info().Strs("instances_at_start", names).Str("waited", time.Since(began).Round(time.Millisecond).String()).
				Msg("the instance that recorded itself as running with leases off is gone (its record went overdue): starting")
			return false, nil
		}
	}
}

// unleasedNames are the records of all whose nonce is in watched, as
// UnleasedInstance.String writes them.
func unleasedNames(all []system.UnleasedInstance, watched map[string]int64) []string {
	var out []string
	for _, u := range all {
		if _, ok := watched[u.Nonce]; ok {
			out = append(out, u.String())
		}
	}
	return out
}
