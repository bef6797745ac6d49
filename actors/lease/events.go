package lease

import "time"

// EventKind is a custody event's kind (docs/spec.md §5), the "event"
// field of its log line.
type EventKind string

// The custody event kinds, in the order of docs/spec.md §5.
const (
	LeaseAcquired   EventKind = "lease.acquired"
	LeaseContended  EventKind = "lease.contended" // logged at debug
	LeaseRenewed    EventKind = "lease.renewed"   // logged at debug
	LeaseLost       EventKind = "lease.lost"
	LeaseReleased   EventKind = "lease.released"
	WorkerStarted   EventKind = "worker.started"
	WorkerStopped   EventKind = "worker.stopped"
	WorkerFailed    EventKind = "worker.failed"
	WorkerRestarted EventKind = "worker.restarted"
	// WorkerStuck: a worker ordered to stop did not stop within
	// WorkerStopTimeout; the LeaseActor moved on without it.
	WorkerStuck EventKind = "worker.stuck"
	// LeaseYielded: the holder gives the lease up because its worker is
	// unhealthy while a contender reports healthy.
	LeaseYielded EventKind = "lease.yielded"
)

// EventKinds lists every kind.
var EventKinds = []EventKind{LeaseAcquired, LeaseContended, LeaseRenewed, LeaseLost,
	LeaseReleased, WorkerStarted, WorkerStopped, WorkerFailed, WorkerRestarted,
	WorkerStuck, LeaseYielded}

// Reasons carried by lease.lost, lease.released and lease.acquired.
const (
	// ReasonSuperseded: the row no longer carries the grant (a renewal or
	// a fenced write matched nothing): another instance holds it.
	ReasonSuperseded = "superseded"
	// ReasonBlackout: no renewal succeeded within renew_deadline while a
	// call was unanswered (the database unreachable or hung).
	ReasonBlackout = "blackout"
	// ReasonError: no renewal succeeded within renew_deadline and the last
	// answer was an error, or a renewal's error ends custody at once.
	ReasonError        = "error"
	ReasonShutdown     = "shutdown"
	ReasonWorkerFailed = "worker-failed"
	// ReasonStaleGrant: a grant of this process that no worker uses, handed
	// back at once (see doc.go, Contending). On lease.acquired it announces
	// such a grant no earlier event did; on lease.contended it says the row
	// holds one of this very process, not another instance's grant.
	ReasonStaleGrant = "stale-grant"
	ReasonYielded    = "yielded"
)

// Event is one custody event, published on the actor system's
// EventStream. Lease is the lease name, or for an unleased worker its
// worker name; Fence is 0 where no lease applies.
type Event struct {
	Kind     EventKind
	Lease    string
	Instance string
	Fence    int64
	Reason   string
	// Holder and TimeLeft are, for lease.contended, who holds the lease
	// and how long its grant has left on the database's clock.
	Holder   string
	TimeLeft time.Duration
	// Attempt counts restarts, for worker.restarted.
	Attempt int
	Err     error
	// At is when it happened (wall clock): for lease.acquired when the
	// acquire returned, for lease.released when the release began (before
	// it committed, so it precedes any successor's grant), otherwise when
	// the LeaseActor published it.
	At time.Time
}
