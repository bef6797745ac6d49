// Package events defines the custody events of docs/spec.md §5. They are published
// on the actor system's EventStream by the LeaseActors, which own custody
// (an unleased worker's LeaseActor grants itself custody with fence 0),
// and logged as JSON lines by the system's subscriber.
package events

import (
	"time"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/rs/zerolog"
)

// Kind is the value of the "event" field in the log line.
type Kind string

// The custody event kinds (docs/spec.md §5).
const (
	LeaseAcquired   Kind = "lease.acquired"
	LeaseContended  Kind = "lease.contended" // logged at debug
	LeaseRenewed    Kind = "lease.renewed"   // logged at debug
	LeaseLost       Kind = "lease.lost"
	LeaseReleased   Kind = "lease.released"
	WorkerStarted   Kind = "worker.started"
	WorkerStopped   Kind = "worker.stopped"
	WorkerFailed    Kind = "worker.failed"
	WorkerRestarted Kind = "worker.restarted"
	// WorkerStuck: a worker ordered to stop did not stop within the
	// LeaseActor's bound; the LeaseActor moves on without it (see
	// actors/lease/doc.go).
	WorkerStuck Kind = "worker.stuck"
	// LeaseYielded: the holder released the lease because its worker
	// reported itself unhealthy while a contender reported healthy.
	LeaseYielded Kind = "lease.yielded"
)

// Kinds lists every kind, in the order of docs/spec.md §5.
var Kinds = []Kind{LeaseAcquired, LeaseContended, LeaseRenewed, LeaseLost,
	LeaseReleased, WorkerStarted, WorkerStopped, WorkerFailed, WorkerRestarted,
	WorkerStuck, LeaseYielded}

// Reasons carried by lease.lost (docs/spec.md §5) and by lease.released.
const (
	// ReasonSuperseded: a renewal (or a fenced write) matched no row: another
	// instance holds the lease now.
	ReasonSuperseded = "superseded"
	// ReasonBlackout: no renewal succeeded within renew_deadline and a call
	// was still unanswered (database unreachable or hung).
	ReasonBlackout = "blackout"
	// ReasonError: no renewal succeeded within renew_deadline and the last
	// attempt returned an error.
	ReasonError = "error"
	// ReasonShutdown: released because the process is stopping.
	ReasonShutdown = "shutdown"
	// ReasonWorkerFailed: released because the worker failed too often.
	ReasonWorkerFailed = "worker-failed"
	// ReasonStaleGrant: a grant that arrived too late to trust (an acquire
	// or renewal that landed after the LeaseActor stopped waiting for it),
	// handed back at once. On lease.released it ends such a grant; on
	// lease.acquired it marks the late grant itself, which no worker used;
	// on lease.contended it says the row holds such a grant of this very
	// process (its holder is this instance), not another instance's.
	ReasonStaleGrant = "stale-grant"
	// ReasonYielded: released to a healthier contender (lease.yielded
	// came first).
	ReasonYielded = "yielded"
	// ReasonActorRestarted: released by a LeaseActor restarted after its
	// own failure, for the grant its previous incarnation held.
	ReasonActorRestarted = "actor-restarted"
	// ReasonHandedOver: on lease.acquired, a grant the former holder
	// handed to this instance (leasestore.Store.Transfer) rather than one
	// it acquired. (The former holder's lease.released keeps the reason
	// it released for, shutdown or yielded, and names the successor as
	// its holder.)
	ReasonHandedOver = "handed-over"
)

// Custody is one custody event. Lease is the lease name, or for an unleased
// worker its worker name; Fence is 0 where no lease applies.
type Custody struct {
	Kind     Kind
	Lease    string
	Instance string
	Fence    int64
	Reason   string
	// Holder is, for lease.contended, the instance that holds the lease;
	// for lease.released, the contender it was handed to (a handover,
	// leasestore.Store.Transfer), "" for a release in place.
	Holder string
	// TimeLeft is, for lease.contended, how long the current grant has left
	// on the database's clock.
	TimeLeft time.Duration
	// Attempt counts restarts, for worker.restarted.
	Attempt int
	// Err is the cause, where there is one.
	Err error
	// At is when the event happened (wall clock): for lease.acquired, when
	// the acquire returned (after it committed); for lease.released, when
	// the release began (before it committed), so on one host's clock a
	// release's At precedes its successor's grant's even when the
	// successor's line is written first or the releasing goroutine is
	// descheduled as its statement returns (it was stamped at the return
	// once, and a standing-by successor's grant was then stamped up to a
	// millisecond before it); for the others, when the LeaseActor
	// published it. The log line's "time" is when it was written,
	// normally within microseconds.
	At time.Time
}

// AtFormat is the layout of the "at" field: RFC 3339 with microseconds, UTC.
const AtFormat = "2006-01-02T15:04:05.000000Z07:00"

// Level is the log level docs/spec.md §5 gives the event.
func (e Custody) Level() zerolog.Level {
	switch e.Kind {
	case LeaseContended, LeaseRenewed:
		return zerolog.DebugLevel
	case LeaseLost, WorkerFailed, WorkerStuck, WorkerRestarted:
		// A restart follows a failure; its line carries the error (a
		// batch the database refused whole: disk full, I/O error).
		return zerolog.WarnLevel
	default:
		return zerolog.InfoLevel
	}
}

// messages are the "msg" of each kind's log line: every line the process
// writes has time, level and msg (README Operations); "event" stays the
// field to filter on.
var messages = map[Kind]string{
	LeaseAcquired:   "lease acquired",
	LeaseContended:  "lease held by another instance",
	LeaseRenewed:    "lease renewed",
	LeaseLost:       "lease lost: worker stopped",
	LeaseReleased:   "lease released",
	WorkerStarted:   "worker started",
	WorkerStopped:   "worker stopped",
	WorkerFailed:    "worker failed",
	WorkerRestarted: "worker restarted",
	WorkerStuck:     "worker did not stop in time: moving on without it",
	LeaseYielded:    "lease yielded to a healthier contender",
}

// Message is the short sentence logged as "msg" for the event; a kind
// this version does not know is logged as its own name.
func (e Custody) Message() string {
	if m, ok := messages[e.Kind]; ok {
		return m
	}
	return string(e.Kind)
}

// Log writes the event as one JSON line with the docs/spec.md §5 fields, "msg"
// (Message), and "at" (AtFormat) when At is set.
func (e Custody) Log(l zerolog.Logger) {
	ev := l.WithLevel(e.Level()).
		Str("event", string(e.Kind)).
		Str("lease", e.Lease).
		Str("instance", e.Instance)
	if !e.At.IsZero() {
		// "time" is when the line was written, by a relay goroutine that may
		// run a few milliseconds behind; "at" is when custody changed, which
		// is what orders events across instances.
		ev = ev.Str("at", e.At.UTC().Format(AtFormat))
	}
	if e.Fence != 0 {
		ev = ev.Int64("fence", e.Fence)
	}
	if e.Reason != "" {
		ev = ev.Str("reason", e.Reason)
	}
	if e.Holder != "" {
		ev = ev.Str("holder", e.Holder)
	}
	if e.Kind == LeaseContended {
		ev = ev.Int64("time_left_ms", e.TimeLeft.Milliseconds())
	}
	if e.Attempt != 0 {
		ev = ev.Int("attempt", e.Attempt)
	}
	if e.Err != nil {
		ev = ev.Str("error", logval.Err(e.Err))
	}
	ev.Msg(e.Message())
}
