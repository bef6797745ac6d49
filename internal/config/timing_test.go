package config

import (
	"errors"
	"testing"
	"time"
)

func TestTimingValidateNamesTheRelation(t *testing.T) {
	ok := Timing{TTL: 15 * time.Second, RenewInterval: 5 * time.Second, RenewDeadline: 10 * time.Second, RetryInterval: 2 * time.Second}
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	for _, tc := range []struct {
		name      string
		change    func(*Timing)
		key, want string
	}{
		{"zero ttl", func(t *Timing) { t.TTL = 0 }, "leases.ttl", "must be positive, got 0s"},
		{"negative renew interval", func(t *Timing) { t.RenewInterval = -time.Second }, "leases.renew_interval", "must be positive, got -1s"},
		{"renew interval at half the ttl", func(t *Timing) { t.RenewInterval = 7500 * time.Millisecond },
			"leases.renew_interval", "must be less than half of leases.ttl (7.5s >= 15s/2)"},
		{"zero renew deadline", func(t *Timing) { t.RenewDeadline = 0 }, "leases.renew_deadline", "must be positive, got 0s"},
		{"renew deadline beyond the ttl", func(t *Timing) { t.RenewDeadline = 20 * time.Second },
			"leases.renew_deadline", "must be less than leases.ttl (20s >= 15s)"},
		{"renew deadline at the renew interval", func(t *Timing) { t.RenewDeadline = 5 * time.Second },
			"leases.renew_deadline", "must be greater than leases.renew_interval (5s <= 5s)"},
		{"zero retry interval", func(t *Timing) { t.RetryInterval = 0 }, "leases.retry_interval", "must be positive, got 0s"},
		{"retry interval beyond the ttl", func(t *Timing) { t.RetryInterval = time.Minute },
			"leases.retry_interval", "must not exceed leases.ttl (1m0s > 15s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := ok
			tc.change(&bad)
			err := bad.Validate()
			var te *TimingError
			if !errors.As(err, &te) {
				t.Fatalf("Validate() = %v, want a *TimingError", err)
			}
			if te.Key != tc.key || te.Reason != tc.want {
				t.Fatalf("Validate() = %q / %q, want %q / %q", te.Key, te.Reason, tc.key, tc.want)
			}
			if want := "lease timing: " + tc.key + ": " + tc.want; err.Error() != want {
				t.Fatalf("Error() = %q, want %q", err.Error(), want)
			}
		})
	}
}
