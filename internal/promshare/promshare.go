// Package promshare registers Prometheus collectors that several parts of
// one process construct independently (the consumer's and the backfill's
// processors, every grant of a worker): the first registration wins and
// later ones get the collector already registered under that name, instead
// of prometheus.AlreadyRegisteredError.
package promshare

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg and returns it, or returns the collector of
// the same type already registered under its descriptor. Any other
// registration error is returned (with c).
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
		return c, fmt.Errorf("%w (registered as a %T)", err, are.ExistingCollector)
	}
	return c, err
}
