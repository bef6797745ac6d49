package system

import (
	"fmt"
	"regexp"

	"github.com/atcr-io/appview/internal/workers"
)

var workerName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// Registry is the extension point: every registered worker is started by
// `appview serve`.
type Registry struct {
	workers []workers.Spec
}

// Register adds a worker. It returns an error for an invalid or duplicate
// registration (a programming error: serve refuses to start).
func (r *Registry) Register(w workers.Spec) error {
	switch {
	case !workerName.MatchString(w.Name):
		return fmt.Errorf("register worker %q: name must match %s", w.Name, workerName)
	case (w.Actor == nil) == (w.Job == nil):
		return fmt.Errorf("register worker %q: set exactly one of Actor and Job", w.Name)
	case w.Interval < 0:
		return fmt.Errorf("register worker %q: negative interval", w.Name)
	case w.Actor != nil && w.Interval != 0:
		return fmt.Errorf("register worker %q: Interval applies to Job workers only", w.Name)
	}
	for _, have := range r.workers {
		if have.Name == w.Name {
			return fmt.Errorf("register worker %q: already registered", w.Name)
		}
	}
	r.workers = append(r.workers, w)
	return nil
}

// Workers returns the registered workers in registration order.
func (r *Registry) Workers() []workers.Spec { return append([]workers.Spec(nil), r.workers...) }
