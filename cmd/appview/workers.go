package main

import (
	"errors"

	"github.com/atcr-io/appview/actors/backfill"
	"github.com/atcr-io/appview/actors/billing"
	"github.com/atcr-io/appview/actors/cleanup"
	"github.com/atcr-io/appview/actors/consumer"
	"github.com/atcr-io/appview/actors/health"
	"github.com/atcr-io/appview/actors/labeler"
	"github.com/atcr-io/appview/actors/statscache"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/workers"
	"github.com/atcr-io/appview/system"
)

// workerConstructors is the list of workers `serve` runs: adding a worker
// is one line here. A constructor returning an error that wraps
// workers.ErrDisabled leaves that worker out (e.g. labeler.url empty). pm
// are the processor's collectors, built once per process: the consumer's
// and the backfill's processors count into them.
func workerConstructors(pm *processor.Metrics) []func(workers.Deps) (workers.Spec, error) {
	return []func(workers.Deps) (workers.Spec, error){
		consumer.Worker(statscache.New, pm),
		backfill.ProcessorWorker(pm),
		labeler.Worker,
		cleanup.Worker,
		billing.Worker,
		health.Worker,
	}
}

func registerWorkers(r *system.Registry, d workers.Deps) error {
	pm, err := processor.NewMetrics(d.Metrics)
	if err != nil {
		return err
	}
	for _, build := range workerConstructors(pm) {
		w, err := build(d)
		if errors.Is(err, workers.ErrDisabled) {
			continue
		}
		if err != nil {
			return err
		}
		if err := r.Register(w); err != nil {
			return err
		}
	}
	return nil
}
