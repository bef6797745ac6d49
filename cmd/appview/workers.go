package main

import (
	"errors"

	"github.com/atcr-io/appview/actors/backfill"
	"github.com/atcr-io/appview/actors/billing"
	"github.com/atcr-io/appview/actors/cleanup"
	"github.com/atcr-io/appview/actors/consumer"
	"github.com/atcr-io/appview/actors/health"
	"github.com/atcr-io/appview/actors/labeler"
	"github.com/atcr-io/appview/system"
)

// workerConstructors is the list of workers `serve` runs: adding a worker
// is one line here. A constructor returning an error that wraps a
// package's ErrDisabled leaves that worker out (e.g. labeler.url empty).
var workerConstructors = []func(system.Deps) (system.Worker, error){
	consumer.Worker,
	backfill.ProcessorWorker,
	labeler.Worker,
	cleanup.Worker,
	billing.Worker,
	health.Worker,
}

// disabled lists the sentinel errors meaning "not configured to run".
var disabled = []error{backfill.ErrDisabled, labeler.ErrDisabled, billing.ErrDisabled}

func registerWorkers(r *system.Registry, d system.Deps) error {
	for _, build := range workerConstructors {
		w, err := build(d)
		if isDisabled(err) {
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

func isDisabled(err error) bool {
	for _, d := range disabled {
		if errors.Is(err, d) {
			return true
		}
	}
	return false
}
