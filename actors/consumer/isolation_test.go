package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/webhooks"
)

// victimStats are two io.atcr.hold.stats events, from two holds, about one
// repository of did:plc:victim, before synth's first time_us.
var victimStats = []string{
	`{"did":"did:web:holdA.example","time_us":1740000000000100,"kind":"commit","commit":{"rev":"3lrnqkdzhdq22","operation":"create","collection":"io.atcr.hold.stats","rkey":"aaaa","record":{"$type":"io.atcr.hold.stats","ownerDid":"did:plc:victim","repository":"app","pullCount":3,"pushCount":5,"updatedAt":"2025-06-15T15:06:39.345Z"}}}`,
	`{"did":"did:web:holdB.example","time_us":1740000000000200,"kind":"commit","commit":{"rev":"3lrnqkdzhdq22","operation":"create","collection":"io.atcr.hold.stats","rkey":"bbbb","record":{"$type":"io.atcr.hold.stats","ownerDid":"did:plc:victim","repository":"app","pullCount":4,"pushCount":5,"updatedAt":"2025-06-15T15:06:39.345Z"}}}`,
}

// refuseVictimAggregate makes the repository_stats refresh of
// did:plc:victim fail, as the SUM overflow did: a failure outside the
// processor's per-event savepoints, so the whole batch transaction fails.
func refuseVictimAggregate(t *testing.T, db *database.DB) {
	t.Helper()
	if _, err := db.Exec(`CREATE TRIGGER refuse_victim BEFORE INSERT ON repository_stats WHEN NEW.did = 'did:plc:victim'
BEGIN SELECT RAISE(ABORT, 'integer overflow'); END`); err != nil {
		t.Fatal(err)
	}
}

func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

func TestABatchFailingOutsideTheEventSavepointsIsRetriedEventByEventAndTheStreamGoesOn(t *testing.T) {
	f := newFixtureAfter(t, 51, 1500, jetstream.ReplayOptions{}, victimStats...)
	db := testsupport.OpenDB(t)
	f.subscribe(t, db)
	refuseVictimAggregate(t, db)
	sys := testsupport.NewActorSystem(t)
	reg := prometheus.NewRegistry()
	pm, err := processor.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testsupport.LockedBuffer{}
	o := f.options(db, acquire(t, db, "me"))
	o.Log = zerolog.New(logs)
	o.Processor = processor.New(processor.Options{Log: zerolog.New(logs), Metrics: pm})
	reasons := make(chan any, 4)
	strategy := actor.NewOneForOneStrategy(0, time.Second, func(reason any) actor.Directive {
		reasons <- reason
		return actor.StopDirective
	})
	p := &parent{props: NewProps(o), reasons: reasons}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return p }, actor.WithSupervisor(strategy)))
	defer stop(t, sys, pid)

	testsupport.Eventually(t, "the cursor to reach the end of the stream", func() bool {
		select {
		case r := <-reasons:
			t.Fatalf("the consumer failed instead of isolating the bad events: %v", r)
		default:
		}
		return cursorAt(db) == f.exp.MaxTimeUS
	})
	// Everything but the two events whose aggregate the database refuses
	// is there, exactly as the stream says.
	checkExpected(t, db, f)
	if got := counterValue(t, reg, "appview_processor_skipped_total", "reason", processor.ReasonDatabase); got != 2 {
		t.Errorf("db_error skips = %v, want the 2 victim events", got)
	}
	if !strings.Contains(logs.String(), "retrying it event by event") || !strings.Contains(logs.String(), `"reason":"db_error"`) {
		t.Errorf("the retry and the skips are not logged:\n%s", logs.String())
	}
}

func TestEventByEventTheRestOfABatchCommitsAndTheCursorPassesTheBadEvent(t *testing.T) {
	db := testsupport.OpenDB(t)
	events, exp := generate(52, 400)
	subscribeAll(t, db, exp)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	bad := exp.PushEventKeys[len(exp.PushEventKeys)/2]
	// The database's refusal of one row, in go-libsql's shape.
	refused := errors.New("failed to execute query INSERT INTO webhook_deliveries\nerror code = 2: Error executing statement: SQLite failure: `outbox refuses " + bad + "`")
	enqueue := func(ctx context.Context, tx *sql.Tx, pushes []webhooks.Push) (int, error) {
		for _, p := range pushes {
			if p.EventKey == bad {
				return 0, refused
			}
		}
		return webhooks.EnqueueTx(ctx, tx, pushes)
	}
	if _, err := commitBatch(context.Background(), db, c, p, enqueue, events); !errors.Is(err, refused) {
		t.Fatalf("the batch committed (%v): the test proves nothing", err)
	}
	skipped := 0
	out, err := commitEach(context.Background(), testPipeline(db, c, p, enqueue), events, func(ev *jetstream.Event, err error) {
		// Only the create that stores the refused push's manifest (a
		// stream may store one again after deleting it).
		if !errors.Is(err, refused) || ev.Commit == nil || ev.Commit.Collection != processor.CollectionManifest {
			t.Errorf("event %d skipped for %v", ev.TimeUS, err)
		}
		skipped++
	})
	if err != nil {
		t.Fatal(err)
	}
	if skipped == 0 || out.skipped != skipped {
		t.Fatalf("skipped %d events (counted %d), want the manifest whose delivery is refused", skipped, out.skipped)
	}
	if got := deliveryKeys(t, db); len(got) != len(exp.PushEventKeys)-1 || out.enqueued != len(got) {
		t.Fatalf("%d event keys delivered, %d enqueued; want every push but the refused one (%d)", len(got), out.enqueued, len(exp.PushEventKeys)-1)
	}
	if cur := cursorAt(db); cur != events[len(events)-1].TimeUS {
		t.Fatalf("cursor %d, want the last event's %d", cur, events[len(events)-1].TimeUS)
	}
}

func TestACursorThatCannotMovePastASkippedEventFailsTheConsumer(t *testing.T) {
	db := testsupport.OpenDB(t)
	events, _ := generate(53, 200)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	// The database refuses the cursor write at one event: its commit
	// fails, and so does moving the cursor past it.
	at := events[100].TimeUS
	if _, err := db.Exec(fmt.Sprintf(`CREATE TRIGGER refuse_cursor BEFORE UPDATE ON jetstream_cursor WHEN NEW.time_us = %d
BEGIN SELECT RAISE(ABORT, 'cursor refused'); END`, at)); err != nil {
		t.Fatal(err)
	}
	skips := 0
	_, err := commitEach(context.Background(), testPipeline(db, c, p, webhooks.EnqueueTx), events, func(*jetstream.Event, error) { skips++ })
	if err == nil || !strings.Contains(err.Error(), "cursor refused") {
		t.Fatalf("err %v, want the refused cursor write", err)
	}
	if skips != 1 {
		t.Fatalf("%d skips before failing, want 1", skips)
	}
	if cur := cursorAt(db); cur != events[99].TimeUS {
		t.Fatalf("cursor %d, want the last event committed before the failure (%d)", cur, events[99].TimeUS)
	}
}

func TestADatabaseFailureIsNeverSkippedEventByEvent(t *testing.T) {
	for i, failure := range []error{
		errors.New("database is locked"),
		// sqld down or restarting: go-libsql's shape of a refused connection.
		errors.New("failed to execute query INSERT INTO webhook_deliveries\nerror code = 1: Error executing statement: Hrana: `http error: `error trying to connect: tcp connect error: Connection refused (os error 111)``"),
		errors.New("failed to execute query INSERT INTO webhook_deliveries\nerror code = 1: Error executing statement: Hrana: `api error: `status=503 Service Unavailable, body=``"),
		errors.New("an error of a shape nobody has seen"),
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) { testFailureNotSkipped(t, failure) })
	}
}

func testFailureNotSkipped(t *testing.T, failure error) {
	db := testsupport.OpenDB(t)
	events, _ := generate(54, 100)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	skips := 0
	_, err := commitEach(context.Background(), testPipeline(db, c, p, func(context.Context, *sql.Tx, []webhooks.Push) (int, error) {
		return 0, failure
	}), events, func(*jetstream.Event, error) { skips++ })
	if !errors.Is(err, failure) || skips != 0 {
		t.Fatalf("err %v after %d skips, want the failure and no event skipped", err, skips)
	}
	// The events before the first new manifest committed; the cursor stops
	// short of it, so a restart retries it.
	first := -1
	for i, ev := range events {
		if ev.Commit != nil && ev.Commit.Collection == processor.CollectionManifest && ev.Commit.Operation == jetstream.OpCreate {
			first = i
			break
		}
	}
	if first < 0 {
		t.Fatalf("first manifest create at %d: the test proves nothing", first)
	}
	if cur := cursorAt(db); cur >= events[first].TimeUS {
		t.Fatalf("cursor %d moved to or past the failed event %d", cur, events[first].TimeUS)
	}
}
