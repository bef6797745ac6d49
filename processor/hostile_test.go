package processor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/jetstream"
	"github.com/atcr-io/appview/processor"
)

// hostileStats is an io.atcr.hold.stats event as the tester sent it: raw
// JSON, so counts beyond float64's precision arrive exactly.
func hostileStats(hold string, us int64, rkey, owner, repo string, pull, push int64) jetstream.Event {
	rec := fmt.Sprintf(`{"$type":"io.atcr.hold.stats","ownerDid":%q,"repository":%q,"pullCount":%d,"pushCount":%d,"updatedAt":"2025-06-15T15:06:39.345Z"}`,
		owner, repo, pull, push)
	return jetstream.Event{DID: hold, TimeUS: us, Kind: jetstream.KindCommit, Commit: &jetstream.Commit{
		Rev: "r1", Operation: "create", Collection: processor.CollectionStats, RKey: rkey, Record: json.RawMessage(rec)}}
}

func TestTwoHoldsReportingTheLargestInt64PullCountAreSkippedAndTheBatchLands(t *testing.T) {
	db := openDB(t)
	const maxInt64 = 1<<63 - 1
	events := []jetstream.Event{
		hostileStats("did:web:holdA.example", 1750000000000100, "aaaa", "did:plc:victim", "app", maxInt64, 5),
		hostileStats("did:web:holdB.example", 1750000000000200, "bbbb", "did:plc:victim", "app", maxInt64, 5),
		hostileStats("did:web:holdA.example", 1750000000000300, "cccc", "did:plc:victim", "other", 7, 1),
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	res, err := p.Apply(context.Background(), db.DB, acquire(t, db.DB, "jetstream-consumer", "me"), events)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if res.Skipped[processor.ReasonBadValue] != 2 || res.Applied != 1 {
		t.Fatalf("result %+v: want the two out-of-range records skipped as bad_value and the third applied", res)
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM repository_hold_stats WHERE repository = 'app'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d hold stats rows for the hostile repository (%v), want none", n, err)
	}
}

func TestCountsAreValidUpToTheSafeIntegerLimitAndNotBeyond(t *testing.T) {
	db := openDB(t)
	events := []jetstream.Event{
		hostileStats("did:web:h1.example", 1, "a", "did:plc:o", "at-limit", processor.MaxSafeInteger, 0),
		hostileStats("did:web:h1.example", 2, "b", "did:plc:o", "pull-over", processor.MaxSafeInteger+1, 0),
		hostileStats("did:web:h1.example", 3, "c", "did:plc:o", "push-over", 0, processor.MaxSafeInteger+1),
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	res, err := p.Apply(context.Background(), db.DB, unfenced, events)
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != 1 || res.Skipped[processor.ReasonBadValue] != 2 {
		t.Fatalf("result %+v: want the count at 2^53-1 applied and the two above it skipped", res)
	}
}

func TestTheRepositoryAggregateSaturatesAtTheSafeIntegerLimitInsteadOfOverflowing(t *testing.T) {
	db := openDB(t)
	// 1100 holds at the limit sum past int64 (2^63 / 2^53 = 1024).
	var events []jetstream.Event
	for i := range 1100 {
		events = append(events, hostileStats(fmt.Sprintf("did:web:h%04d.example", i), int64(i+1), "rk",
			"did:plc:o", "app", processor.MaxSafeInteger, 1))
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	c := acquire(t, db.DB, "jetstream-consumer", "me")
	res, err := p.Apply(context.Background(), db.DB, c, events)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if res.Applied != len(events) {
		t.Fatalf("result %+v: want every valid record applied", res)
	}
	var pull, push int64
	if err := db.QueryRow(`SELECT pull_count, push_count FROM repository_stats WHERE did = 'did:plc:o' AND repository = 'app'`).
		Scan(&pull, &push); err != nil {
		t.Fatal(err)
	}
	if pull != processor.MaxSafeInteger || push != 1100 {
		t.Fatalf("aggregate pull %d push %d, want pull saturated at %d and push the exact sum 1100", pull, push, int64(processor.MaxSafeInteger))
	}
}

func TestRowsStoredBeforeTheRangeCheckCannotOverflowTheAggregate(t *testing.T) {
	db := openDB(t)
	// What an older version let in: two holds near the top of int64.
	for _, hold := range []string{"did:web:a.example", "did:web:b.example"} {
		if _, err := db.Exec(`INSERT INTO repository_hold_stats (did, repository, hold_did, rkey, pull_count, push_count, updated_at, source_us)
VALUES ('did:plc:o', 'app', ?, 'rk', 9223372036854775807, 3, 1, 1)`, hold); err != nil {
			t.Fatal(err)
		}
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	// A third hold's report recomputes the aggregate over all three rows.
	if _, err := p.Apply(context.Background(), db.DB, unfenced, []jetstream.Event{
		hostileStats("did:web:c.example", 10, "rk", "did:plc:o", "app", 1, 1),
	}); err != nil {
		t.Fatalf("apply: %v", err)
	}
	var pull, push int64
	if err := db.QueryRow(`SELECT pull_count, push_count FROM repository_stats WHERE did = 'did:plc:o'`).Scan(&pull, &push); err != nil {
		t.Fatal(err)
	}
	if pull != processor.MaxSafeInteger || push != 7 {
		t.Fatalf("aggregate pull %d push %d, want %d and 7", pull, push, int64(processor.MaxSafeInteger))
	}
}

func TestSaturatingAddCapsAtTheSafeIntegerLimit(t *testing.T) {
	for _, c := range []struct{ a, b, want int64 }{
		{1, 2, 3},
		{processor.MaxSafeInteger - 1, 1, processor.MaxSafeInteger},
		{processor.MaxSafeInteger, 1, processor.MaxSafeInteger},
		{processor.MaxSafeInteger, processor.MaxSafeInteger, processor.MaxSafeInteger},
	} {
		if got := processor.SaturatingAdd(c.a, c.b); got != c.want {
			t.Errorf("SaturatingAdd(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
