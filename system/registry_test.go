package system

import (
	"context"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/asynkron/protoactor-go/actor"
)

func TestRegisterRefusesInvalidWorkers(t *testing.T) {
	job := func(context.Context, fence.Custody) error { return nil }
	props := func(fence.Custody) *actor.Props { return nil }
	for _, tc := range []struct {
		name   string
		w      workers.Spec
		reason string
	}{
		{"empty name", workers.Spec{Job: job}, "name must match"},
		{"upper case name", workers.Spec{Name: "Cleanup", Job: job}, "name must match"},
		{"name with a dot", workers.Spec{Name: "jetstream.consumer", Job: job}, "name must match"},
		{"neither actor nor job", workers.Spec{Name: "nothing"}, "exactly one of Actor and Job"},
		{"both actor and job", workers.Spec{Name: "both", Actor: props, Job: job}, "exactly one of Actor and Job"},
		{"negative interval", workers.Spec{Name: "neg", Job: job, Interval: -1}, "negative interval"},
		{"interval on an actor", workers.Spec{Name: "actor", Actor: props, Interval: 1}, "Job workers only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Registry
			if err := r.Register(tc.w); err == nil || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("Register = %v, want an error containing %q", err, tc.reason)
			}
			if len(r.Workers()) != 0 {
				t.Fatalf("a refused worker was registered")
			}
		})
	}
}

func TestRegisterRefusesADuplicateNameAndKeepsOrder(t *testing.T) {
	job := func(context.Context, fence.Custody) error { return nil }
	var r Registry
	for _, name := range []string{"cleanup", "backfill", "health"} {
		if err := r.Register(workers.Spec{Name: name, Job: job}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Register(workers.Spec{Name: "backfill", Job: job}); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Fatalf("duplicate Register = %v, want already registered", err)
	}
	var names []string
	for _, w := range r.Workers() {
		names = append(names, w.Name)
	}
	if strings.Join(names, ",") != "cleanup,backfill,health" {
		t.Fatalf("Workers() = %v, want registration order", names)
	}
}
