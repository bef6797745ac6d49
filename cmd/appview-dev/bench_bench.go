package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/harness"
)

// Options configures a run.
type Options struct {
	// Bin is the appview binary whose `serve` and `jetstream-replay` are
	// measured (appview-dev bench --appview).
	Bin string
	// Sqld is the sqld binary for the *_sqld figures; "" leaves them out.
	Sqld string
	// Dir is the scratch directory; "" makes (and removes) a temporary one.
	Dir string
	// Quick runs a few rounds of everything: a smoke run, not a measurement.
	Quick bool
	// Out receives the figures, one "name value unit" a line.
	Out io.Writer
	// Only, when not empty, names the steps (see Steps) or the figures
	// (see the package doc) to run and print; the other steps are skipped.
	Only []string
	// Repeat is how many times each selected step runs (0: DefaultRepeat;
	// Quick: 1). Each figure printed is the median over the runs, with
	// its minimum and maximum on lines of their own.
	Repeat int
	// Progress receives notes on what is running (stderr); nil discards them.
	Progress io.Writer
}

// Steps names the scenarios in the order Run runs them (for Options.Only).
var Steps = []string{"graceful", "rtt-file", "rtt-sqld", "graceful-sqld", "crash", "renew-cost", "rss", "ingest", "ingest-sqld", "replay-1m", "replay-serve", "jetstream-close"}

// rounds is how many samples each scenario takes.
type rounds struct {
	graceful, gracefulSqld, crash, rtt, renewLeases, renewRounds, close int
}

var (
	fullRounds  = rounds{graceful: 50, gracefulSqld: 20, crash: 10, rtt: 300, renewLeases: 1000, renewRounds: 31, close: 100}
	quickRounds = rounds{graceful: 3, gracefulSqld: 2, crash: 1, rtt: 20, renewLeases: 50, renewRounds: 1, close: 3}
)

// Timing is the lease timing of the process scenarios (the short timing
// of the multi-process tests: a crash round costs about one TTL).
var Timing = harness.ShortTiming

// Run runs every scenario and writes the figures to o.Out as they are
// measured. It stops at the first scenario that fails and returns its
// error; figures already written stay valid.
func Run(ctx context.Context, o Options) error {
	if o.Bin == "" || o.Out == nil {
		return errors.New("bench: Options need Bin and Out")
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Repeat < 0 {
		return fmt.Errorf("bench: Repeat %d: must be at least 1", o.Repeat)
	}
	if o.Repeat == 0 {
		o.Repeat = DefaultRepeat
		if o.Quick {
			o.Repeat = 1
		}
	}
	sel, err := selectSteps(o.Only)
	if err != nil {
		return err
	}
	if o.Dir == "" {
		dir, err := os.MkdirTemp("", "appview-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.Dir = dir
	}
	r := &runner{o: o, n: fullRounds, figures: newFigureSet()}
	if o.Quick {
		r.n = quickRounds
	}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"graceful", func(ctx context.Context) error { return r.graceful(ctx, "file") }},
		{"rtt-file", func(ctx context.Context) error { return r.roundTrips(ctx, "file") }},
		{"rtt-sqld", func(ctx context.Context) error { return r.roundTrips(ctx, "sqld") }},
		{"graceful-sqld", func(ctx context.Context) error { return r.graceful(ctx, "sqld") }},
		{"crash", r.crash},
		{"renew-cost", r.renewCost},
		{"rss", r.idleRSS},
		{"ingest", func(ctx context.Context) error { return r.ingest(ctx, "file") }},
		{"ingest-sqld", func(ctx context.Context) error { return r.ingest(ctx, "sqld") }},
		{"replay-1m", r.replayRSS},
		{"replay-serve", r.replayServe},
		{"jetstream-close", r.closeLatency},
	}
	r.noteHost()
	for _, s := range steps {
		if !slices.Contains(sel.steps, s.name) {
			continue
		}
		r.figures = newFigureSet()
		for k := range o.Repeat {
			start := time.Now()
			r.note("%s (run %d of %d) ...", s.name, k+1, o.Repeat)
			if err := s.fn(ctx); err != nil {
				return fmt.Errorf("bench: %s: %w", s.name, err)
			}
			r.note("%s (run %d of %d) done in %v", s.name, k+1, o.Repeat, time.Since(start).Round(time.Millisecond))
		}
		r.figures.write(o.Out, sel.figures[s.name])
	}
	return nil
}

type runner struct {
	o    Options
	n    rounds
	seq  int
	dirs int
	// figures collects the current step's figures over its runs.
	figures *figureSet
}

func (r *runner) note(format string, args ...any) {
	fmt.Fprintf(r.o.Progress, "bench: "+format+"\n", args...)
}

// noteHost notes the host's CPUs and load: the figures are only
// comparable between runs on equally quiet hosts.
func (r *runner) noteHost() {
	load := "unknown"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			load = strings.Join(f[:3], " ")
		}
	}
	r.note("host: %d CPUs, load average %s (1, 5, 15 min)", runtime.NumCPU(), load)
}

// figure records one run's value of a figure; Run prints the median and
// the spread once the step's runs are done.
func (r *runner) figure(name string, value float64, unit string) {
	r.note("%s %.3f %s", name, value, unit)
	r.figures.add(name, value, unit)
}

// scratch returns a new directory under Dir.
func (r *runner) scratch(name string) (string, error) {
	r.dirs++
	d := filepath.Join(r.o.Dir, fmt.Sprintf("%02d-%s", r.dirs, name))
	return d, os.MkdirAll(d, 0o755)
}

// instanceID returns a fresh instance_id.
func (r *runner) instanceID() string {
	r.seq++
	return fmt.Sprintf("bench-%03d", r.seq)
}

// spec is an instance running the default workers (cleanup is the leased
// one) with debug logging, which the waits need (lease.contended).
func (r *runner) spec(db string) harness.Spec {
	return harness.Spec{ID: r.instanceID(), DatabaseURL: db, Timing: Timing}
}

func (r *runner) ingest(ctx context.Context, kind string) error {
	suffix := ""
	o := IngestOptions{Events: ingestEventsFull, Seed: ingestSeed, Pairs: ingestPairsFull, Note: r.note}
	if kind == "sqld" {
		if r.o.Sqld == "" {
			r.note("ingest_ratio_sqld not measured: no sqld binary (--sqld)")
			return nil
		}
		// Every statement is a round trip to the server: a smaller stream
		// keeps a run within minutes.
		suffix, o.Sqld, o.Events, o.Pairs = "_sqld", r.o.Sqld, ingestEventsSqld, ingestPairsSqld
	}
	dir, err := r.scratch("ingest-" + kind)
	if err != nil {
		return err
	}
	if r.o.Quick {
		o.Events, o.Pairs = ingestEventsQuick, ingestPairsQuick
		if kind == "sqld" {
			o.Events, o.Pairs = ingestEventsQuick/4, 1
		}
	}
	res, err := MeasureIngest(ctx, dir, o)
	if err != nil {
		return err
	}
	r.figure("ingest_ratio"+suffix, res.Ratio, "ratio")
	r.figure("ingest_cpu_ratio"+suffix, res.CPURatio, "ratio")
	r.figure("ingest_events_per_s"+suffix, res.EventsPerS, "events/s")
	r.figure("bare_rows_per_s"+suffix, res.BareRowsPerS, "rows/s")
	return nil
}
