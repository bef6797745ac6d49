package consumer

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/synth"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/webhooks"
)

// logPositionWrites records every committed write of the position, one
// row per transaction that moved it (rolled-back writes leave none).
func logPositionWrites(t *testing.T, db *database.DB) {
	t.Helper()
	for _, q := range []string{
		`CREATE TABLE position_log (n INTEGER PRIMARY KEY AUTOINCREMENT, seq INTEGER NOT NULL)`,
		`CREATE TRIGGER log_position_insert AFTER INSERT ON jetstream_cursor BEGIN INSERT INTO position_log (seq) VALUES (NEW.seq); END`,
		`CREATE TRIGGER log_position_update AFTER UPDATE ON jetstream_cursor BEGIN INSERT INTO position_log (seq) VALUES (NEW.seq); END`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
}

func loggedPositions(t *testing.T, db *database.DB) []int64 {
	t.Helper()
	rows, err := db.Query(`SELECT seq FROM position_log ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// A batch whose apply outlasts jetstream.commit_budget is committed in
// several transactions, each ending at a chunk boundary with the position
// of its last event (contiguous), the batch's MaxSeq only with the last;
// the data, deliveries and final position are those of one transaction.
// The budget here is 1 ns, so every transaction passes it after its first
// chunk whatever the machine's speed: the count of commits is exact. The
// old code committed the batch in one transaction, however long it took.
func TestABatchOverTheCommitBudgetCommitsInBoundedTransactionsWithContiguousPositions(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refuse_one_delivery=%v", refuse), func(t *testing.T) {
			testCommitBudget(t, refuse)
		})
	}
}

func testCommitBudget(t *testing.T, refuse bool) {
	const n, trailing = 300, 5
	db := testsupport.OpenDB(t)
	events, exp := generate(61, n)
	if len(events) != n {
		t.Fatalf("%d events generated, want %d", len(events), n)
	}
	for i := range events {
		events[i].Seq = int64(i + 1)
	}
	subscribeAll(t, db, exp)
	logPositionWrites(t, db)
	sys := testsupport.NewActorSystem(t)
	disp := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	defer func() { _ = sys.Root.StopFuture(disp).Wait() }()

	enqueue := webhooks.EnqueueTx
	var bad string
	refused := errors.New("failed to execute query INSERT INTO webhook_deliveries\nerror code = 2: Error executing statement: SQLite failure: `outbox refuses`")
	if refuse {
		// A delivery past the first transaction's chunk fails its
		// transaction: the rest of the batch (never what committed
		// before) goes event by event.
		at := -1
		keys := map[string]bool{}
		for _, k := range exp.PushEventKeys {
			keys[k] = true
		}
		for i := n - 1; i >= 0 && at < 0; i-- {
			ev := events[i]
			if ev.Commit == nil || ev.Commit.Collection != processor.CollectionManifest || ev.Commit.Operation != jetstream.OpCreate {
				continue
			}
			var m struct{ Repository, Digest string }
			if err := json.Unmarshal(ev.Commit.Record, &m); err != nil {
				t.Fatal(err)
			}
			if k := "push:" + ev.DID + "/" + m.Repository + "@" + m.Digest; keys[k] {
				bad, at = k, i
			}
		}
		if at < lockChunk {
			t.Fatalf("the last push is event %d, in the first chunk: the test proves nothing", at)
		}
		enqueue = func(ctx context.Context, tx *sql.Tx, pushes []webhooks.Push) (int, error) {
			for _, p := range pushes {
				if p.EventKey == bad {
					return 0, refused
				}
			}
			return webhooks.EnqueueTx(ctx, tx, pushes)
		}
	}
	c := newConsumer(Options{
		DB: db, Custody: acquire(t, db, "me"), Processor: processor.New(processor.Options{Log: zerolog.Nop()}),
		Jetstream: config.Jetstream{CommitBudget: time.Nanosecond}, enqueue: enqueue, Log: zerolog.Nop(),
	})
	c.root, c.disp = sys.Root, disp
	b := jetstream.Batch{URL: "wss://js.example/xrpc/network.bsky.jetstream.subscribeEvents", MaxSeq: n + trailing, Events: events}
	if err := c.handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}

	got := loggedPositions(t, db)
	if !refuse {
		var want []int64
		for end := lockChunk; end < n; end += lockChunk {
			want = append(want, int64(end))
		}
		want = append(want, n+trailing)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("committed positions %v, want one transaction per %d events ending %v", got, lockChunk, want)
		}
		for _, d := range synth.Diff(context.Background(), db.DB, exp) {
			t.Error(d)
		}
	} else if len(got) < 2 || got[0] != lockChunk {
		t.Fatalf("committed positions %v: the first chunk did not commit on its own", got)
	}
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("position moved from %d to %d: not contiguous (%v)", got[i-1], got[i], got)
		}
	}
	if got[len(got)-1] != n+trailing {
		t.Fatalf("final position %d, want the batch's MaxSeq %d", got[len(got)-1], n+trailing)
	}
	if c.pos.Seq != n+trailing || c.pos.Host != "js.example" {
		t.Fatalf("in-memory position %+v, want js.example seq %d", c.pos, n+trailing)
	}
	want := len(exp.PushEventKeys)
	if refuse {
		want--
	}
	if keys := deliveryKeys(t, db); len(keys) != want {
		t.Fatalf("%d event keys delivered, want %d", len(keys), want)
	}
}
