package consumer

import (
	"fmt"
	"net/http"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/webhooks"
	"github.com/atcr-io/appview/internal/workers"
)

// LeaseName is the lease the consumer runs under (docs/spec.md §4).
const LeaseName = "jetstream-consumer"

// Worker returns the registration of the consumer under lease
// "jetstream-consumer"; stats is the registration of the StatsCache the
// consumer spawns as its child on every grant (statscache.New), so the
// consumer never imports the package that implements it, and pm the
// process's processor collectors (processor.NewMetrics, built once: the
// backfill's processor counts into them too). The registration builds the
// process-wide parts once (processor, metrics, the webhook client and
// configuration); each grant of custody gets a new actor with them. Its
// errors are a *config.Error or a metrics registration failure.
func Worker(stats func(workers.Deps) (processor.StatsProps, error), pm *processor.Metrics) func(workers.Deps) (workers.Spec, error) {
	return func(d workers.Deps) (workers.Spec, error) { return worker(d, stats, pm) }
}

func worker(d workers.Deps, stats func(workers.Deps) (processor.StatsProps, error), pm *processor.Metrics) (workers.Spec, error) {
	jm, err := jetstream.NewMetrics(d.Metrics)
	if err != nil {
		return workers.Spec{}, err
	}
	sp, err := stats(d)
	if err != nil {
		return workers.Spec{}, err
	}
	cm, err := NewMetrics(d.Metrics)
	if err != nil {
		return workers.Spec{}, err
	}
	rm, err := NewResyncMetrics(d.Metrics)
	if err != nil {
		return workers.Spec{}, err
	}
	disp, err := webhooks.NewDispatcherOptions(d)
	if err != nil {
		return workers.Spec{}, fmt.Errorf("consumer: %w", err)
	}
	proc := processor.New(processor.Options{Log: d.Log, Metrics: pm, Handles: d.HandleResolver()})
	health := &workers.Health{}
	js := d.Config.Jetstream
	if js.CommitBudget = EffectiveCommitBudget(d.Config); js.CommitBudget != d.Config.Jetstream.CommitBudget {
		d.Log.Warn().Str("key", "jetstream.commit_budget").Dur("configured", d.Config.Jetstream.CommitBudget).
			Dur("used", js.CommitBudget).Msg("commit budget shortened to half of database.busy_timeout or of leases.renew_deadline - leases.renew_interval, so other writers and lease renewals are not starved")
	}
	o := Options{
		DB:            d.DB,
		Log:           d.Log,
		Jetstream:     js,
		Processor:     proc,
		Dispatcher:    disp,
		DrainBudget:   DrainBudget(d.Config),
		ClientMetrics: jm,
		Stats:         sp,
		Metrics:       cm,
		Health:        health,
		Resync:        NewResyncer(d.DB, d.Resolver(), proc, d.Config.Jetstream.ResyncInterval, d.Log, rm),
	}
	o.Resync.HTTP = resyncHTTP(d.Config)
	return workers.Spec{
		Name:   LeaseName,
		Leased: true,
		Health: health,
		Actor: func(c fence.Custody) *actor.Props {
			oc := o
			oc.Custody = c
			return NewProps(oc)
		},
	}, nil
}

// DrainBudget is how long a graceful stop under cfg waits for the webhook
// deliveries in flight: workers.DrainBudget, but at most half of
// shutdown_timeout, so the lease's release still lands within the stop
// (a new user's 3 s shutdown_timeout with a hung receiver ran out during
// an 8 s drain and left the lease to its TTL).
func DrainBudget(cfg config.Config) time.Duration {
	if cfg.ShutdownTimeout > 0 {
		return min(workers.DrainBudget, cfg.ShutdownTimeout/2)
	}
	return workers.DrainBudget
}

// EffectiveCommitBudget is the consumer's commit budget under cfg:
// jetstream.commit_budget, but at most half of database.busy_timeout
// (when set: a file database), since every other writer waits at most
// that long for the lock, and with leases enabled at most half of
// leases.renew_deadline - leases.renew_interval: a renewal falls due
// renew_interval after the last one and may wait a whole budget behind
// the consumer's transaction; it must still land before renew_deadline,
// or the holder stops its own workers (a new user's 1h budget with a 2 s
// TTL lost the lease during catch-up).
func EffectiveCommitBudget(cfg config.Config) time.Duration {
	b := cfg.Jetstream.CommitBudget
	limit := func(l time.Duration) {
		if l > 0 && b > l {
			b = l
		}
	}
	limit(cfg.Database.BusyTimeout / 2)
	if cfg.Leases.Enabled {
		limit((cfg.Leases.RenewDeadline - cfg.Leases.RenewInterval) / 2)
	}
	return b
}

// resyncHTTP is the client of the consumer's repository re-reads. A
// re-read asks the PDS a DID document names, which is network data, so
// its dials are checked like the backfill's (a loopback, private or
// link-local address is refused unless network.allow_private), and a
// redirect is followed only on the same host with the same method
// (outbound.SameHostRedirect).
func resyncHTTP(cfg config.Config) *http.Client {
	return workers.Outbound(cfg, "repository re-read").Client(resyncTimeout)
}
