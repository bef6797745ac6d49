package jetstream

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Every delivered event comes with the time its frame was read off the
// socket (Batch.Received, one per event, in order): where the consumer's
// frame-to-commit time starts.
func TestEveryDeliveredEventCarriesItsArrivalTime(t *testing.T) {
	want := captureEvents(t, "expected_v1.jsonl")
	srv := startReplay(t, ReplayOptions{})
	s := newSink()
	var mu sync.Mutex
	var bad []string
	var last time.Time
	started := time.Now()
	s.onBatch = func(_ context.Context, b Batch) error {
		mu.Lock()
		defer mu.Unlock()
		if len(b.Received) != len(b.Events) {
			bad = append(bad, fmt.Sprintf("%d arrival times for %d events", len(b.Received), len(b.Events)))
			return nil
		}
		for _, at := range b.Received {
			if at.Before(started) || at.After(time.Now()) || at.Before(last) {
				bad = append(bad, fmt.Sprintf("arrival %v outside [%v, now] or before the one ahead of it (%v)", at, started, last))
			}
			last = at
		}
		return nil
	}
	runClient(t, ClientOptions{URLs: []string{srv.URL()}, BatchSize: 10}, s.handle)
	s.waitEvents(t, len(want))
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("%d batches wrong, first: %s", len(bad), bad[0])
	}
}
