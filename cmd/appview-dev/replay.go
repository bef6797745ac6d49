package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/gorilla/websocket"

	"github.com/atcr-io/appview/actors/consumer"
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/harness"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/synth"
)

// Long-replay sizes and bounds.
const (
	// replayEventsFull and replayEventsQuick are the stream's length.
	replayEventsFull, replayEventsQuick = 1_000_000, 5_000
	// replaySeed selects the synthetic stream.
	replaySeed = 7
	// replayPoll is how often progress (jetstream_cursor) and RSS are read.
	replayPoll = 100 * time.Millisecond
	// replayStall bounds a stretch with no cursor progress.
	replayStall = time.Minute
	// replayPrepare bounds loading the stream into the replay server and
	// its compressing every frame (about 15 s and 35 s for 1M events on
	// 2 cores).
	replayPrepare = 5 * time.Minute
)

// replayMarks are the points of the stream, in percent of its events,
// where serve's RSS is read.
var replayMarks = []int{10, 50, 100}

// replayRSS replays a long synthetic stream through a real `appview serve`
// (every default worker, production lease timing) from a real `appview
// jetstream-replay` process, and reads serve's RSS as its cursor passes
// 10%, 50% and 100% of the stream.
func (r *runner) replayRSS(ctx context.Context) error {
	dir, err := r.scratch("replay-1m")
	if err != nil {
		return err
	}
	n := replayEventsFull
	if r.o.Quick {
		n = replayEventsQuick
	}
	stream := filepath.Join(dir, "stream.jsonl")
	start := time.Now()
	marks, err := writeMarkedStream(ctx, stream, synth.Options{Seed: replaySeed, Events: n}, replayMarks)
	if err != nil {
		return fmt.Errorf("write stream: %w", err)
	}
	r.note("replay: %d synthetic events written in %v", n, time.Since(start).Round(time.Millisecond))

	c := harness.NewCluster(r.o.Bin, dir)
	defer c.Close()
	addr, err := harness.FreeLoopbackAddr()
	if err != nil {
		return err
	}
	start = time.Now()
	replay, err := harness.StartCommand(filepath.Join(dir, "replay"), "replay", r.o.Bin, "jetstream-replay", "--file", stream, "--listen", addr)
	if err != nil {
		return err
	}
	c.Adopt(replay)
	url := "ws://" + addr + "/subscribe"
	if err := primeReplay(ctx, replay, url); err != nil {
		return err
	}
	r.note("replay: server loaded and compressed the stream in %v", time.Since(start).Round(time.Millisecond))

	def := config.Default()
	spec := r.spec("file:" + filepath.Join(dir, "appview.db"))
	spec.LogLevel = "info"
	spec.Timing = harness.Timing{TTL: def.Leases.TTL, RenewInterval: def.Leases.RenewInterval,
		RenewDeadline: def.Leases.RenewDeadline, RetryInterval: def.Leases.RetryInterval}
	spec.Set = map[string]any{"jetstream.urls": []string{url}}
	inst, err := c.Start(ctx, spec)
	if err != nil {
		return err
	}
	reader, err := database.Open(ctx, database.Options{URL: spec.DatabaseURL, BusyTimeout: def.Database.BusyTimeout, MaxOpenConns: 1})
	if err != nil {
		return err
	}
	defer reader.Close()

	start = time.Now()
	cpu := sampleCPU(inst.Pid(), replay.Pid())
	rss := make([]float64, len(marks))
	at := make([]time.Duration, len(marks))
	var peak int64
	for k, target := range marks {
		err := waitCursor(ctx, reader.DB, target, replayPoll, replayStall, func() {
			if b, err := inst.RSS(); err == nil {
				peak = max(peak, b)
			}
		})
		if err != nil {
			return fmt.Errorf("%w (serve's last lines:\n%s)", err, inst.Tail(8))
		}
		b, err := inst.RSS()
		if err != nil {
			return err
		}
		rss[k], at[k] = float64(b)/(1<<20), time.Since(start)
		peak = max(peak, b)
		r.note("replay: %d%% of %d events processed after %v; serve RSS %.1f MB",
			replayMarks[k], n, at[k].Round(time.Millisecond), rss[k])
	}
	if others, ok := cpu.others(sampleCPU(inst.Pid(), replay.Pid()), time.Since(start)); ok {
		r.note("replay: processes other than the bench, serve and the replay server used %.2f CPUs meanwhile", others)
	}
	for _, e := range inst.Log.Events() {
		if e.Lease == consumer.LeaseName && (e.Event == harness.LeaseLost || e.Event == harness.WorkerFailed) {
			r.note("replay: the consumer was interrupted during the run: %s", e.Line)
		}
	}
	first, last := 0, len(marks)-1
	rate := float64(n*(replayMarks[last]-replayMarks[first])/100) / (at[last] - at[first]).Seconds()
	r.note("replay: peak serve RSS %.1f MB (sampled every %v); growth from %d%% to %d%%: %.3f",
		float64(peak)/(1<<20), replayPoll, replayMarks[1], replayMarks[last], rss[last]/rss[1])
	for k, p := range replayMarks {
		r.figure(fmt.Sprintf("replay_1m_rss_mb_at_%dpct", p), rss[k], "MB")
	}
	r.figure("replay_1m_rss_growth_ratio", rss[last]/rss[first], "ratio")
	r.figure("replay_1m_events_per_s", rate, "events/s")
	return nil
}

// writeMarkedStream writes the whole synthetic stream o to path (see
// writeStream) and returns, for each percentage p in percents, the
// time_us of the last event the consumer receives (see delivered) among
// the first p% of the stream: its cursor is there once that much of the
// stream is processed. A mark is 0 when no such event exists.
func writeMarkedStream(ctx context.Context, path string, o synth.Options, percents []int) ([]int64, error) {
	marks := make([]int64, len(percents))
	var seen int
	var lastDelivered int64
	_, err := writeStream(ctx, path, o, nil, func(e *jetstream.Event) {
		seen++
		if delivered(e) {
			lastDelivered = e.TimeUS
		}
		for k, p := range percents {
			if seen == o.Events*p/100 {
				marks[k] = lastDelivered
			}
		}
	})
	return marks, err
}

// primeReplay waits until the replay process serves, then subscribes
// once with compression and reads one frame: the server compresses every
// frame of the stream on its first compressed subscription, which must
// not count as serve's time (a real Jetstream compresses as it records).
func primeReplay(ctx context.Context, replay *harness.Instance, url string) error {
	ctx, cancel := context.WithTimeout(ctx, replayPrepare)
	defer cancel()
	if _, err := replay.Wait(ctx, harness.Msg("jetstream replay: serving")); err != nil {
		return fmt.Errorf("%w (last lines:\n%s)", err, replay.Tail(8))
	}
	conn, _, err := websocket.DefaultDialer.DialContext(ctx, url+"?compress=true", nil)
	if err != nil {
		return fmt.Errorf("prime replay server: %w", err)
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(d)
	}
	if _, _, err := conn.ReadMessage(); err != nil {
		return fmt.Errorf("prime replay server: %w", err)
	}
	return nil
}
