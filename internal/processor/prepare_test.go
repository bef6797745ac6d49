package processor_test

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/synth"
	"github.com/atcr-io/appview/internal/testsupport"
)

// Events decoded ahead of delivery (Prepare, on the Jetstream reader's
// goroutine) apply exactly as events decoded inside the transaction: same
// tables, same outcomes, skips included; and a batch applied twice from
// the same prepared events (a retried transaction) lands as once.
func TestPreparedEventsApplyAsUnpreparedOnes(t *testing.T) {
	events, _ := generate(t, synth.Options{Seed: 9, Events: 2000})
	events = append(events,
		hostileStats("did:web:h1.example", 1750000000000100, "a", "did:plc:o", "over", processor.MaxSafeInteger+1, 0),
		jetstream.Event{DID: "did:plc:x", TimeUS: 0, Kind: jetstream.KindCommit},
		jetstream.Event{DID: "not a did", TimeUS: 1750000000000200, Kind: jetstream.KindCommit, Commit: &jetstream.Commit{
			Rev: "3lrnqkdzhdqi2", Operation: "create", Collection: processor.CollectionStar, RKey: "k",
			Record: json.RawMessage(`{"$type":"io.atcr.sailor.star"}`)}},
		jetstream.Event{DID: "did:plc:y", TimeUS: 1750000000000300, Kind: jetstream.KindCommit, Commit: &jetstream.Commit{
			Rev: "3lrnqkdzhdqi2", Operation: "create", Collection: processor.CollectionTag, RKey: "k",
			Record: json.RawMessage(`{not json`)}},
	)
	prepared := make([]jetstream.Event, len(events))
	copy(prepared, events)
	for i := range prepared {
		processor.Prepare(&prepared[i])
		if prepared[i].Prepared == nil {
			t.Fatalf("event %d: Prepare left nothing", i)
		}
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	plain, pre := testsupport.OpenDB(t), testsupport.OpenDB(t)
	for i := 0; i < len(events); i += 100 {
		hi := min(i+100, len(events))
		want, err := p.Apply(context.Background(), plain, unfenced, events[i:hi])
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Apply(context.Background(), pre, unfenced, prepared[i:hi])
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("batch at %d: prepared %+v, unprepared %+v", i, got, want)
		}
	}
	if got, want := dump(t, pre), dump(t, plain); got != want {
		t.Fatal("prepared events left other rows than unprepared ones")
	}
	// Again, the same prepared events: a retried transaction sees the
	// same verdicts (the prepared operations are copied, never changed).
	again := testsupport.OpenDB(t)
	for round := range 2 {
		db := again
		if round == 1 {
			db = testsupport.OpenDB(t)
		}
		for i := 0; i < len(prepared); i += 100 {
			if _, err := p.Apply(context.Background(), db, unfenced, prepared[i:min(i+100, len(prepared))]); err != nil {
				t.Fatal(err)
			}
		}
		if dump(t, db) != dump(t, plain) {
			t.Fatalf("round %d: a second application of the same prepared events differs", round)
		}
	}
}
