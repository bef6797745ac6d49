package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/synth"
	"github.com/atcr-io/appview/internal/testsupport"
)

// stream is a small synthetic stream and the state it must produce.
func stream(t *testing.T) ([]jetstream.Event, *synth.Expected) {
	t.Helper()
	g := synth.NewGenerator(synth.Options{Seed: 3, Events: 300})
	var evs []jetstream.Event
	for {
		ev, ok := g.Next()
		if !ok {
			return evs, g.Expected()
		}
		evs = append(evs, ev)
	}
}

// openAt opens the file database at path as synth-check does.
func openAt(path string) func(context.Context) (*database.DB, error) {
	cfg := config.Default()
	cfg.Database.URL = "file:" + path
	return func(ctx context.Context) (*database.DB, error) { return cli.OpenExisting(ctx, cfg) }
}

func TestSynthCheckWaitIsDoneOnceThePositionReachesTheLastEventAndTheStateMatches(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	events, exp := stream(t)
	var out bytes.Buffer
	result := make(chan error, 1)
	go func() {
		// The database does not exist yet: it is waited for.
		result <- waitDone(context.Background(), expectation{openAt(path), exp, "s.json", time.Minute, 5 * time.Millisecond}, &out)
	}()

	db := testsupport.OpenDBAt(t, path)
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	if _, err := p.Apply(context.Background(), db, fence.Custody{Lease: "test"}, events); err != nil {
		t.Fatal(err)
	}
	// Every row is in, but the position has not reached the last event.
	if done, why, _ := progress(context.Background(), db.DB, exp); done || !strings.Contains(why, "position") {
		t.Fatalf("progress before the position moved: done %v, %q; want not done, naming the position", done, why)
	}
	select {
	case err := <-result:
		t.Fatalf("waitDone returned before the position reached the last event: %v, %q", err, out.String())
	default:
	}
	if _, err := db.Exec(`INSERT INTO jetstream_cursor (id, time_us, updated_at) VALUES (1, ?1, 0)
		ON CONFLICT(id) DO UPDATE SET time_us = excluded.time_us`, exp.LastUS); err != nil {
		t.Fatal(err)
	}
	if err := <-result; err != nil {
		t.Fatalf("waitDone: %v\n%s", err, out.String())
	}
	if want := "done: 300 events consumed, the database equals s.json\n"; out.String() != want {
		t.Fatalf("output %q, want %q", out.String(), want)
	}
}

func TestSynthCheckWaitGivesUpSayingWhatIsMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	db := testsupport.OpenDBAt(t, path)
	_, exp := stream(t)
	// Positioned at the end, but nothing applied: the state differs.
	if _, err := db.Exec(`INSERT INTO jetstream_cursor (id, time_us, updated_at) VALUES (1, ?1, 0)`, exp.LastUS); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := waitDone(context.Background(), expectation{openAt(path), exp, "s.json", 50 * time.Millisecond, 5 * time.Millisecond}, &out)
	if err == nil || !strings.Contains(err.Error(), "not done after 50ms") || !strings.Contains(err.Error(), "differs") {
		t.Fatalf("waitDone on a database that differs: %v; want not done, saying it differs", err)
	}
	if !strings.Contains(out.String(), "missing row") {
		t.Fatalf("output %q lists no difference", out.String())
	}
	if got := cli.Exit("appview-dev", err); got != cli.ExitFailure {
		t.Fatalf("exit %d, want %d", got, cli.ExitFailure)
	}
}
