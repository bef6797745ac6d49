package consumer

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/synth"
	"github.com/atcr-io/appview/internal/webhooks"
)

func acquire(t testing.TB, db *database.DB, holder string) fence.Custody {
	t.Helper()
	return testsupport.Custody(t, db, LeaseName, holder, time.Minute)
}

func generate(seed uint64, n int) ([]jetstream.Event, *synth.Expected) {
	g := synth.NewGenerator(synth.Options{Seed: seed, Events: n})
	var evs []jetstream.Event
	for {
		ev, ok := g.Next()
		if !ok {
			return evs, g.Expected()
		}
		evs = append(evs, ev)
	}
}

// subscribeAll registers one push webhook per user DID of the stream.
func subscribeAll(t testing.TB, db *database.DB, exp *synth.Expected) {
	t.Helper()
	for key := range exp.Tables["users"] {
		if _, err := db.Exec(`INSERT INTO webhooks (did, url, created_at) VALUES (?, 'https://hooks.example/x', 0)`, key); err != nil {
			t.Fatal(err)
		}
	}
}

func deliveryKeys(t testing.TB, db *database.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT DISTINCT event_key FROM webhook_deliveries ORDER BY event_key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		_ = rows.Scan(&k)
		out = append(out, k)
	}
	return out
}

func TestBatchesCommitRecordsDeliveriesAndCursorTogetherAndReplaysAddNothing(t *testing.T) {
	db := testsupport.OpenDB(t)
	events, exp := generate(31, 3000)
	subscribeAll(t, db, exp)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	total := 0
	for pass := range 2 {
		for i := 0; i < len(events); i += 150 {
			out, err := commitBatch(context.Background(), db, c, p, webhooks.EnqueueTx, events[i:min(i+150, len(events))])
			if err != nil {
				t.Fatal(err)
			}
			if pass == 1 && out.enqueued != 0 {
				t.Fatalf("replay enqueued %d deliveries", out.enqueued)
			}
			total += out.enqueued
		}
	}
	for _, d := range synth.Diff(context.Background(), db.DB, exp) {
		t.Error(d)
	}
	got := deliveryKeys(t, db)
	if strings.Join(got, "\n") != strings.Join(exp.PushEventKeys, "\n") {
		t.Fatalf("deliveries for %d event keys, want %d", len(got), len(exp.PushEventKeys))
	}
	var perKey int
	if err := db.QueryRow(`SELECT COUNT(*) FROM webhook_deliveries`).Scan(&perKey); err != nil || perKey != total {
		t.Fatalf("%d delivery rows, enqueued %d (%v)", perKey, total, err)
	}
	cur, ok, err := LoadCursor(context.Background(), db)
	if err != nil || !ok || cur != exp.MaxTimeUS {
		t.Fatalf("cursor %d %v %v, want %d", cur, ok, err, exp.MaxTimeUS)
	}
}

func TestACursorNeverMovesBackOnARewoundReplay(t *testing.T) {
	db := testsupport.OpenDB(t)
	events, _ := generate(32, 600)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	if _, err := commitBatch(context.Background(), db, c, p, webhooks.EnqueueTx, events); err != nil {
		t.Fatal(err)
	}
	if _, err := commitBatch(context.Background(), db, c, p, webhooks.EnqueueTx, events[:100]); err != nil {
		t.Fatal(err)
	}
	cur, _, _ := LoadCursor(context.Background(), db)
	if cur != events[len(events)-1].TimeUS {
		t.Fatalf("cursor %d after a rewound replay, want %d", cur, events[len(events)-1].TimeUS)
	}
}

func TestASupersededConsumerCommitsNothing(t *testing.T) {
	db := testsupport.OpenDB(t)
	events, exp := generate(33, 800)
	subscribeAll(t, db, exp)
	old := acquire(t, db, "a")
	testsupport.Release(t, db, old)
	acquire(t, db, "b")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	_, err := commitBatch(context.Background(), db, old, p, webhooks.EnqueueTx, events)
	if !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("commit under a superseded custody: %v", err)
	}
	for _, table := range []string{"manifests", "tags", "repository_stats", "webhook_deliveries", "jetstream_cursor"} {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s has %d rows (%v)", table, n, err)
		}
	}
}

func TestAFailedEnqueueRollsBackTheWholeBatch(t *testing.T) {
	db := testsupport.OpenDB(t)
	events, _ := generate(34, 500)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	boom := errors.New("outbox unavailable")
	_, err := commitBatch(context.Background(), db, c, p, func(context.Context, *sql.Tx, []webhooks.Push) (int, error) {
		return 0, boom
	}, events)
	if !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	if _, ok, _ := LoadCursor(context.Background(), db); ok {
		t.Fatal("the cursor advanced past a batch that did not commit")
	}
	var n int
	_ = db.QueryRow(`SELECT COUNT(*) FROM manifests`).Scan(&n)
	if n != 0 {
		t.Fatalf("%d manifests committed without their deliveries", n)
	}
}
