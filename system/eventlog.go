package system

import (
	"sync"

	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/events"
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
	ch      chan events.Custody
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	log     zerolog.Logger
	waiting map[string]contendedGrant // lease -> the grant last logged as waited for (run's goroutine only)
	count   *prometheus.CounterVec
	dropped prometheus.Counter
}

func newEventLog(es *eventstream.EventStream, log zerolog.Logger, count *prometheus.CounterVec, dropped prometheus.Counter) *eventLog {
	l := &eventLog{es: es, ch: make(chan events.Custody, eventRelayBuffer), waiting: map[string]contendedGrant{},
		stop: make(chan struct{}), done: make(chan struct{}), log: log, count: count, dropped: dropped}
	l.sub = es.Subscribe(func(evt any) {
		e, ok := evt.(events.Custody)
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
func (l *eventLog) write(e events.Custody) {
	e.Log(l.log)
	switch e.Kind {
	case events.LeaseContended:
		g := contendedGrant{holder: e.Holder, fence: e.Fence}
		if e.TimeLeft <= 0 || l.waiting[e.Lease] == g {
			return
		}
		l.waiting[e.Lease] = g
		msg := "lease held by another instance: waiting for its release or for its grant to run out"
		if e.Reason == events.ReasonStaleGrant {
			msg = "lease held by an unused grant of this instance's own (an acquire that committed after it was given up): handing it back, then acquiring"
		}
		l.log.Info().Str("lease", e.Lease).Str("instance", e.Instance).Str("holder", e.Holder).Int64("fence", e.Fence).
			Int64("time_left_ms", e.TimeLeft.Milliseconds()).Msg(msg)
	case events.LeaseAcquired:
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
