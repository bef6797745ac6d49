package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/actors/consumer"
	"github.com/atcr-io/appview/actors/statscache"
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/harness"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/synth"
)

// Ingest sizes and bounds.
const (
	// ingestSeed selects the synthetic stream (the processor benchmark's).
	ingestSeed = 99
	// ingestEventsFull and ingestEventsQuick are the synthetic stream's
	// length; its io.atcr commits are what is ingested.
	ingestEventsFull, ingestEventsQuick = 20000, 2000
	// ingestPairsFull and ingestPairsQuick are the timed (consumer, bare)
	// pairs.
	ingestPairsFull, ingestPairsQuick = 7, 3
	// ingestEventsSqld and ingestPairsSqld size the sqld runs.
	ingestEventsSqld, ingestPairsSqld = 5000, 3
	// ingestPoll is how often a consumer run reads jetstream_cursor: the
	// resolution of the run's end (0.25% of a 2 s run).
	ingestPoll = 5 * time.Millisecond
	// ingestStall bounds a consumer run whose cursor stops moving.
	ingestStall = 30 * time.Second
	// ingestTTL is the TTL of the consumer's grant: longer than any run,
	// so the measurement needs no renewal loop.
	ingestTTL = time.Hour
	// ingestHolder is the holder of the consumer's grant.
	ingestHolder = "bench-ingest"
)

// IngestOptions sizes MeasureIngest.
type IngestOptions struct {
	// Events is the length of the synthetic stream (synth, seed Seed); its
	// io.atcr commits, about 92% of it, are ingested.
	Events int
	Seed   uint64
	// Pairs is the number of timed (consumer run, bare run) pairs, at least
	// 1. One untimed consumer run comes first.
	Pairs int
	// Note receives progress notes; nil discards them.
	Note func(format string, args ...any)
	// Sqld, when not empty, is a sqld binary: every run's database is
	// then a new sqld server (started in the scratch directory, stopped
	// after the run) instead of a new file.
	Sqld string
}

// IngestResult is what MeasureIngest measured.
type IngestResult struct {
	// Events is the number of events each run ingests; Batches the number
	// of consumer-sized batches they make; Rows the row images the
	// processor writes for them (what each bare run inserts).
	Events, Batches, Rows int
	// Ratio is the median over the pairs of bare time / consumer time
	// (higher is better).
	Ratio float64
	// EventsPerS is the median consumer rate (events/s); BareRowsPerS the
	// median bare rate (rows/s).
	EventsPerS, BareRowsPerS float64
	// CPURatio is the median over the pairs of the CPU time this process
	// used for the bare run / for the consumer run (the consumer's reader,
	// committer and the loopback replay server's sends; on sqld, the
	// client side only). Other processes on the host change it much less
	// than the wall-time Ratio, so it is what decides an optimisation on
	// a shared host; 0 where /proc cannot be read.
	CPURatio float64
}

// MeasureIngest measures ingest_ratio in dir (a scratch directory it
// fills with a stream file and one database per run):
//
//   - the synthetic stream's io.atcr commits are written to a JSONL file;
//   - in an untimed run, every row image the processor writes for them, in
//     the consumer's batches (jetstream.DefaultBatchSize events: the
//     config has no key for it), is recorded (RecordProcessor);
//   - a consumer run is the real path, timed from spawn until
//     jetstream_cursor holds the last event's time_us: a ReplayServer on
//     loopback (rate 0) sends compressed frames to a consumer actor built
//     by consumer.Worker from the default configuration, holding a fenced
//     grant from lease.Store, on a new file database;
//   - a bare run writes the recorded images into a new migrated file
//     database with INSERT OR REPLACE, batch for batch, one transaction
//     per batch (Capture.Insert).
//
// The runs of a pair alternate which goes first, so a drift in the host's
// speed falls on both alike; the result takes medians over the pairs.
// Errors name the run that failed.
func MeasureIngest(ctx context.Context, dir string, o IngestOptions) (IngestResult, error) {
	if o.Pairs < 1 || o.Events < 1 {
		return IngestResult{}, fmt.Errorf("ingest: %d events, %d pairs: need at least one of each", o.Events, o.Pairs)
	}
	if o.Note == nil {
		o.Note = func(string, ...any) {}
	}
	rig, capture, res, closeRig, err := prepareIngest(ctx, dir, o)
	if err != nil {
		return IngestResult{}, err
	}
	defer closeRig()
	// Untimed: the process's heap and the file system's caches warm up.
	if _, err := rig.consumerRun(ctx); err != nil {
		return IngestResult{}, fmt.Errorf("ingest: warm-up consumer run: %w", err)
	}
	var ratios, cpuRatios, eventRates, rowRates, quiet []float64
	for k := range o.Pairs {
		var (
			cons, bare             time.Duration
			consOthers, bareOthers float64
			consCPU, bareCPU       time.Duration
		)
		runs := []func() error{
			func() (err error) {
				cons, consOthers, consCPU, err = beside(func() (time.Duration, error) { return rig.consumerRun(ctx) })
				return err
			},
			func() (err error) {
				bare, bareOthers, bareCPU, err = beside(func() (time.Duration, error) { return rig.bareRun(ctx, capture) })
				return err
			},
		}
		if k%2 == 1 {
			slices.Reverse(runs)
		}
		for _, run := range runs {
			if err := run(); err != nil {
				return IngestResult{}, fmt.Errorf("ingest: pair %d: %w", k, err)
			}
		}
		ratios = append(ratios, bare.Seconds()/cons.Seconds())
		if consCPU > 0 {
			cpuRatios = append(cpuRatios, bareCPU.Seconds()/consCPU.Seconds())
		}
		eventRates = append(eventRates, float64(res.Events)/cons.Seconds())
		rowRates = append(rowRates, float64(res.Rows)/bare.Seconds())
		if consOthers < contendedShare && bareOthers < contendedShare {
			quiet = append(quiet, ratios[k])
		}
		o.Note("ingest pair %d: consumer %v (%.0f events/s), bare %v (%.0f rows/s), ratio %.3f; other processes used %.2f and %.2f CPUs",
			k, cons.Round(time.Millisecond), eventRates[k], bare.Round(time.Millisecond), rowRates[k], ratios[k], consOthers, bareOthers)
	}
	res.Ratio, res.EventsPerS, res.BareRowsPerS = median(ratios), median(eventRates), median(rowRates)
	res.CPURatio = median(cpuRatios)
	// Other work on the host slows the consumer (reader, replay server and
	// committer: a little over one CPU) more than the bare inserts (one),
	// so a busy host lowers the ratio; the quiet pairs show what an idle
	// host gives.
	if len(quiet) > 0 {
		o.Note("ingest: %d of %d pairs ran on a quiet host (other processes under %.1f CPU); their median ratio %.3f",
			len(quiet), o.Pairs, contendedShare, median(quiet))
	} else {
		o.Note("ingest: no pair ran on a quiet host (other processes under %.1f CPU): the figures are a busy host's", contendedShare)
	}
	return res, nil
}

// prepareIngest writes the stream of o into dir, records the processor's
// row images for it, and starts a loopback replay server of it and an
// actor system for the consumers: a rig ready for consumer and bare runs.
// The returned func stops the server and the system.
func prepareIngest(ctx context.Context, dir string, o IngestOptions) (*ingestRig, *Capture, IngestResult, func(), error) {
	if o.Note == nil {
		o.Note = func(string, ...any) {}
	}
	var events []jetstream.Event
	stream := filepath.Join(dir, "stream.jsonl")
	if _, err := writeStream(ctx, stream, synth.Options{Seed: o.Seed, Events: o.Events}, atcrCommit,
		func(e *jetstream.Event) { events = append(events, *e) }); err != nil {
		return nil, nil, IngestResult{}, nil, fmt.Errorf("ingest: write stream: %w", err)
	}
	if len(events) == 0 {
		return nil, nil, IngestResult{}, nil, errors.New("ingest: the synthetic stream has no io.atcr commits")
	}
	batch := jetstream.DefaultBatchSize
	capture, err := RecordProcessor(ctx, filepath.Join(dir, "capture.db"), events, batch)
	if err != nil {
		return nil, nil, IngestResult{}, nil, fmt.Errorf("ingest: record rows: %w", err)
	}
	res := IngestResult{Events: len(events), Batches: len(capture.Batches), Rows: capture.Rows()}
	o.Note("ingest: %d io.atcr events, %d batches of %d, %d row images (%.2f a event)",
		res.Events, res.Batches, batch, res.Rows, float64(res.Rows)/float64(res.Events))

	srv, err := jetstream.NewReplayServer(jetstream.ReplayOptions{File: stream, Listen: "127.0.0.1:0"}, zerolog.Nop())
	if err != nil {
		return nil, nil, IngestResult{}, nil, fmt.Errorf("ingest: %w", err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe(context.Background()) }()
	stopServer := func() { srv.Close(); <-served }
	select {
	case <-srv.Listening():
	case err := <-served:
		return nil, nil, IngestResult{}, nil, fmt.Errorf("ingest: replay server: %w", err)
	}
	// The first compressed subscription compresses every frame before it
	// sends one: do it here, under its own bound, so a busy host's slow
	// compression is not taken for a consumer whose cursor is stuck.
	if _, err := readFrames(ctx, srv.URL(), 1, replayPrepare); err != nil {
		stopServer()
		return nil, nil, IngestResult{}, nil, fmt.Errorf("ingest: prime replay server: %w", err)
	}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	rig := &ingestRig{dir: dir, sys: sys, url: srv.URL(), lastUS: events[len(events)-1].TimeUS, sqld: o.Sqld}

	return rig, capture, res, func() { sys.Shutdown(); stopServer() }, nil
}

// contendedShare is the CPU share (of one CPU) other processes may use
// during a run before the run counts as sharing the host.
const contendedShare = 0.2

// beside runs run and returns its duration, the share of a CPU other
// processes used meanwhile (0 where /proc cannot be read) and the CPU
// time this process used (getrusage: microseconds, where /proc counts
// 10 ms ticks).
func beside(run func() (time.Duration, error)) (time.Duration, float64, time.Duration, error) {
	before, self := sampleCPU(), processCPU()
	start := time.Now()
	d, err := run()
	self = processCPU() - self
	others, _ := before.others(sampleCPU(), time.Since(start))
	return d, others, self, err
}

// processCPU is the user and system time this process has used; 0 when
// getrusage fails.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ingestRig runs consumers against one replay server.
type ingestRig struct {
	dir    string
	sys    *actor.ActorSystem
	url    string
	lastUS int64
	dbs    int
	// sqld is the sqld binary of sqld runs; "" for file databases.
	sqld string
}

// newDB opens and migrates a new database with the options `appview
// serve` opens it with: a file in the rig's directory, or a new sqld
// server there. done closes it (and stops the server).
func (g *ingestRig) newDB(ctx context.Context, kind string) (db *database.DB, url string, done func(), err error) {
	g.dbs++
	name := fmt.Sprintf("%s-%02d", kind, g.dbs)
	url, stop := "file:"+filepath.Join(g.dir, name+".db"), func() {}
	if g.sqld != "" {
		q, err := harness.StartSqld(ctx, harness.SqldSpec{Bin: g.sqld, Dir: filepath.Join(g.dir, name)})
		if err != nil {
			return nil, "", nil, err
		}
		url, stop = q.URL, q.Stop
	}
	db, err = database.Open(ctx, database.Options{URL: url, BusyTimeout: config.Default().Database.BusyTimeout})
	if err != nil {
		stop()
		return nil, "", nil, err
	}
	if _, err := db.Migrate(ctx); err != nil {
		db.Close()
		stop()
		return nil, "", nil, err
	}
	return db, url, func() { db.Close(); stop() }, nil
}

// consumerRun ingests the stream through a new consumer and returns the
// time from its spawn until jetstream_cursor holds the last event.
func (g *ingestRig) consumerRun(ctx context.Context) (time.Duration, error) {
	db, url, done, err := g.newDB(ctx, "consumer")
	if err != nil {
		return 0, err
	}
	defer done()
	grant, err := lease.NewStore(db, ingestTTL).Acquire(ctx, consumer.LeaseName, ingestHolder)
	if err != nil {
		return 0, err
	}
	if !grant.Granted {
		return 0, fmt.Errorf("lease %s on a new database not granted: %+v", consumer.LeaseName, grant)
	}
	custody := fence.Custody{Lease: consumer.LeaseName, Holder: ingestHolder, Fence: grant.Fence}
	cfg := config.Default()
	cfg.Jetstream.URLs = []string{g.url}
	reg := prometheus.NewRegistry()
	pm, err := processor.NewMetrics(reg)
	if err != nil {
		return 0, err
	}
	w, err := consumer.Worker(statscache.New, pm)(workers.Deps{Config: cfg, DB: db, Log: zerolog.Nop(), Metrics: reg, Instance: ingestHolder})
	if err != nil {
		return 0, err
	}
	// Its own pool, so polling never waits behind the consumer's.
	reader, err := database.Open(ctx, database.Options{URL: url, BusyTimeout: cfg.Database.BusyTimeout, MaxOpenConns: 1})
	if err != nil {
		return 0, err
	}
	defer reader.Close()

	start := time.Now()
	pid := g.sys.Root.Spawn(w.Actor(custody))
	err = waitCursor(ctx, reader.DB, g.lastUS, ingestPoll, ingestStall, nil)
	took := time.Since(start)
	if serr := g.sys.Root.StopFuture(pid).Wait(); serr != nil && err == nil {
		err = fmt.Errorf("stop consumer: %w", serr)
	}
	if err != nil {
		return 0, fmt.Errorf("consumer run: %w", err)
	}
	return took, nil
}

// bareRun writes the recorded row images into a new database.
func (g *ingestRig) bareRun(ctx context.Context, c *Capture) (time.Duration, error) {
	db, _, done, err := g.newDB(ctx, "bare")
	if err != nil {
		return 0, err
	}
	defer done()
	start := time.Now()
	if err := c.Insert(ctx, db.DB); err != nil {
		return 0, fmt.Errorf("bare run: %w", err)
	}
	return time.Since(start), nil
}

// readCursor returns the stored jetstream_cursor, 0 before the first commit.
func readCursor(ctx context.Context, db *sql.DB) (int64, error) {
	var us int64
	err := database.Bounded(ctx, func() error {
		err := db.QueryRowContext(ctx, `SELECT time_us FROM jetstream_cursor WHERE id = 1`).Scan(&us)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		return err
	})
	return us, err
}

// waitCursor polls jetstream_cursor every poll until it reaches target
// (time_us), calling each (when not nil) after every poll that falls
// short. It fails when the cursor has not moved for stall, or ctx ends.
func waitCursor(ctx context.Context, db *sql.DB, target int64, poll, stall time.Duration, each func()) error {
	tick := time.NewTicker(poll)
	defer tick.Stop()
	last, moved := int64(-1), time.Now()
	for {
		us, err := readCursor(ctx, db)
		if err != nil {
			return err
		}
		if us >= target {
			return nil
		}
		if each != nil {
			each()
		}
		if us != last {
			last, moved = us, time.Now()
		} else if time.Since(moved) > stall {
			return fmt.Errorf("jetstream_cursor stuck at %d for %v (want %d)", us, stall, target)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// median returns the median of xs (the mean of the middle two for an even
// count), 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
