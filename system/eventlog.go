package system

import (
	"sync"

	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// eventRelayBuffer is how many custody events may wait for the log writer.
// Custody events are rare (a handful per lease per change of custody, plus
// debug renewals), so a full buffer means stderr is blocked; events are
// then dropped and counted rather than stalling a LeaseActor.
const eventRelayBuffer = 4096

// eventLog subscribes to the EventStream and logs custody events as JSON
// lines from its own goroutine: EventStream handlers run on the
// publisher's goroutine, and the publisher is a LeaseActor that must never
// wait on stderr.
type eventLog struct {
	es      *eventstream.EventStream
	sub     *eventstream.Subscription
	ch      chan lease.Event
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	log     zerolog.Logger
	waiting map[string]contendedGrant // lease -> the grant last logged as waited for (run's goroutine only)
	count   *prometheus.CounterVec
	dropped prometheus.Counter
}

func newEventLog(es *eventstream.EventStream, log zerolog.Logger, count *prometheus.CounterVec, dropped prometheus.Counter) *eventLog {
	l := &eventLog{es: es, ch: make(chan lease.Event, eventRelayBuffer), waiting: map[string]contendedGrant{},
		stop: make(chan struct{}), done: make(chan struct{}), log: log, count: count, dropped: dropped}
	l.sub = es.Subscribe(func(evt any) {
		e, ok := evt.(lease.Event)
		if !ok {
			return
		}
		l.count.WithLabelValues(string(e.Kind)).Inc()
		select {
		case l.ch <- e:
		default:
			l.dropped.Inc()
		}
	})
	go l.run()
	return l
}

func (l *eventLog) run() {
	defer close(l.done)
	for {
		select {
		case e := <-l.ch:
			l.write(e)
		case <-l.stop:
			for {
				select {
				case e := <-l.ch:
					l.write(e)
				default:
					return
				}
			}
		}
	}
}

// contendedGrant is a grant another instance holds, as a contender saw it.
type contendedGrant struct {
	holder string
	fence  int64
}

// write logs e. lease.contended is a debug line (docs/spec.md §5) on
// every attempt; the first one of each grant waited for (a new holder or
// fence) is also said at info, with how long the grant has left, so an
// operator who restarts an instance after a crash sees why its workers
// do not start for up to a TTL: the crashed process's grants run out
// first.
func (l *eventLog) write(e lease.Event) {
	logEvent(l.log, e)
	switch e.Kind {
	case lease.LeaseContended:
		g := contendedGrant{holder: e.Holder, fence: e.Fence}
		if e.TimeLeft <= 0 || l.waiting[e.Lease] == g {
			return
		}
		l.waiting[e.Lease] = g
		msg := "lease held by another instance: waiting for its release or for its grant to run out"
		if e.Reason == lease.ReasonStaleGrant {
			msg = "lease held by an unused grant of this instance's own (an acquire that committed after it was given up): handing it back, then acquiring"
		}
		l.log.Info().Str("lease", e.Lease).Str("instance", e.Instance).Str("holder", e.Holder).Int64("fence", e.Fence).
			Int64("time_left_ms", e.TimeLeft.Milliseconds()).Msg(msg)
	case lease.LeaseAcquired:
		delete(l.waiting, e.Lease)
	}
}

// Close unsubscribes, logs what is buffered and returns.
func (l *eventLog) Close() {
	l.once.Do(func() {
		l.es.Unsubscribe(l.sub)
		close(l.stop)
		<-l.done
	})
}

// AtFormat is the layout of the "at" field: RFC 3339 with microseconds, UTC.
const AtFormat = "2006-01-02T15:04:05.000000Z07:00"

// eventLevel is the log level docs/spec.md §5 gives the event.
func eventLevel(e lease.Event) zerolog.Level {
	switch e.Kind {
	case lease.LeaseContended, lease.LeaseRenewed:
		return zerolog.DebugLevel
	case lease.LeaseLost, lease.WorkerFailed, lease.WorkerStuck, lease.WorkerRestarted:
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
var eventMessages = map[lease.EventKind]string{
	lease.LeaseAcquired:   "lease acquired",
	lease.LeaseContended:  "lease held by another instance",
	lease.LeaseRenewed:    "lease renewed",
	lease.LeaseLost:       "lease lost: worker stopped",
	lease.LeaseReleased:   "lease released",
	lease.WorkerStarted:   "worker started",
	lease.WorkerStopped:   "worker stopped",
	lease.WorkerFailed:    "worker failed",
	lease.WorkerRestarted: "worker restarted",
	lease.WorkerStuck:     "worker did not stop in time: moving on without it",
	lease.LeaseYielded:    "lease yielded to a healthier contender",
}

// eventMessage is the short sentence logged as "msg" for the event; a
// kind this version does not know is logged as its own name.
func eventMessage(e lease.Event) string {
	if m, ok := eventMessages[e.Kind]; ok {
		return m
	}
	return string(e.Kind)
}

// logEvent writes the event as one JSON line with the docs/spec.md §5
// fields, "msg" (eventMessage), and "at" (AtFormat) when At is set.
func logEvent(l zerolog.Logger, e lease.Event) {
	ev := l.WithLevel(eventLevel(e)).
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
	if e.Kind == lease.LeaseContended {
		ev = ev.Int64("time_left_ms", e.TimeLeft.Milliseconds())
	}
	if e.Attempt != 0 {
		ev = ev.Int("attempt", e.Attempt)
	}
	if e.Err != nil {
		ev = ev.Str("error", logval.Err(e.Err))
	}
	ev.Msg(eventMessage(e))
}
