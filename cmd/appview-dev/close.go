package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
)

// closeEvent is one well-formed Jetstream v1 commit event, enough to put
// the client's handler to work.
const closeEvent = `{"did":"did:plc:benchclose","time_us":1750000000000000,"kind":"commit",` +
	`"commit":{"rev":"3l","operation":"create","collection":"io.atcr.tag","rkey":"latest",` +
	`"record":{"$type":"io.atcr.tag","repository":"app","tag":"latest",` +
	`"manifestDigest":"sha256:0000000000000000000000000000000000000000000000000000000000000000",` +
	`"createdAt":"2025-06-15T00:00:00Z"},"cid":"bafy"}}`

// closeEventUS is closeEvent's time_us.
const closeEventUS = 1750000000000000

// closeLatency measures jetstream.Client.Close, one client at a time,
// against a loopback jetstream.ReplayServer of closeEvent: "silent" asks
// for a cursor past the event (the server then says nothing, as one that
// went silent without closing), "blocked" gets the event and its handler
// holds the batch until its context ends. The brief's promise is 100 ms.
func (r *runner) closeLatency(ctx context.Context) error {
	dir, err := r.scratch("jetstream-close")
	if err != nil {
		return err
	}
	file := filepath.Join(dir, "one-event.jsonl")
	if err := os.WriteFile(file, []byte(closeEvent+"\n"), 0o644); err != nil {
		return err
	}
	srv, err := jetstream.NewReplayServer(jetstream.ReplayOptions{File: file}, zerolog.Nop())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	<-srv.Listening()
	for _, c := range []struct {
		name   string
		cursor int64
	}{{"silent", closeEventUS + 1}, {"blocked", 0}} {
		samples, err := measureClose(ctx, srv, r.n.close, c.cursor)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		r.figure("jetstream_close_p50_ms_"+c.name, ms(percentile(samples, 50)), "ms")
		r.figure("jetstream_close_p99_ms_"+c.name, ms(percentile(samples, 99)), "ms")
	}
	return nil
}

// measureClose runs rounds clients against srv from cursor and returns how
// long each Close took once the client was connected (from cursor 0: once
// its handler had the batch).
func measureClose(ctx context.Context, srv *jetstream.ReplayServer, rounds int, cursor int64) ([]time.Duration, error) {
	samples := make([]time.Duration, 0, rounds)
	for range rounds {
		entered := make(chan struct{}, 1)
		handler := func(ctx context.Context, b jetstream.Batch) error {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-ctx.Done()
			return ctx.Err()
		}
		conns := srv.Connections()
		c, err := jetstream.NewClient(jetstream.ClientOptions{URLs: []string{srv.URL()},
			Cursor: func() int64 { return cursor }}, handler)
		if err != nil {
			return nil, err
		}
		ran := make(chan error, 1)
		go func() { ran <- c.Run(context.Background()) }()
		if err := waitReady(ctx, func() bool {
			if cursor == 0 {
				return len(entered) > 0
			}
			return srv.Connections() > conns
		}); err != nil {
			c.Close()
			return nil, err
		}
		start := time.Now()
		c.Close()
		samples = append(samples, time.Since(start))
		if err := <-ran; err != nil {
			return nil, fmt.Errorf("Run: %w", err)
		}
	}
	return samples, nil
}

// waitReady polls ready every 100 µs for up to 10 s.
func waitReady(ctx context.Context, ready func() bool) error {
	deadline := time.Now().Add(10 * time.Second)
	for !ready() {
		if time.Now().After(deadline) {
			return errors.New("the client never got going")
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(100 * time.Microsecond)
	}
	return nil
}
