package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/synth"
)

// Serving-rate sizes.
const (
	// replayServeEventsFull and replayServeEventsQuick are the stream's
	// length (every event is served: no filter).
	replayServeEventsFull, replayServeEventsQuick = 100_000, 5_000
	// replayServeBound bounds one pass of the stream; the first pass
	// includes compressing every frame (tens of seconds for 100k events
	// on a busy 2-core host).
	replayServeBound = 5 * time.Minute
)

// replayServe measures replay_serve_events_per_s: how fast a
// jetstream.ReplayServer (what `appview jetstream-replay` runs) sends a
// synthetic stream, compressed, to one loopback subscriber that only
// reads the frames. It is the server's own rate: replay_1m_events_per_s
// is bounded by the consumer that applies the events, this one is not.
func (r *runner) replayServe(ctx context.Context) error {
	dir, err := r.scratch("replay-serve")
	if err != nil {
		return err
	}
	n := replayServeEventsFull
	if r.o.Quick {
		n = replayServeEventsQuick
	}
	stream := filepath.Join(dir, "stream.jsonl")
	if _, err := writeStream(ctx, stream, synth.Options{Seed: replaySeed, Events: n}, nil, nil); err != nil {
		return fmt.Errorf("write stream: %w", err)
	}
	srv, err := jetstream.NewReplayServer(jetstream.ReplayOptions{File: stream, Listen: "127.0.0.1:0"}, zerolog.Nop())
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe(context.Background()) }()
	defer func() { srv.Close(); <-served }()
	select {
	case <-srv.Listening():
	case err := <-served:
		return fmt.Errorf("replay server: %w", err)
	}
	// The first pass compresses every frame (once per server); the
	// second is timed.
	if _, err := readFrames(ctx, srv.URL(), n, replayServeBound); err != nil {
		return fmt.Errorf("first pass: %w", err)
	}
	took, err := readFrames(ctx, srv.URL(), n, replayServeBound)
	if err != nil {
		return err
	}
	r.figure("replay_serve_events_per_s", float64(n)/took.Seconds(), "events/s")
	return nil
}

// readFrames subscribes to url with compression and reads n frames
// within bound; it returns the time from the dial to the last frame.
func readFrames(ctx context.Context, url string, n int, bound time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	start := time.Now()
	conn, _, err := websocket.DefaultDialer.DialContext(ctx, url+"?compress=true", nil)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(d)
	}
	for k := range n {
		if _, _, err := conn.ReadMessage(); err != nil {
			return 0, fmt.Errorf("frame %d of %d: %w", k+1, n, err)
		}
	}
	return time.Since(start), nil
}
