package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/webhooks"
)

// An event stamped ahead of time (within jetstream.MaxFutureSkew, so the
// client delivers it) is applied but must not move the stored cursor: a
// restart would ask Jetstream for a cursor ahead of the backlog still to
// come and skip it. A cursor already stored in the future heals.
func TestAnEventStampedAheadOfTheClockNeverMovesTheCursor(t *testing.T) {
	db := testsupport.OpenDB(t)
	events, _ := generate(71, 50)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	ctx := context.Background()

	// A backlog in the past with one event two hours ahead in its middle,
	// and the same alone (the event-by-event path commits one at a time).
	batch := append([]jetstream.Event(nil), events[:20]...)
	batch[10].TimeUS = time.Now().Add(2 * time.Hour).UnixMicro()
	if _, err := commitBatch(ctx, db, c, p, webhooks.EnqueueTx, batch); err != nil {
		t.Fatal(err)
	}
	if cur, _, _ := LoadCursor(ctx, db); cur != batch[19].TimeUS {
		t.Fatalf("cursor %d after a batch with an event 2 h ahead, want its last event in the past %d", cur, batch[19].TimeUS)
	}
	if _, err := commitBatch(ctx, db, c, p, webhooks.EnqueueTx, batch[10:11]); err != nil {
		t.Fatal(err)
	}
	if cur, _, _ := LoadCursor(ctx, db); cur != batch[19].TimeUS {
		t.Fatalf("cursor %d after the event 2 h ahead alone, want it unmoved at %d", cur, batch[19].TimeUS)
	}

	// A cursor stored in the future by an older version heals at the next
	// batch, even one of past events.
	if _, err := db.Exec(`UPDATE jetstream_cursor SET time_us = 9000000000000000000`); err != nil {
		t.Fatal(err)
	}
	if _, err := commitBatch(ctx, db, c, p, webhooks.EnqueueTx, events[20:30]); err != nil {
		t.Fatal(err)
	}
	if cur, _, _ := LoadCursor(ctx, db); cur != events[29].TimeUS {
		t.Fatalf("cursor %d after a batch over a future cursor, want the batch's last event %d", cur, events[29].TimeUS)
	}

	// Resuming from a future cursor asks for no later than the cap.
	cons := &consumer{o: Options{Jetstream: config.Default().Jetstream}}
	cons.cursor.Store(9000000000000000000)
	if at := cons.resumeAt("ws://a"); at > time.Now().Add(cursorLead).UnixMicro() {
		t.Fatalf("resumeAt a future cursor = %d, want at most now + %s", at, cursorLead)
	}
}
