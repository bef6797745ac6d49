package consumer

import (
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/config"
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
