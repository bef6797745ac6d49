// This file renders the operator status page served at GET / on
// the admin port: a small server-rendered HTML page with no
// external assets, plus the in-memory history behind its sparkline and
// handover list.

package admin

import (
	"sync"
	"time"
)

// LeaseSnap is one leases row as the sampler saw it (times on the
// database's clock, Unix ms).
type LeaseSnap struct {
	Name       string
	Holder     string
	Fence      int64
	AcquiredAt int64
	RenewedAt  int64
}

// Handover is a change of a lease's holder seen between two samples.
type Handover struct {
	Lease     string
	From, To  string
	FromFence int64
	ToFence   int64
	// At is when the new holder acquired the lease (database clock).
	At time.Time
	// Gap is the time from the old holder's last successful renewal to the
	// new grant: how long the lease's worker had no proven holder. A
	// graceful release with a nudge makes it short; a crashed holder makes
	// it about one TTL.
	Gap time.Duration
}

// Point is one sample of the Jetstream lag.
type Point struct {
	At  time.Time
	Lag time.Duration
}

// History is what one instance has seen since it started: the handovers
// of every lease and the Jetstream lag over the last Window. It is memory
// only (a restarted instance starts afresh) and safe for concurrent use.
type History struct {
	// Window is how far back lag points are kept (the sparkline's span).
	Window time.Duration
	// MaxHandovers bounds the handovers kept (the newest win).
	MaxHandovers int

	mu        sync.Mutex
	viewed    time.Time
	last      map[string]LeaseSnap
	handovers []Handover
	points    []Point
}

// NewHistory returns a History over the last hour keeping 20 handovers.
func NewHistory() *History {
	return &History{Window: time.Hour, MaxHandovers: 20, last: map[string]LeaseSnap{}}
}

// ObserveLeases records the rows of one sample: a row whose fence moved
// to another holder since the previous sample is a handover. A fence
// that moved while the holder stayed (a holder re-acquiring its own
// lease) is not one.
func (h *History) ObserveLeases(rows []LeaseSnap) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range rows {
		prev, seen := h.last[r.Name]
		h.last[r.Name] = r
		if !seen || r.Fence == prev.Fence || r.Holder == prev.Holder {
			continue
		}
		gap := time.Duration(r.AcquiredAt-prev.RenewedAt) * time.Millisecond
		h.handovers = append(h.handovers, Handover{Lease: r.Name, From: prev.Holder, To: r.Holder,
			FromFence: prev.Fence, ToFence: r.Fence, At: time.UnixMilli(r.AcquiredAt).UTC(), Gap: max(gap, 0)})
		if n := len(h.handovers) - h.MaxHandovers; n > 0 {
			h.handovers = append([]Handover(nil), h.handovers[n:]...)
		}
	}
}

// ObserveLag records one lag sample and drops those older than Window.
func (h *History) ObserveLag(at time.Time, lag time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.points = append(h.points, Point{At: at, Lag: lag})
	cut := 0
	for cut < len(h.points) && at.Sub(h.points[cut].At) > h.Window {
		cut++
	}
	if cut > 0 {
		h.points = append([]Point(nil), h.points[cut:]...)
	}
}

// Handovers returns the handovers seen, newest first.
func (h *History) Handovers() []Handover {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Handover, len(h.handovers))
	for i, ho := range h.handovers {
		out[len(out)-1-i] = ho
	}
	return out
}

// Points returns the lag samples of the window, oldest first.
func (h *History) Points() []Point {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Point(nil), h.points...)
}

// Viewed records that the page was served at t.
func (h *History) Viewed(t time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.viewed = t
}

// ViewedWithin reports whether the page was served within d before now.
func (h *History) ViewedWithin(now time.Time, d time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.viewed.IsZero() && now.Sub(h.viewed) <= d
}
