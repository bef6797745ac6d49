package main

import (
	"context"
	"os"
	"strings"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/synth"
)

// atcrPrefix is what the consumer's default collection filter, "io.atcr.*"
// (config.Default: jetstream.collections), matches.
const atcrPrefix = "io.atcr."

// delivered reports whether a Jetstream server filtering on "io.atcr.*"
// sends e to the consumer: io.atcr commits, and every event without a
// collection (identity and account events always pass, as Jetstream does).
func delivered(e *jetstream.Event) bool {
	c := e.Collection()
	return c == "" || strings.HasPrefix(c, atcrPrefix)
}

// atcrCommit reports whether e is a commit to an io.atcr collection: the
// traffic ingest_ratio is defined on.
func atcrCommit(e *jetstream.Event) bool {
	return e.Kind == jetstream.KindCommit && e.Commit != nil && strings.HasPrefix(e.Commit.Collection, atcrPrefix)
}

// writeStream streams the synthetic traffic o to path as JSONL, one
// Jetstream v1 event a line (the encoding of synth.Write), keeping only the
// events keep accepts (nil keeps all) and passing each kept one to seen
// (nil: none) in stream order. Memory is the generator's model, bounded
// whatever o.Events is. It returns how many events it wrote.
func writeStream(ctx context.Context, path string, o synth.Options, keep func(*jetstream.Event) bool, seen func(*jetstream.Event)) (int, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := synth.WriteEvents(ctx, f, synth.NewGenerator(o), keep, seen)
	if err != nil {
		return n, err
	}
	return n, f.Close()
}
