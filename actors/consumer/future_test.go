package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/config"
	"github.com/atcr-io/appview/jetstream"
	"github.com/atcr-io/appview/processor"
	"github.com/atcr-io/appview/webhooks"
)

// An event stamped ahead of time (within jetstream.MaxFutureSkew, so the
// client delivers it) must not carry the stored cursor into the future:
// there it would stop moving, and the next connect would live-tail past
// everything since. A cursor already stored in the future heals.
func TestACursorNeverRunsAheadOfTheClock(t *testing.T) {
	db := openDB(t)
	events, _ := generate(71, 50)
	c := acquire(t, db.DB, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	ctx := context.Background()

	ahead := events[len(events)-1]
	ahead.TimeUS = time.Now().Add(3 * time.Hour).UnixMicro()
	batch := append(append([]jetstream.Event(nil), events[:len(events)-1]...), ahead)
	if _, err := commitBatch(ctx, db.DB, c, p, webhooks.EnqueueTx, batch); err != nil {
		t.Fatal(err)
	}
	limit := time.Now().Add(cursorLead).UnixMicro()
	cur, _, _ := LoadCursor(ctx, db.DB)
	if cur > limit || cur < time.Now().Add(cursorLead-time.Minute).UnixMicro() {
		t.Fatalf("cursor %d after an event 3 h ahead, want capped near now + %s (%d)", cur, cursorLead, limit)
	}

	// A cursor stored in the future by an older version heals at the next
	// batch, even one of past events.
	if _, err := db.Exec(`UPDATE jetstream_cursor SET time_us = 9000000000000000000`); err != nil {
		t.Fatal(err)
	}
	if _, err := commitBatch(ctx, db.DB, c, p, webhooks.EnqueueTx, events[:10]); err != nil {
		t.Fatal(err)
	}
	if cur, _, _ := LoadCursor(ctx, db.DB); cur != events[9].TimeUS {
		t.Fatalf("cursor %d after a batch over a future cursor, want the batch's last event %d", cur, events[9].TimeUS)
	}

	// Resuming from a future cursor asks for no later than the cap.
	cons := &consumer{o: Options{Jetstream: config.Default().Jetstream}}
	cons.cursor.Store(9000000000000000000)
	if at := cons.resumeAt("ws://a"); at > time.Now().Add(cursorLead).UnixMicro() {
		t.Fatalf("resumeAt a future cursor = %d, want at most now + %s", at, cursorLead)
	}
}
