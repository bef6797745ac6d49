package synth_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/synth"
)

func TestSameSeedWritesTheSameStream(t *testing.T) {
	var a, b, c bytes.Buffer
	o := synth.Options{Seed: 7, Events: 3000}
	if _, err := synth.Write(context.Background(), &a, o); err != nil {
		t.Fatal(err)
	}
	if _, err := synth.Write(context.Background(), &b, o); err != nil {
		t.Fatal(err)
	}
	o.Seed = 8
	if _, err := synth.Write(context.Background(), &c, o); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two runs with seed 7 differ")
	}
	if bytes.Equal(a.Bytes(), c.Bytes()) {
		t.Fatal("seeds 7 and 8 wrote the same stream")
	}
}

func TestStreamIsJetstreamJSONLWithGrowingTimeAndEveryShape(t *testing.T) {
	var buf bytes.Buffer
	exp, err := synth.Write(context.Background(), &buf, synth.Options{Seed: 1, Events: 5000})
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&buf)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var last, lastSent int64
	n := 0
	seen := map[string]bool{}
	for sc.Scan() {
		var ev jetstream.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %d: %v", n+1, err)
		}
		if ev.TimeUS <= last {
			t.Fatalf("line %d: time_us %d after %d", n+1, ev.TimeUS, last)
		}
		last = ev.TimeUS
		n++
		switch ev.Kind {
		case jetstream.KindCommit:
			seen[ev.Commit.Collection+" "+ev.Commit.Operation] = true
			if strings.HasPrefix(ev.Commit.Collection, "io.atcr.") {
				lastSent = ev.TimeUS
			}
		default:
			seen[ev.Kind] = true
			lastSent = ev.TimeUS
		}
	}
	if exp.LastUS != lastSent {
		t.Errorf("expected.LastUS %d, want %d: the last event a server filtering on io.atcr.* sends", exp.LastUS, lastSent)
	}
	if n != 5000 || exp.Events != 5000 || exp.MaxTimeUS != last {
		t.Fatalf("lines %d, expected.Events %d, max %d vs %d", n, exp.Events, exp.MaxTimeUS, last)
	}
	for _, want := range []string{
		"io.atcr.manifest create", "io.atcr.manifest update", "io.atcr.manifest delete",
		"io.atcr.tag create", "io.atcr.tag update", "io.atcr.tag delete",
		"io.atcr.sailor.star create", "io.atcr.sailor.star delete",
		"io.atcr.hold.stats create", "io.atcr.hold.stats delete",
		"io.atcr.sailor.profile create", "io.atcr.sailor.profile delete",
		"io.atcr.repo.page create", "io.atcr.repo.page update", "io.atcr.repo.page delete",
		"io.atcr.hold.captain create", "io.atcr.hold.crew create", "io.atcr.hold.crew delete",
		"app.bsky.feed.like create", "identity", "account",
	} {
		if !seen[want] {
			t.Errorf("no %q event in 5000", want)
		}
	}
	if len(exp.PushEventKeys) == 0 || len(exp.Tables["repository_stats"]) == 0 {
		t.Errorf("expected state has %d push keys and %d repository_stats rows", len(exp.PushEventKeys), len(exp.Tables["repository_stats"]))
	}
}

// The expected state holds the date-like values go-libsql would rewrite
// on a plain read, so the equality tests built on Diff catch a reader
// that forgets database.Text.
func TestExpectedStateHoldsDateLikeTagsRepositoriesAnnotationsAndDescriptions(t *testing.T) {
	exp, err := synth.Write(context.Background(), &bytes.Buffer{}, synth.Options{Seed: 1, Events: 5000})
	if err != nil {
		t.Fatal(err)
	}
	isDate := func(s string) bool {
		_, d := time.Parse(time.DateOnly, s)
		_, r := time.Parse(time.RFC3339Nano, s)
		return d == nil || r == nil
	}
	found := map[string]bool{}
	for key := range exp.Tables["tags"] { // did|repository|tag
		k := strings.Split(key, "|")
		found["tag"] = found["tag"] || isDate(k[2])
		found["repository"] = found["repository"] || isDate(k[1])
	}
	for _, row := range exp.Tables["manifests"] { // ...|annotations
		cols := strings.Split(row, "|")
		for _, a := range strings.Split(cols[len(cols)-1], ",") {
			v, ok := strings.CutPrefix(a, "org.opencontainers.image.created=")
			found["created annotation"] = found["created annotation"] || ok && isDate(v)
		}
	}
	for _, row := range exp.Tables["repo_pages"] { // rkey|description|...
		found["description"] = found["description"] || isDate(strings.Split(row, "|")[1])
	}
	for _, what := range []string{"tag", "repository", "created annotation", "description"} {
		if !found[what] {
			t.Errorf("no date-like %s in the expected state of 5000 events", what)
		}
	}
}
