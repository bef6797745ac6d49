package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/testsupport"
)

// appview_jetstream_event_commit_seconds observes every event once, from
// its frame's arrival to the commit that applied it, also when the
// commit budget splits the batch into several transactions; a batch
// without arrival times (built by hand) observes nothing.
func TestEveryCommittedEventIsTimedFromItsArrival(t *testing.T) {
	db := testsupport.OpenDB(t)
	cons := bareConsumer(t, db, acquire(t, db, "me"), time.Second)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	cons.o.Metrics = m
	cons.pipe.budget = time.Nanosecond // one transaction per lockChunk events
	events := numbered(generateEvents(71, 3*lockChunk+5), 1)
	arrived := time.Now().Add(-time.Second)
	received := make([]time.Time, len(events))
	for i := range received {
		received[i] = arrived
	}
	const url = "ws://a.example/xrpc/network.bsky.jetstream.subscribeEvents"
	ctx := context.Background()
	if err := cons.handle(ctx, jetstream.Batch{URL: url, Events: events, Received: received, MaxSeq: int64(len(events))}); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.eventCommit); n != 1 {
		t.Fatalf("%d histograms, want 1", n)
	}
	count, sum := histogram(t, m.eventCommit)
	if count != uint64(len(events)) || sum < float64(len(events)) {
		t.Fatalf("%d events timed, %.3f s in all; want %d, each at least 1 s", count, sum, len(events))
	}
	more := numbered(generateEvents(72, 5), int64(len(events)+1))
	if err := cons.handle(ctx, jetstream.Batch{URL: url, Events: more, MaxSeq: int64(len(events) + 5)}); err != nil {
		t.Fatal(err)
	}
	if count, _ := histogram(t, m.eventCommit); count != uint64(len(events)) {
		t.Fatalf("%d events timed after a batch without arrival times, want still %d", count, len(events))
	}
}

func histogram(t *testing.T, h prometheus.Histogram) (uint64, float64) {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	h.Collect(ch)
	var out dto.Metric
	if err := (<-ch).Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetHistogram().GetSampleCount(), out.GetHistogram().GetSampleSum()
}
