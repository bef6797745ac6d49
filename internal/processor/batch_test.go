package processor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
)

func commit(did string, us int64, op, collection, rkey string, record any) jetstream.Event {
	c := &jetstream.Commit{Operation: op, Collection: collection, RKey: rkey}
	if record != nil {
		raw, _ := json.Marshal(record)
		c.Record = raw
	}
	return jetstream.Event{DID: did, TimeUS: us, Kind: jetstream.KindCommit, Commit: c}
}

func tagRecord(repo, tag, digest string) map[string]any {
	return map[string]any{"repository": repo, "tag": tag, "manifestDigest": digest, "createdAt": "2026-01-02T03:04:05Z"}
}

func TestAnEventTheDatabaseRefusesIsSkippedAndTheRestOfTheBatchLands(t *testing.T) {
	db := testsupport.OpenDB(t)
	// A constraint only this test has: the database refuses one tag name.
	if _, err := db.Exec(`CREATE TRIGGER refuse_boom BEFORE INSERT ON tags WHEN NEW.tag = 'boom'
BEGIN SELECT RAISE(ABORT, 'tag boom is refused'); END`); err != nil {
		t.Fatal(err)
	}
	const alice = "did:plc:alice"
	events := []jetstream.Event{
		commit(alice, 10, "create", processor.CollectionTag, "t1", tagRecord("app", "one", "sha256:1")),
		commit(alice, 11, "create", processor.CollectionTag, "t2", tagRecord("app", "boom", "sha256:2")),
		commit(alice, 12, "create", processor.CollectionTag, "t3", tagRecord("app", "three", "sha256:3")),
	}
	reg := prometheus.NewRegistry()
	m, _ := processor.NewMetrics(reg)
	var logs bytes.Buffer
	p := processor.New(processor.Options{Log: zerolog.New(&logs), Metrics: m})
	res, err := p.Apply(context.Background(), db, unfenced, events)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if res.Applied != 2 || res.Skipped[processor.ReasonDatabase] != 1 || res.MaxTimeUS != 12 {
		t.Fatalf("result %+v: want 2 applied, 1 db_error skip, max time 12", res)
	}
	var tags []string
	rows, err := db.Query(`SELECT tag FROM tags ORDER BY tag`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		tags = append(tags, s)
	}
	rows.Close()
	if strings.Join(tags, ",") != "one,three" {
		t.Fatalf("tags = %v, want one,three", tags)
	}
	// The refused event's user row, written before the refusal, is rolled back with it: alice exists only once.
	if n := countRows(t, db, "users"); n != 1 {
		t.Fatalf("users = %d, want 1", n)
	}
	if got := metricSum(t, reg, "appview_processor_skipped_total"); got != 1 {
		t.Fatalf("skipped metric = %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "tag boom is refused") {
		t.Fatalf("the refusal is not logged: %s", logs.String())
	}
}

func TestInvalidRecordsAreSkippedByReasonWithSampledLogging(t *testing.T) {
	db := testsupport.OpenDB(t)
	const bob = "did:plc:bob"
	long := strings.Repeat("x", 300)
	var events []jetstream.Event
	add := func(collection, rkey string, record any) {
		events = append(events, commit(bob, int64(len(events)+1), "create", collection, rkey, record))
	}
	add(processor.CollectionManifest, "m1", map[string]any{"repository": "app", "mediaType": "x", "schemaVersion": 2, "createdAt": "2026-01-01T00:00:00Z"})
	add(processor.CollectionManifest, "m2", map[string]any{"repository": long, "digest": "sha256:1", "mediaType": "x", "schemaVersion": 2, "createdAt": "2026-01-01T00:00:00Z"})
	add(processor.CollectionManifest, "m3", map[string]any{"repository": "app", "digest": "sha256:1", "mediaType": "x", "schemaVersion": 2, "createdAt": "soon"})
	add(processor.CollectionManifest, "m4", map[string]any{"repository": "app", "digest": 5})
	add(processor.CollectionStats, "s1", map[string]any{"ownerDid": bob, "repository": "app", "pullCount": -3, "pushCount": 0, "updatedAt": "2026-01-01T00:00:00Z"})
	add(processor.CollectionStar, "st1", map[string]any{"subject": "at://did:plc:x/app.bsky.feed.post/1", "createdAt": "2026-01-01T00:00:00Z"})
	add(processor.CollectionProfile, "notself", map[string]any{"createdAt": "2026-01-01T00:00:00Z"})
	add("io.atcr.future.thing", "f1", map[string]any{})
	add("app.bsky.feed.post", "p1", map[string]any{"text": "hi"})
	events = append(events, jetstream.Event{DID: bob, TimeUS: 100, Kind: jetstream.KindCommit})
	for i := range 30 {
		add(processor.CollectionTag, fmt.Sprint("x", i), map[string]any{"repository": "app"})
	}
	var logs bytes.Buffer
	p := processor.New(processor.Options{Log: zerolog.New(&logs), LogBurst: 5})
	res, err := p.Apply(context.Background(), db, unfenced, events)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		processor.ReasonMissingField: 31, processor.ReasonTooLong: 1, processor.ReasonBadValue: 4,
		processor.ReasonMalformedRecord:   1,
		processor.ReasonUnknownCollection: 1, processor.ReasonNotATCR: 1, processor.ReasonMalformedEvent: 1,
	}
	for reason, n := range want {
		if res.Skipped[reason] != n {
			t.Errorf("skipped[%s] = %d, want %d (all: %v)", reason, res.Skipped[reason], n, res.Skipped)
		}
	}
	if res.Applied != 0 || res.MaxTimeUS != 100 {
		t.Errorf("result %+v: want nothing applied and max time 100", res)
	}
	for _, table := range registryTables {
		if table == "record_tombstones" {
			continue
		}
		if n := countRows(t, db, table); n != 0 {
			t.Errorf("%s has %d rows after only invalid events", table, n)
		}
	}
	// Each logged reason has its own burst of 5 (not_atcr and
	// unknown_collection are counted, never logged): the 31 missing
	// fields cannot hide the other reasons' lines.
	for reason, n := range want {
		if reason == processor.ReasonNotATCR || reason == processor.ReasonUnknownCollection {
			n = 0
		}
		if got := strings.Count(logs.String(), `"reason":"`+reason+`"`); got != min(n, 5) {
			t.Errorf("logged %d %s lines for %d such events, want %d:\n%s", got, reason, n, min(n, 5), logs.String())
		}
	}
}

func TestHoldDIDIsDerivedFromALegacyHoldEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"https://hold01.example.com":      "did:web:hold01.example.com",
		"https://Hold01.Example.com/":     "did:web:hold01.example.com",
		"https://hold.example.com:8443":   "did:web:hold.example.com%3A8443",
		"https://example.com/holds/north": "did:web:example.com:holds:north",
		"http://127.0.0.1:9000/":          "did:web:127.0.0.1%3A9000",
		// One hold, one DID: the default port and a trailing dot are
		// spellings of the same URL.
		"https://hold01.example.com:443":    "did:web:hold01.example.com",
		"http://hold01.example.com:80/":     "did:web:hold01.example.com",
		"https://hold01.example.com./":      "did:web:hold01.example.com",
		"https://HOLD01.example.com.:8443/": "did:web:hold01.example.com%3A8443",
		"http://hold01.example.com:443":     "did:web:hold01.example.com%3A443",
	} {
		got, err := processor.HoldDIDFromEndpoint(in)
		if err != nil || got != want {
			t.Errorf("HoldDIDFromEndpoint(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := processor.HoldDIDFromEndpoint("hold01.example.com"); err == nil {
		t.Error("a bare host was accepted as a holdEndpoint URL")
	}
	if _, err := processor.HoldDIDFromEndpoint("ftp://x"); err == nil {
		t.Error("an ftp URL was accepted as a holdEndpoint URL")
	}
}

func TestOlderHoldStatsAreIgnoredAndTheAggregateIsTheSumOverHolds(t *testing.T) {
	db := testsupport.OpenDB(t)
	const owner, h1, h2 = "did:plc:owner", "did:web:h1.example", "did:web:h2.example"
	stats := func(hold string, us int64, rev string, pull, push int, updatedAt string) jetstream.Event {
		ev := commit(hold, us, "create", processor.CollectionStats, "rk", map[string]any{
			"ownerDid": owner, "repository": "app", "pullCount": pull, "pushCount": push,
			"updatedAt": updatedAt, "lastPull": updatedAt})
		ev.Commit.Rev = rev
		return ev
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	custody := acquire(t, db, "jetstream-consumer", "me")
	res, err := p.Apply(context.Background(), db, custody, []jetstream.Event{
		stats(h1, 1, "3lrnqkdzhdq2c", 10, 1, "2026-01-01T00:00:10Z"),
		stats(h2, 2, "3lrnqkdzhdq23", 5, 2, "2026-01-01T00:00:20Z"),
		stats(h1, 3, "3lrnqkdzhdq2a", 3, 0, "2026-01-01T00:00:05Z"), // late: an older rev, ignored
		stats(h1, 4, "3lrnqkdzhdq2d", 12, 1, "2026-01-01T00:00:30Z"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != 3 || res.Unchanged != 1 || len(res.HoldStats) != 3 {
		t.Fatalf("result %+v: want 3 applied, 1 unchanged", res)
	}
	var pull, push, lastPull, fence int64
	if err := db.QueryRow(`SELECT pull_count, push_count, last_pull, fence FROM repository_stats WHERE did = ? AND repository = 'app'`, owner).
		Scan(&pull, &push, &lastPull, &fence); err != nil {
		t.Fatal(err)
	}
	if pull != 17 || push != 3 || lastPull != 1767225630000 || fence != custody.Fence {
		t.Fatalf("repository_stats = pull %d push %d last_pull %d fence %d; want 17, 3, 1767225630000, %d",
			pull, push, lastPull, fence, custody.Fence)
	}
}

// acquire takes a lease for the test and returns its custody.
const time60s = 60 * time.Second

func acquire(t testing.TB, db *database.DB, name, holder string) fence.Custody {
	t.Helper()
	return testsupport.Custody(t, db, name, holder, time60s)
}

// The consumer's and the backfill's processors are given the collectors
// built once per process: both count into the one set registered, and a
// second set cannot be registered beside it.
func TestTwoProcessorsShareOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := processor.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := processor.NewMetrics(reg); err == nil {
		t.Fatal("a second set of processor collectors registered beside the first")
	}
	db := testsupport.OpenDB(t)
	ev := []jetstream.Event{commit("did:plc:x", 1, "create", "app.bsky.feed.like", "r", map[string]any{})}
	for range 2 {
		if _, err := processor.New(processor.Options{Log: zerolog.Nop(), Metrics: m}).Apply(context.Background(), db, unfenced, ev); err != nil {
			t.Fatal(err)
		}
	}
	if got := metricSum(t, reg, "appview_processor_skipped_total"); got != 2 {
		t.Fatalf("shared counter = %v, want 2", got)
	}
}
