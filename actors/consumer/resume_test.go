package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/webhooks"
)

func TestAConnectionThatDropsFarMoreOftenThanTheRewindWindowStillReachesTheEnd(t *testing.T) {
	// 2 s of rewind is about 1300 synthetic events; every connection
	// delivers 40. Rewinding on each reconnect would replay the same
	// stretch forever.
	f := newFixture(t, 55, 3000, jetstream.ReplayOptions{DropAfter: 40})
	db := testsupport.OpenDB(t)
	f.subscribe(t, db)
	sys := testsupport.NewActorSystem(t)
	o := f.options(db, acquire(t, db, "me"))
	if window := o.Jetstream.Rewind; window < 2*time.Second {
		t.Fatalf("rewind %v: the test needs a window much wider than a connection", window)
	}
	pid := sys.Root.Spawn(NewProps(o))
	testsupport.Eventually(t, "the cursor to reach the end of the stream", func() bool { return cursorAt(db) == f.exp.MaxTimeUS })
	testsupport.Eventually(t, "every webhook delivery", func() bool {
		var pending int
		_ = db.QueryRow(`SELECT COUNT(*) FROM webhook_deliveries WHERE status <> 'delivered'`).Scan(&pending)
		return pending == 0
	})
	stop(t, sys, pid)
	if n := f.srv.Connections(); n < 50 {
		t.Fatalf("%d connections: the server did not drop as often as the test needs", n)
	}
	checkExpected(t, db, f)
}

// sink is an actor that ignores what it is sent (the StatsCache and the
// dispatcher, for tests that call handle directly).
type sink struct{}

func (sink) Receive(actor.Context) {}

func TestOnlyAReconnectToTheInstanceTheCursorCameFromSkipsTheRewind(t *testing.T) {
	db := testsupport.OpenDB(t)
	events, _ := generate(56, 300)
	c := acquire(t, db, "me")
	const rewind = 2 * time.Second
	// A previous incarnation committed up to event 100, from an instance
	// this one does not know.
	stored := events[100].TimeUS
	if _, err := db.Exec(`INSERT INTO jetstream_cursor (id, time_us, updated_at, fence) VALUES (1, ?, 0, ?)`, stored, c.Fence); err != nil {
		t.Fatal(err)
	}
	sys := testsupport.NewActorSystem(t)
	cons := newConsumer(Options{DB: db, Custody: c, Jetstream: config.Jetstream{Rewind: rewind}, Log: zerolog.Nop(),
		Processor: processor.New(processor.Options{Log: zerolog.Nop()}), enqueue: webhooks.EnqueueTx})
	cons.root = sys.Root
	cons.stats = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink{} }))
	cons.disp = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink{} }))
	cons.cursor.Store(stored)
	const a, b = "ws://a.example/subscribe", "ws://b.example/subscribe"
	// Another host resumes from the shared time (commit rev / relay time)
	// of the last committed batch, less the rewind: time_us is the last
	// host's own clock.
	switchTo := func(batch []jetstream.Event) int64 {
		t := sharedTime(batch)
		if t == 0 {
			t = cons.cursor.Load()
		}
		return t - rewind.Microseconds()
	}

	if got := cons.resumeAt(a); got != stored-rewind.Microseconds() {
		t.Fatalf("first connect: cursor %d, want the stored cursor minus the rewind (%d)", got, stored-rewind.Microseconds())
	}
	ctx := context.Background()
	if err := cons.handle(ctx, jetstream.Batch{URL: a, Events: events[90:150]}); err != nil {
		t.Fatal(err)
	}
	// A replay (its events far behind the clock) is in time_us order: no
	// rewind on the same instance.
	if got := cons.resumeAt(a); got != events[149].TimeUS {
		t.Fatalf("reconnect to the same instance: cursor %d, want the last committed event's %d", got, events[149].TimeUS)
	}
	if got, want := cons.resumeAt(b), switchTo(events[90:150]); got != want {
		t.Fatalf("failover to another instance: cursor %d, want the batch's shared time minus the rewind (%d)", got, want)
	}
	if err := cons.handle(ctx, jetstream.Batch{URL: b, Events: events[140:200]}); err != nil {
		t.Fatal(err)
	}
	if got := cons.resumeAt(b); got != events[199].TimeUS {
		t.Fatalf("reconnect to the new instance: cursor %d, want %d", got, events[199].TimeUS)
	}
	if got, want := cons.resumeAt(a), switchTo(events[140:200]); got != want {
		t.Fatalf("back to the first instance: cursor %d, want a rewind from the shared time (%d)", got, want)
	}
	// A replay behind the stored cursor (after a rewind) resumes where the
	// replay got to on that instance, not at the stored cursor.
	cons.resumeURL, cons.resumeUS = "", 0
	if err := cons.handle(ctx, jetstream.Batch{URL: a, Events: events[150:170]}); err != nil {
		t.Fatal(err)
	}
	if got := cons.resumeAt(a); got != events[169].TimeUS {
		t.Fatalf("reconnect during a rewound replay: cursor %d, want where the replay got to (%d)", got, events[169].TimeUS)
	}
}

// On the live tail (events stamped moments ago, out of time_us order) a
// same-URL reconnect rewinds by the reorder window, but never before where
// the last connection began to reach new events, so each connection that
// reaches them moves the resume point on.
func TestALiveTailReconnectRewindsByTheReorderWindowAndStillMovesOn(t *testing.T) {
	db := testsupport.OpenDB(t)
	events, _ := generate(57, 120)
	shift := time.Now().Add(-3*time.Second).UnixMicro() - events[0].TimeUS
	for i := range events {
		events[i].TimeUS += shift
	}
	c := acquire(t, db, "me")
	sys := testsupport.NewActorSystem(t)
	cons := newConsumer(Options{DB: db, Custody: c, Jetstream: config.Jetstream{Rewind: 5 * time.Second}, Log: zerolog.Nop(),
		Processor: processor.New(processor.Options{Log: zerolog.Nop()}), enqueue: webhooks.EnqueueTx})
	cons.root = sys.Root
	cons.stats = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink{} }))
	cons.disp = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink{} }))
	const a = "ws://a.example/subscribe"
	ctx := context.Background()
	if got := cons.resumeAt(a); got != 0 {
		t.Fatalf("first connect with nothing committed: cursor %d, want the live tail (0)", got)
	}
	if err := cons.handle(ctx, jetstream.Batch{URL: a, Events: events[:60]}); err != nil {
		t.Fatal(err)
	}
	first := events[59].TimeUS - reorderWindow.Microseconds()
	if got := cons.resumeAt(a); got != first {
		t.Fatalf("reconnect after a live connection: cursor %d, want the last event's minus the reorder window (%d)", got, first)
	}
	// The next connection repeats what it had and brings a few new events
	// (less than a window's worth): resume where it began to break new
	// ground, not a window before its newest event.
	if err := cons.handle(ctx, jetstream.Batch{URL: a, Events: events[50:65]}); err != nil {
		t.Fatal(err)
	}
	want := max(events[64].TimeUS-reorderWindow.Microseconds(), events[59].TimeUS)
	if got := cons.resumeAt(a); got != want || got <= first {
		t.Fatalf("cursor %d, want %d (past the previous resume point %d)", got, want, first)
	}
}
