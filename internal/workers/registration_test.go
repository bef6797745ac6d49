package workers

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/fence"
)

// A worker registered with Keys is left out while <section>.enabled is
// false, without its constructor being called, and its Job runs every
// <section>.interval.
func TestBuildAppliesTheWorkersOwnKeys(t *testing.T) {
	keys := Keys{Section: "digest", Enabled: true, Interval: time.Hour, MinInterval: time.Minute}
	built := 0
	job := func(context.Context, fence.Custody) error { return nil }
	r := Registration{Keys: keys, New: func(Deps) (Spec, error) {
		built++
		return Spec{Name: "digest", Leased: true, Job: job}, nil
	}}
	load := func(sets ...string) Deps {
		cfg, err := config.Load(config.Sources{Workers: []config.WorkerKeys{keys}, Sets: sets})
		if err != nil {
			t.Fatal(err)
		}
		return Deps{Config: cfg}
	}
	if s, err := r.Build(load("digest.interval=2h")); err != nil || s.Interval != 2*time.Hour || built != 1 {
		t.Fatalf("Build = %+v, %v (built %d), want every 2h", s, err, built)
	}
	if _, err := r.Build(load("digest.enabled=false")); !errors.Is(err, ErrDisabled) || !strings.Contains(err.Error(), "digest.enabled is false") || built != 1 {
		t.Fatalf("disabled: %v (built %d), want ErrDisabled naming digest.enabled and no constructor call", err, built)
	}
	if _, err := r.Build(Deps{Config: config.Default()}); err == nil || errors.Is(err, ErrDisabled) {
		t.Fatalf("keys not loaded: %v, want an error", err)
	}
	r.New = func(Deps) (Spec, error) { return Spec{Name: "digest", Job: job, Interval: time.Minute}, nil }
	if _, err := r.Build(load()); err == nil || !strings.Contains(err.Error(), "comes from digest.interval") {
		t.Fatalf("a Spec with its own Interval: %v, want refused", err)
	}
	// Without Keys, Build is New.
	plain := Registration{New: func(Deps) (Spec, error) { return Spec{Name: "x", Job: job, Interval: time.Second}, nil }}
	if s, err := plain.Build(Deps{Config: config.Default()}); err != nil || s.Interval != time.Second {
		t.Fatalf("without Keys: %+v %v", s, err)
	}
}
