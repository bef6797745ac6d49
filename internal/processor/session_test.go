package processor_test

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/synth"
	"github.com/atcr-io/appview/internal/testsupport"
)

// applySession applies events in one fenced transaction through a
// TxSession: Preload, then Apply chunk events at a time, then Finish. It
// returns the chunks' results merged.
func applySession(t testing.TB, p *processor.Processor, db *database.DB, events []jetstream.Event, chunk int) processor.Result {
	t.Helper()
	var out processor.Result
	err := fence.Fenced(context.Background(), db, unfenced, func(tx *sql.Tx) error {
		out = processor.Result{}
		s := p.BeginTx(context.Background(), tx, unfenced)
		if err := s.Preload(events); err != nil {
			return err
		}
		for i := 0; i < len(events); i += chunk {
			res, err := s.Apply(events[i:min(i+chunk, len(events))])
			if err != nil {
				return err
			}
			out.Events += res.Events
			out.Applied += res.Applied
			out.Unchanged += res.Unchanged
			for r, n := range res.Skipped {
				if out.Skipped == nil {
					out.Skipped = map[string]int{}
				}
				out.Skipped[r] += n
			}
			out.HoldStats = append(out.HoldStats, res.HoldStats...)
			out.NewManifests = append(out.NewManifests, res.NewManifests...)
			out.Rereads = append(out.Rereads, res.Rereads...)
			out.MaxTimeUS = max(out.MaxTimeUS, res.MaxTimeUS)
		}
		return s.Finish()
	})
	if err != nil {
		t.Fatalf("session: %v", err)
	}
	return out
}

// A transaction applied in chunks through one TxSession (tombstones read
// once, users rows and touched repositories carried from chunk to chunk,
// the aggregates recomputed once) leaves the database, and reports the
// outcomes, exactly as one ApplyTx of the same events does.
func TestASessionOfChunksLeavesWhatOneApplyLeaves(t *testing.T) {
	for _, seed := range []uint64{4, 5} {
		events, _ := generate(t, synth.Options{Seed: seed, Events: 1500})
		p := processor.New(processor.Options{Log: zerolog.Nop()})
		whole := testsupport.OpenDB(t)
		var want []processor.Result
		for i := 0; i < len(events); i += 100 {
			res, err := p.Apply(context.Background(), whole, unfenced, events[i:min(i+100, len(events))])
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, res)
		}
		wantDump := dump(t, whole)
		for _, chunk := range []int{1, 7, 25} {
			t.Run(fmt.Sprintf("seed%d/chunk%d", seed, chunk), func(t *testing.T) {
				db := testsupport.OpenDB(t)
				for i := 0; i < len(events); i += 100 {
					got := applySession(t, p, db, events[i:min(i+100, len(events))], chunk)
					w := want[i/100]
					if len(w.Skipped) == 0 {
						w.Skipped = nil
					}
					if !reflect.DeepEqual(got, w) {
						t.Fatalf("batch at %d: session result\n%+v\nwant\n%+v", i, got, w)
					}
				}
				if got := dump(t, db); got != wantDump {
					t.Fatalf("chunked session changed the database:\n%s", firstDifference(wantDump, got))
				}
			})
		}
	}
}

// When a chunk's fast path fails (the database refuses one of its events)
// the chunk is redone event by event from what the session knew before
// it: a users row or a tombstone the failed attempt wrote, then rolled
// back, is written again, not taken for done.
func TestAChunkRedoneEventByEventStartsFromTheSessionsStateBeforeIt(t *testing.T) {
	db := testsupport.OpenDB(t)
	if _, err := db.Exec(`CREATE TRIGGER refuse_boom BEFORE INSERT ON tags WHEN NEW.tag = 'boom'
BEGIN SELECT RAISE(ABORT, 'tag boom is refused'); END`); err != nil {
		t.Fatal(err)
	}
	const alice, bob = "did:plc:alice", "did:plc:bob"
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	// Stored before the session: a tag of bob's, deleted in chunk 2.
	if _, err := p.Apply(context.Background(), db, unfenced, []jetstream.Event{
		commit(bob, 5, "create", processor.CollectionTag, "old", tagRecord("app", "old", "sha256:0")),
	}); err != nil {
		t.Fatal(err)
	}
	events := []jetstream.Event{
		// chunk 1
		commit(alice, 10, "create", processor.CollectionTag, "t1", tagRecord("app", "one", "sha256:1")),
		// chunk 2: carol's first record ensures her users row; bob's tag
		// is deleted; then the database refuses one event.
		commit("did:plc:carol", 11, "create", processor.CollectionTag, "c1", tagRecord("app", "c", "sha256:c")),
		commit(bob, 12, "delete", processor.CollectionTag, "old", nil),
		commit(alice, 13, "create", processor.CollectionTag, "t2", tagRecord("app", "boom", "sha256:2")),
		// chunk 3: bob's tag again, from before its delete: stays deleted.
		commit(bob, 9, "create", processor.CollectionTag, "old", tagRecord("app", "old", "sha256:0")),
	}
	res := processor.Result{}
	err := fence.Fenced(context.Background(), db, unfenced, func(tx *sql.Tx) error {
		s := p.BeginTx(context.Background(), tx, unfenced)
		for _, chunk := range [][]jetstream.Event{events[:1], events[1:4], events[4:]} {
			r, err := s.Apply(chunk)
			if err != nil {
				return err
			}
			res.Applied += r.Applied
			res.Unchanged += r.Unchanged
			res.Events += r.Events
			if r.Skipped[processor.ReasonDatabase] > 0 {
				res.Skipped = r.Skipped
			}
		}
		return s.Finish()
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != 3 || res.Unchanged != 1 || res.Skipped[processor.ReasonDatabase] != 1 {
		t.Errorf("result %+v: want 3 applied (t1, c1, the delete), 1 unchanged (the older create), 1 db_error", res)
	}
	var users int
	if err := db.QueryRow(`SELECT COUNT(*) FROM users WHERE did = 'did:plc:carol'`).Scan(&users); err != nil {
		t.Fatal(err)
	}
	if users != 1 {
		t.Errorf("carol's users row: %d rows, want 1 (ensured again when the chunk was redone)", users)
	}
	var tags int
	if err := db.QueryRow(`SELECT COUNT(*) FROM tags WHERE did = ?1 AND rkey = 'old'`, bob).Scan(&tags); err != nil {
		t.Fatal(err)
	}
	if tags != 0 {
		t.Errorf("bob's deleted tag is back (%d rows): the older create passed the tombstone", tags)
	}
}
