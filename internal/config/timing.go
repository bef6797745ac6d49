package config

import (
	"fmt"
	"time"
)

// Timing is the lease timing of docs/spec.md §3 (the leases.* keys). The relations
// Validate checks are what the custody guarantee rests on; the config
// loader adds operator floors and ceilings on top (see internal/config).
type Timing struct {
	// TTL is the grant length on the database's clock (leases.ttl).
	TTL time.Duration
	// RenewInterval is how often the holder renews (leases.renew_interval).
	RenewInterval time.Duration
	// RenewDeadline is how long, measured locally from the start of the
	// last successful acquire/renew attempt, the holder trusts its grant
	// (leases.renew_deadline).
	RenewDeadline time.Duration
	// RetryInterval is the contender's base retry period, jittered ±20%
	// (leases.retry_interval).
	RetryInterval time.Duration
}

// TimingError is the first relation a Timing breaks. Key names the
// setting at fault by its config key (e.g. "leases.renew_deadline") and
// Reason says which relation it breaks, naming the other setting by its
// key and giving both values, e.g. "must be less than leases.ttl (20s >=
// 15s)".
type TimingError struct {
	Key    string
	Reason string
}

func (e *TimingError) Error() string { return "lease timing: " + e.Key + ": " + e.Reason }

func timingErr(key, format string, args ...any) *TimingError {
	return &TimingError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// Validate reports the first relation t breaks as a *TimingError, or nil.
// The relations, in the order checked (as client-go's leader election and
// River's leadership validate theirs):
//
//   - every duration is positive;
//   - RenewInterval < TTL/2: two renewals fit in one TTL, so one lost
//     renewal does not lose the lease;
//   - RenewDeadline < TTL: the holder stops trusting its grant before the
//     grant can expire on the database and be granted to another instance;
//   - RenewDeadline > RenewInterval: at least one renewal is attempted
//     before the holder gives custody up;
//   - RetryInterval <= TTL: an expired lease is not left unclaimed for
//     longer than the TTL it was meant to bound.
func (t Timing) Validate() error {
	switch {
	case t.TTL <= 0:
		return timingErr("leases.ttl", "must be positive, got %s", t.TTL)
	case t.RenewInterval <= 0:
		return timingErr("leases.renew_interval", "must be positive, got %s", t.RenewInterval)
	case t.RenewInterval >= t.TTL/2:
		return timingErr("leases.renew_interval", "must be less than half of leases.ttl (%s >= %s/2)", t.RenewInterval, t.TTL)
	case t.RenewDeadline <= 0:
		return timingErr("leases.renew_deadline", "must be positive, got %s", t.RenewDeadline)
	case t.RenewDeadline >= t.TTL:
		return timingErr("leases.renew_deadline", "must be less than leases.ttl (%s >= %s)", t.RenewDeadline, t.TTL)
	case t.RenewDeadline <= t.RenewInterval:
		return timingErr("leases.renew_deadline", "must be greater than leases.renew_interval (%s <= %s)", t.RenewDeadline, t.RenewInterval)
	case t.RetryInterval <= 0:
		return timingErr("leases.retry_interval", "must be positive, got %s", t.RetryInterval)
	case t.RetryInterval > t.TTL:
		return timingErr("leases.retry_interval", "must not exceed leases.ttl (%s > %s)", t.RetryInterval, t.TTL)
	}
	return nil
}
