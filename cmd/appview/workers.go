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
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/workers"
	"github.com/atcr-io/appview/system"
)

// registered is the list of workers `serve` runs: adding a worker is one
// line here (docs/architecture.md, "Adding a worker"). A worker whose
// constructor returns an error wrapping workers.ErrDisabled is left out
// (e.g. labeler.url empty), as is one with Keys whose <section>.enabled
// is false. pm are the processor's collectors, built once per process:
// the consumer's and the backfill's processors count into them (nil where
// only the workers' keys are read).
func registered(pm *processor.Metrics) []workers.Registration {
	return []workers.Registration{
		{New: consumer.Worker(statscache.New, pm)},
		{New: backfill.ProcessorWorker(pm)},
		{New: labeler.Worker},
		{New: cleanup.Worker},
		{New: billing.Worker},
		{New: health.Worker},
	}
}

// workerKeys are the configuration sections of the registered workers
// that own one, for config.Load (cli.ConfigFlags.Workers) and
// `config init`.
func workerKeys() []config.WorkerKeys {
	var keys []config.WorkerKeys
	for _, r := range registered(nil) {
		if r.Keys.Section != "" {
			keys = append(keys, r.Keys)
		}
	}
	return keys
}

// buildWorkers builds the Spec of every registered worker that is not
// disabled, in registration order, with the processor's collectors
// registered on d.Metrics.
func buildWorkers(d workers.Deps) ([]workers.Spec, error) {
	pm, err := processor.NewMetrics(d.Metrics)
	if err != nil {
		return nil, err
	}
	var specs []workers.Spec
	for _, r := range registered(pm) {
		w, err := r.Build(d)
		if errors.Is(err, workers.ErrDisabled) {
			continue
		}
		if err != nil {
			return nil, err
		}
		specs = append(specs, w)
	}
	return specs, nil
}

func registerWorkers(r *system.Registry, d workers.Deps) error {
	specs, err := buildWorkers(d)
	if err != nil {
		return err
	}
	for _, w := range specs {
		if err := r.Register(w); err != nil {
			return err
		}
	}
	return nil
}
