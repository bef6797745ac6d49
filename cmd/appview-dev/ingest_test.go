package main

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/synth"
	"github.com/atcr-io/appview/internal/testsupport"
)

func TestMedianTakesTheMiddleOrTheMeanOfTheMiddleTwo(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.xs); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}

func TestMeasureIngestRunsTheConsumerAndTheBareInsertsAndLeavesNothingRunning(t *testing.T) {
	defer testsupport.VerifyNone(t)
	var notes int
	res, err := MeasureIngest(context.Background(), t.TempDir(), IngestOptions{
		Events: 600, Seed: 3, Pairs: 2, Note: func(string, ...any) { notes++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Events == 0 || res.Events > 600 || res.Rows == 0 || res.Batches != (res.Events+jetstream.DefaultBatchSize-1)/jetstream.DefaultBatchSize {
		t.Errorf("sizes %+v: want the stream's io.atcr events in batches of %d, and their rows", res, jetstream.DefaultBatchSize)
	}
	if res.Ratio <= 0 || res.CPURatio <= 0 || res.EventsPerS <= 0 || res.BareRowsPerS <= 0 {
		t.Errorf("figures %+v: want positive ratio and rates", res)
	}
	if notes != 1+2+1 {
		t.Errorf("%d progress notes, want one for the stream, one a pair and one for the quiet pairs", notes)
	}
}

func TestMeasureIngestRefusesAnEmptyMeasurement(t *testing.T) {
	for _, o := range []IngestOptions{{Events: 100}, {Pairs: 1}} {
		if _, err := MeasureIngest(context.Background(), t.TempDir(), o); err == nil {
			t.Errorf("MeasureIngest(%+v) succeeded", o)
		}
	}
}

func TestStreamMarksAreTheLastDeliveredEventOfEachShare(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.jsonl")
	o := synth.Options{Seed: 5, Events: 2000}
	percents := []int{10, 50, 100}
	marks, err := writeMarkedStream(context.Background(), path, o, percents)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []jetstream.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		ev, err := jetstream.Decode(sc.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, ev)
	}
	if len(lines) != o.Events {
		t.Fatalf("%d lines, want %d", len(lines), o.Events)
	}
	for k, p := range percents {
		end := o.Events * p / 100
		var want int64
		for i := range lines[:end] {
			if delivered(&lines[i]) {
				want = lines[i].TimeUS
			}
		}
		if want == 0 || marks[k] != want {
			t.Errorf("mark at %d%% = %d, want %d (the last delivered event of the first %d)", p, marks[k], want, end)
		}
	}
	if marks[0] >= marks[1] || marks[1] >= marks[2] {
		t.Errorf("marks %v do not grow", marks)
	}
}

func TestOnlyIOATCRCommitsAndCollectionlessEventsAreDelivered(t *testing.T) {
	for _, c := range []struct {
		e    jetstream.Event
		want bool
	}{
		{jetstream.Event{Kind: jetstream.KindCommit, Commit: &jetstream.Commit{Collection: "io.atcr.tag"}}, true},
		{jetstream.Event{Kind: jetstream.KindCommit, Commit: &jetstream.Commit{Collection: "app.bsky.feed.like"}}, false},
		{jetstream.Event{Kind: jetstream.KindCommit, Commit: &jetstream.Commit{Collection: "io.atcrx.tag"}}, false},
		{jetstream.Event{Kind: jetstream.KindIdentity}, true},
		{jetstream.Event{Kind: jetstream.KindAccount}, true},
	} {
		if got := delivered(&c.e); got != c.want {
			t.Errorf("delivered(%s %s) = %v, want %v", c.e.Kind, c.e.Collection(), got, c.want)
		}
	}
}

// BenchmarkConsumerIngest runs the consumer side of ingest_ratio alone
// (the real consumer actor fed by a loopback replay server, 20k synthetic
// events, a new file database each run), for profiling the ingest path:
//
//	go test -run '^$' -bench ConsumerIngest -cpuprofile cpu.prof ./cmd/appview-dev/bench
//	go tool pprof -top cpu.prof
func BenchmarkConsumerIngest(b *testing.B) {
	ctx := context.Background()
	rig, _, res, closeRig, err := prepareIngest(ctx, b.TempDir(), IngestOptions{Events: ingestEventsFull, Seed: ingestSeed, Pairs: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer closeRig()
	if _, err := rig.consumerRun(ctx); err != nil { // compresses the frames
		b.Fatal(err)
	}
	var took time.Duration
	cpu := processCPU()
	for b.Loop() {
		d, err := rig.consumerRun(ctx)
		if err != nil {
			b.Fatal(err)
		}
		took += d
	}
	// CPU time is steadier than wall time on a shared host: it is what
	// this process (consumer, reader, replay server) spent per run.
	b.ReportMetric((processCPU()-cpu).Seconds()*1000/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(res.Events)*float64(b.N)/took.Seconds(), "events/s")
}

// BenchmarkBareIngest runs the bare side of ingest_ratio alone (the
// recorded row images inserted batch for batch into a new file database),
// for profiling beside BenchmarkConsumerIngest:
//
//	go test -run '^$' -bench BareIngest -cpuprofile bare.prof ./cmd/appview-dev/bench
func BenchmarkBareIngest(b *testing.B) {
	ctx := context.Background()
	rig, capture, res, closeRig, err := prepareIngest(ctx, b.TempDir(), IngestOptions{Events: ingestEventsFull, Seed: ingestSeed, Pairs: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer closeRig()
	var took time.Duration
	cpu := processCPU()
	for b.Loop() {
		d, err := rig.bareRun(ctx, capture)
		if err != nil {
			b.Fatal(err)
		}
		took += d
	}
	b.ReportMetric((processCPU()-cpu).Seconds()*1000/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(res.Rows)*float64(b.N)/took.Seconds(), "rows/s")
}
