package jetstream

import (
	"context"
	"testing"
	"time"
)

// A batch is what has arrived: the frames already queued when the handler
// is free go together, and a lone frame goes at once, the connection still
// open and nothing more coming (no linger by default).
func TestABatchIsWhatHasArrivedAndALoneFrameGoesAtOnce(t *testing.T) {
	got := make(chan int, 10)
	c := &Client{opts: ClientOptions{BatchSize: 100, BatchBytes: 1 << 20}, handler: func(_ context.Context, b Batch) error {
		got <- len(b.Events)
		return nil
	}}
	cs := &connState{base: "ws://a.example/subscribe", items: make(chan item, 10), ahead: newReadAhead(1 << 20)}
	ev := func(seq int64) item { return item{ev: Event{Seq: seq, Kind: KindCommit}, size: 10, at: time.Now()} }
	for i := range int64(3) {
		cs.ahead.wait(10, nil)
		cs.items <- ev(i + 1)
	}
	done := make(chan error, 1)
	go func() { done <- c.deliver(context.Background(), cs) }()
	if n := <-got; n != 3 {
		t.Fatalf("first batch of %d events, want the 3 queued", n)
	}
	cs.ahead.wait(10, nil)
	cs.items <- ev(4)
	select {
	case n := <-got:
		if n != 1 {
			t.Fatalf("batch of %d events, want the lone one", n)
		}
	case <-time.After(testWait):
		t.Fatal("a lone frame was not delivered while the connection stayed open")
	}
	close(cs.items)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if held := cs.ahead.held.Load(); held != 0 {
		t.Fatalf("%d bytes still held after every batch was handled", held)
	}
}
