package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/synth"
	"github.com/atcr-io/appview/internal/testsupport"
)

// benchBatch is the consumer's batch size (the Jetstream client's default).
const benchBatch = jetstream.DefaultBatchSize

// BenchmarkIngestVersusBareInserts measures, in one run, the ingest rate of
// synthetic io.atcr events through the processor alone into a file
// database, and the time bare batched INSERTs of the same rows take (see
// package rowcapture: every row image the processor wrote, recorded in an
// untimed run, written again with INSERT OR REPLACE in the same batches,
// one transaction per batch, into the same schema).
// ratio = bare time / processor time (target >= 0.5). `appview-dev bench`
// measures the same ratio through the whole consumer (MeasureIngest).
func BenchmarkIngestVersusBareInserts(b *testing.B) {
	ctx := context.Background()
	all := generateEvents(synth.Options{Seed: 99, Events: 20000})
	var events []jetstream.Event
	for _, ev := range all {
		if ev.Kind == jetstream.KindCommit && strings.HasPrefix(ev.Commit.Collection, "io.atcr.") {
			events = append(events, ev)
		}
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	capture, err := RecordProcessor(ctx, filepath.Join(b.TempDir(), "capture.db"), events, benchBatch)
	if err != nil {
		b.Fatal(err)
	}
	var procTime, bareTime time.Duration
	for b.Loop() {
		b.StopTimer()
		procDB := testsupport.OpenDB(b)
		bareDB := testsupport.OpenDB(b)
		b.StartTimer()

		start := time.Now()
		for i := 0; i < len(events); i += benchBatch {
			if _, err := p.Apply(ctx, procDB, fence.Custody{Lease: "bench"}, events[i:min(i+benchBatch, len(events))]); err != nil {
				b.Fatal(err)
			}
		}
		procTime += time.Since(start)

		start = time.Now()
		if err := capture.Insert(ctx, bareDB.DB); err != nil {
			b.Fatal(err)
		}
		bareTime += time.Since(start)
	}
	n := float64(b.N)
	b.ReportMetric(float64(len(events))*n/procTime.Seconds(), "events/s")
	b.ReportMetric(float64(capture.Rows())*n/bareTime.Seconds(), "bare-rows/s")
	b.ReportMetric(float64(capture.Rows())/float64(len(events)), "rows/event")
	b.ReportMetric(bareTime.Seconds()/procTime.Seconds(), "ratio")
}

// generateEvents returns the synthetic stream of o.
func generateEvents(o synth.Options) []jetstream.Event {
	g := synth.NewGenerator(o)
	var evs []jetstream.Event
	for {
		ev, ok := g.Next()
		if !ok {
			return evs
		}
		evs = append(evs, ev)
	}
}
