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
	count   *prometheus.CounterVec
	dropped prometheus.Counter
}

func newEventLog(es *eventstream.EventStream, log zerolog.Logger, count *prometheus.CounterVec, dropped prometheus.Counter) *eventLog {
	l := &eventLog{es: es, ch: make(chan events.Custody, eventRelayBuffer),
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
			e.Log(l.log)
		case <-l.stop:
			for {
				select {
				case e := <-l.ch:
					e.Log(l.log)
				default:
					return
				}
			}
		}
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
