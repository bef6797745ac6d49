package consumer

import (
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/workers"
)

func TestTheCommitBudgetLeavesALeaseRenewalTimeToLand(t *testing.T) {
	for _, c := range []struct {
		name                string
		budget, every, dead time.Duration
		leases              bool
		want                time.Duration
	}{
		{"defaults", 250 * time.Millisecond, 5 * time.Second, 10 * time.Second, true, 250 * time.Millisecond},
		// A new user's settings: a 1h budget lost the lease in catch-up.
		{"a budget longer than the renewal window", time.Hour, 900 * time.Millisecond, 1500 * time.Millisecond, true, 300 * time.Millisecond},
		{"short lease timings cut the default", 250 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, true, 25 * time.Millisecond},
		{"no leases: half the busy timeout", time.Hour, 900 * time.Millisecond, 1500 * time.Millisecond, false, 2500 * time.Millisecond},
	} {
		cfg := config.Default()
		cfg.Jetstream.CommitBudget, cfg.Leases.RenewInterval, cfg.Leases.RenewDeadline, cfg.Leases.Enabled = c.budget, c.every, c.dead, c.leases
		if got := EffectiveCommitBudget(cfg); got != c.want {
			t.Errorf("%s: budget %v, want %v", c.name, got, c.want)
		}
	}
}

// The webhook drain leaves half of shutdown_timeout for the release: a
// 3 s shutdown_timeout ran out during an 8 s drain and the lease was left
// to its TTL.
func TestTheDrainBudgetLeavesTheReleaseHalfOfTheShutdownTimeout(t *testing.T) {
	for _, c := range []struct {
		shutdown, want time.Duration
	}{
		{30 * time.Second, workers.DrainBudget},
		{3 * time.Second, 1500 * time.Millisecond},
		{100 * time.Millisecond, 50 * time.Millisecond},
	} {
		cfg := config.Default()
		cfg.ShutdownTimeout = c.shutdown
		if got := DrainBudget(cfg); got != c.want {
			t.Errorf("shutdown_timeout %v: drain budget %v, want %v", c.shutdown, got, c.want)
		}
	}
}
