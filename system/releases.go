package system

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/atcr-io/appview/actors/lease"
)

// releaseAudit follows this instance's custody events so that Stop can say
// whether every lease the instance held when the stop began was released.
// A lease lost during the stop for any reason but superseded (a release
// that failed, a blackout) still has a live grant in the database that
// runs out its TTL: the stop did not hand it over, and Stop says so. A
// lease lost to another instance (superseded) is not ours to release.
//
// observe runs on the EventStream publisher's goroutine: it only takes a
// mutex around map updates.
type releaseAudit struct {
	instance string
	mu       sync.Mutex
	held     map[string]int64 // lease → fence this instance holds
	pending  map[string]int64 // held when the stop began, not yet released
	failed   []string         // "lease (fence N): reason"
	stopping bool
	// givenUp are grants this instance gave up before the stop without a
	// release (lost for a reason other than superseded: a blackout, a
	// database error, a file replaced), not handed back since and not
	// followed by a newer grant: they still stand in the database until
	// their TTL. The stop has nothing of them to release (unreleased
	// does not count them), but its last line must not say that every
	// lease was released (givenUpNow).
	givenUp map[string]givenUpGrant
}

// givenUpGrant is a grant in releaseAudit.givenUp.
type givenUpGrant struct {
	fence  int64
	reason string
}

func newReleaseAudit(instance string) *releaseAudit {
	return &releaseAudit{instance: instance, held: map[string]int64{}, givenUp: map[string]givenUpGrant{}}
}

func (a *releaseAudit) observe(evt any) {
	e, ok := evt.(lease.Event)
	if !ok || e.Instance != a.instance {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if held, ok := a.held[e.Lease]; ok && e.Fence < held {
		// A hand-back of an older grant answered after a newer grant:
		// it says nothing of the custody held now.
		return
	}
	if pending, ok := a.pending[e.Lease]; ok && e.Fence < pending {
		return
	}
	if g, ok := a.givenUp[e.Lease]; ok {
		switch {
		case e.Fence > g.fence && (e.Kind == lease.LeaseAcquired || e.Kind == lease.LeaseContended):
			delete(a.givenUp, e.Lease) // a newer grant: the given-up one is over
		case e.Fence == g.fence && e.Kind == lease.LeaseReleased:
			delete(a.givenUp, e.Lease) // handed back
		}
	}
	switch e.Kind {
	case lease.LeaseAcquired:
		a.held[e.Lease] = e.Fence
	case lease.LeaseReleased:
		delete(a.held, e.Lease)
		if a.stopping {
			delete(a.pending, e.Lease)
		}
	case lease.LeaseLost:
		delete(a.held, e.Lease)
		if !a.stopping {
			if e.Reason != lease.ReasonSuperseded {
				a.givenUp[e.Lease] = givenUpGrant{fence: e.Fence, reason: e.Reason}
			}
			return
		}
		if _, was := a.pending[e.Lease]; !was {
			return
		}
		delete(a.pending, e.Lease)
		if e.Reason != lease.ReasonSuperseded {
			a.failed = append(a.failed, fmt.Sprintf("%s (fence %d): %s", e.Lease, e.Fence, e.Reason))
		}
	}
}

// beginStop records the leases held now: each must end released.
func (a *releaseAudit) beginStop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopping = true
	a.pending = make(map[string]int64, len(a.held))
	for name, fence := range a.held {
		a.pending[name] = fence
	}
}

// unreleased returns nil when every lease held at beginStop was released
// (or taken by another instance), else an error naming the others.
func (a *releaseAudit) unreleased() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	left := append([]string(nil), a.failed...)
	for name, fence := range a.pending {
		left = append(left, fmt.Sprintf("%s (fence %d): no release", name, fence))
	}
	if len(left) == 0 {
		return nil
	}
	sort.Strings(left)
	return fmt.Errorf("%d lease(s) not released, their grants run out their TTL: %s", len(left), strings.Join(left, "; "))
}

// givenUpNow names the grants given up before the stop and not handed
// back ("lease (fence N): reason"), sorted.
func (a *releaseAudit) givenUpNow() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.givenUp))
	for name, g := range a.givenUp {
		out = append(out, fmt.Sprintf("%s (fence %d): %s", name, g.fence, g.reason))
	}
	sort.Strings(out)
	return out
}

// heldNow returns the leases this instance holds now, sorted.
func (a *releaseAudit) heldNow() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	names := make([]string, 0, len(a.held))
	for name := range a.held {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
