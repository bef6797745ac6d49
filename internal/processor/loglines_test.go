package processor_test

import (
	"bufio"
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// maxLine bounds a skip line: a few fields of at most logval.MaxBytes each.
const maxLine = 4 << 10

// A skipped event's log line stays short whatever the event carries: its
// values are cut with a marker. A value quoted in full once made a 122 KB
// line.
func TestSkipLinesAreBoundedWhateverTheEventCarries(t *testing.T) {
	db := testsupport.OpenDB(t)
	huge := "did:plc:" + strings.Repeat("x", 200_000) // not a DID: over 2,048 bytes
	events := []jetstream.Event{
		// A value of the record quoted in the error.
		commit("did:web:hold.example", 1, "create", processor.CollectionStats, "rk", map[string]any{
			"ownerDid": huge, "repository": "app", "pullCount": 1, "pushCount": 1, "updatedAt": "2026-01-01T00:00:00Z"}),
		// The event's own DID, logged as a field and quoted in the error.
		commit(huge, 2, "create", processor.CollectionTag, "t1", tagRecord("app", "latest", "sha256:1")),
	}
	var logs bytes.Buffer
	p := processor.New(processor.Options{Log: zerolog.New(&logs)})
	res, err := p.Apply(context.Background(), db, unfenced, events)
	if err != nil {
		t.Fatal(err)
	}
	if res.Skipped[processor.ReasonBadValue] != 2 {
		t.Fatalf("result %+v: want both skipped as bad_value", res)
	}
	lines := 0
	sc := bufio.NewScanner(&logs)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines++
		if n := len(sc.Bytes()); n > maxLine || !bytes.Contains(sc.Bytes(), []byte("…[truncated ")) {
			t.Errorf("a %d-byte skip line (limit %d, with a truncation marker): %.300s", n, maxLine, sc.Bytes())
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("a log line over 1 MiB: %v", err)
	}
	if lines != 2 {
		t.Fatalf("%d lines logged, want 2", lines)
	}
}
