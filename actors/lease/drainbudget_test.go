package lease

import (
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/workers"
)

// A worker that spends workers.DrainBudget on a Drain must still stop
// within the LeaseActor's bound on a worker's stop, or it is reported
// stuck and holds the instance's stop up.
func TestTheDrainBudgetFitsInTheWorkerStopBound(t *testing.T) {
	if margin := WorkerStopTimeout - workers.DrainBudget; margin < time.Second {
		t.Fatalf("workers.DrainBudget %s leaves %s of WorkerStopTimeout %s for the worker's own stop, want at least 1s",
			workers.DrainBudget, margin, WorkerStopTimeout)
	}
}
