package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/webhooks"
	"github.com/atcr-io/appview/internal/workers"
)

// bareConsumer is a consumer whose handle and resumeAt tests call
// directly (no client, no actor).
func bareConsumer(t *testing.T, db *database.DB, c fence.Custody, rewind time.Duration) *consumer {
	t.Helper()
	sys := testsupport.NewActorSystem(t)
	pos, _, err := LoadPosition(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	cons := newConsumer(Options{DB: db, Custody: c, Jetstream: config.Jetstream{Rewind: rewind}, Log: zerolog.Nop(),
		Processor: processor.New(processor.Options{Log: zerolog.Nop()}), enqueue: webhooks.EnqueueTx})
	cons.root, cons.pos = sys.Root, pos
	cons.stats = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink{} }))
	cons.disp = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink{} }))
	cons.cursor.Store(pos.TimeUS)
	return cons
}

func generateEvents(seed uint64, n int) []jetstream.Event {
	evs, _ := generate(seed, n)
	return evs
}

// numbered gives events sequence numbers from first on.
func numbered(events []jetstream.Event, first int64) []jetstream.Event {
	out := append([]jetstream.Event(nil), events...)
	for i := range out {
		out[i].Seq = first + int64(i)
	}
	return out
}

// On the host a position came from the consumer resumes by that host's
// seq exactly, whatever the time_us did; a seq is never sent elsewhere,
// and a restart (a new incarnation reading the stored row) does the same.
func TestASeqPositionResumesOnItsHostExactlyAndNeverElsewhere(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	events := numbered(generateEvents(61, 200), 1)
	// time_us jumps back by far more than any rewind in the middle.
	for i := 100; i < 200; i++ {
		events[i].TimeUS -= (30 * time.Second).Microseconds()
	}
	const a, b = "ws://a.example/xrpc/network.bsky.jetstream.subscribeEvents", "ws://b.example/subscribe"
	cons := bareConsumer(t, db, c, 5*time.Second)
	ctx := context.Background()
	if err := cons.handle(ctx, jetstream.Batch{URL: a, Events: events[:120], MaxSeq: 120}); err != nil {
		t.Fatal(err)
	}
	if got := cons.resumeAt(a); got != 120 {
		t.Fatalf("same host: cursor %d, want seq 120", got)
	}
	if got := cons.resumeAt(b); got < jetstream.CursorSeqMax {
		t.Fatalf("another host got cursor %d: a sequence number from host a", got)
	}
	// A new incarnation reads the stored row.
	again := bareConsumer(t, db, c, 5*time.Second)
	if got := again.resumeAt(a); got != 120 {
		t.Fatalf("after a restart: cursor %d, want seq 120 (no rewind)", got)
	}
	if got, want := again.resumeAt(b), sharedTime(events[:120])-(5*time.Second).Microseconds(); got != want {
		t.Fatalf("after a restart, another host: cursor %d, want the shared time minus the rewind %d", got, want)
	}
	// A replay of older seqs never moves the position back.
	if err := cons.handle(ctx, jetstream.Batch{URL: a, Events: events[50:60], MaxSeq: 60}); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := LoadPosition(ctx, db); p.Host != "a.example" || p.Seq != 120 {
		t.Fatalf("stored position %+v after a replay, want a.example seq 120", p)
	}
	// Frames that failed to decode still move the position (MaxSeq).
	if err := cons.handle(ctx, jetstream.Batch{URL: a, MaxSeq: 125, Failures: []*jetstream.DecodeError{{Class: jetstream.ClassUnknownType, Seq: 125}}}); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := LoadPosition(ctx, db); p.Seq != 125 {
		t.Fatalf("stored seq %d, want 125: the position did not move past skipped frames", p.Seq)
	}
	// Moving to host b (no seqs there) rewrites the position's host.
	if err := cons.handle(ctx, jetstream.Batch{URL: b, Events: generateEvents(62, 5)}); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := LoadPosition(ctx, db); p.Host != "b.example" || p.Seq != 0 {
		t.Fatalf("stored position %+v, want host b.example in time space", p)
	}
}

// A position stored before per-host positions (migration 7 keeps its
// time_us, with an empty host) resumes by time, as it did.
func TestAPositionFromBeforePerHostPositionsResumesByTime(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	stored := time.Now().Add(-time.Hour).UnixMicro()
	if _, err := db.Exec(`INSERT INTO jetstream_cursor (id, time_us, updated_at, fence) VALUES (1, ?, 0, ?)`, stored, c.Fence); err != nil {
		t.Fatal(err)
	}
	cons := bareConsumer(t, db, c, 5*time.Second)
	if got, want := cons.resumeAt("ws://x.example/xrpc/network.bsky.jetstream.subscribeEvents"), stored-(5*time.Second).Microseconds(); got != want {
		t.Fatalf("cursor %d, want the stored time_us minus the rewind %d", got, want)
	}
}

// A consumer that finds no position stores where it began (an empty host,
// the start time as its shared time) before it reads anything, so a holder
// killed before its first commit hands its successor that time: the
// successor resumes there less the rewind on a v2 endpoint, instead of at
// a later live tail with everything in between lost. The incarnation that
// stored it reads the live tail until its first event; a stale custody
// stores nothing.
func TestAConsumerWithNoPositionStoresWhereItBeganForItsSuccessor(t *testing.T) {
	db := testsupport.OpenDB(t)
	ctx := context.Background()
	first := acquire(t, db, "first")
	began := time.Now()
	p, anchored, err := testPipeline(db, first, nil, nil).anchor(ctx, began)
	if err != nil || !anchored {
		t.Fatalf("anchor on an empty database: anchored %v, %v", anchored, err)
	}
	if want := (Position{SharedUS: began.UnixMicro()}); p != want {
		t.Fatalf("stored position %+v, want %+v", p, want)
	}
	var fenceCol int64
	if err := db.QueryRow(`SELECT fence FROM jetstream_cursor WHERE id = 1`).Scan(&fenceCol); err != nil || fenceCol != first.Fence {
		t.Fatalf("anchor stored under fence %d (%v), want %d", fenceCol, err, first.Fence)
	}
	// The incarnation that anchored: live tail until an event arrives.
	const v2 = "ws://js.example/xrpc/network.bsky.jetstream.subscribeEvents"
	cons := bareConsumer(t, db, first, 5*time.Second)
	cons.anchored = true
	client, err := jetstream.NewClient(jetstream.ClientOptions{URLs: []string{v2}}, func(context.Context, jetstream.Batch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	cons.client = client
	if got := cons.resumeAt(v2); got != 0 {
		t.Fatalf("the anchoring incarnation dials with cursor %d before any event, want 0 (live tail)", got)
	}

	// The holder dies before its first commit; the successor (a new
	// custody) finds the anchor, stores nothing, and resumes from it.
	if _, err := db.Exec(`UPDATE leases SET expires_at = 0 WHERE name = ?1`, LeaseName); err != nil {
		t.Fatal(err)
	}
	next := acquire(t, db, "next")
	again, anchored, err := testPipeline(db, next, nil, nil).anchor(ctx, began.Add(time.Minute))
	if err != nil || anchored || again != p {
		t.Fatalf("second start: position %+v anchored %v (%v), want the first anchor %+v kept", again, anchored, err, p)
	}
	succ := bareConsumer(t, db, next, 5*time.Second)
	want := began.UnixMicro() - (5 * time.Second).Microseconds()
	for _, url := range []string{v2, "ws://other.example/xrpc/network.bsky.jetstream.subscribeEvents"} {
		if got := succ.resumeAt(url); got != want {
			t.Fatalf("successor on %s: cursor %d, want the anchor less the rewind %d", url, got, want)
		}
	}
	// On the legacy wire an anchor alone means no cursor: a legacy
	// endpoint may serve a capture older than the wall clock.
	if got := succ.resumeAt("ws://other.example/subscribe"); got != 0 {
		t.Fatalf("successor on a legacy endpoint: cursor %d, want 0 (no cursor)", got)
	}
	// The first batch replaces the anchor with a real position.
	if err := succ.handle(ctx, jetstream.Batch{URL: v2, Events: numbered(generateEvents(63, 5), 1), MaxSeq: 5}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := LoadPosition(ctx, db); got.Host != "js.example" || got.Seq != 5 {
		t.Fatalf("position after the first batch %+v, want js.example seq 5", got)
	}

	// A superseded holder never stores an anchor.
	if _, err := db.Exec(`DELETE FROM jetstream_cursor`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := testPipeline(db, first, nil, nil).anchor(ctx, began); !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("anchor under a superseded fence: %v, want fence.ErrSuperseded", err)
	}
	if _, ok, _ := LoadPosition(ctx, db); ok {
		t.Fatal("a superseded holder stored a position")
	}
}

// The rev a commit carries is recorded per repository; an older commit
// is skipped and counted, an equal one (one commit, several operations)
// applied; a #sync queues a re-read.
func TestStaleRevsAreSkippedAndSyncsQueueARereAD(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	ctx := context.Background()
	tag := func(rkey, rev, tagName string, us int64) jetstream.Event {
		return jetstream.Event{DID: "did:plc:u1", TimeUS: us, Kind: jetstream.KindCommit, Commit: &jetstream.Commit{
			Rev: rev, Operation: jetstream.OpCreate, Collection: processor.CollectionTag, RKey: rkey,
			Record: json.RawMessage(fmt.Sprintf(`{"repository":"r","tag":%q,"manifestDigest":"sha256:%064d","createdAt":"2026-01-01T00:00:00Z"}`, tagName, 1))}}
	}
	now := time.Now().UnixMicro()
	first := []jetstream.Event{tag("t1", "3l3qo2vutsw2c", "v1", now), tag("t2", "3l3qo2vutsw2c", "v2", now+1)}
	out, err := testPipeline(db, c, p, webhooks.EnqueueTx).prefix(ctx, part{host: "h", events: first})
	if err != nil || out.stale != 0 {
		t.Fatalf("first batch: %v, stale %d", err, out.stale)
	}
	older := []jetstream.Event{tag("t3", "3l3qo2vutsw2a", "old", now+2),
		{DID: "did:plc:u1", TimeUS: now + 3, Kind: jetstream.KindSync, Sync: &jetstream.Sync{DID: "did:plc:u1", Rev: "3l3qo2vutsw2d"}}}
	out, err = testPipeline(db, c, p, webhooks.EnqueueTx).prefix(ctx, part{host: "h", events: older})
	if err != nil || out.stale != 1 || out.syncs != 1 {
		t.Fatalf("second batch: %v, stale %d syncs %d, want 1 and 1", err, out.stale, out.syncs)
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM tags WHERE did = 'did:plc:u1'`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d tags (%v), want 2: the stale commit was applied", n, err)
	}
	var rev string
	if err := db.QueryRow(`SELECT CAST(rev AS BLOB) FROM repo_revs WHERE did = 'did:plc:u1'`).Scan(&rev); err != nil || rev != "3l3qo2vutsw2c" {
		t.Fatalf("recorded rev %q (%v)", rev, err)
	}
	if err := db.QueryRow(`SELECT COUNT(*) FROM repo_resyncs WHERE did = 'did:plc:u1' AND reason = 'sync'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d queued re-reads (%v), want 1", n, err)
	}
}

// A commit whose rev lies years ahead of this host's clock (a PDS clock in
// 2041, or a hostile PDS) is skipped and counted, as the reference relay
// refuses it, and is not recorded as the repository's rev: the
// repository's later commits still apply. Recorded, it made every later
// commit of that repository stale.
func TestACommitWithARevFromTheFutureIsSkippedAndDoesNotSilenceItsRepository(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	ctx := context.Background()
	now := time.Now()
	tag := func(rkey, rev, tagName string, at time.Time) jetstream.Event {
		return jetstream.Event{DID: "did:plc:u3", TimeUS: at.UnixMicro(), Kind: jetstream.KindCommit, Commit: &jetstream.Commit{
			Rev: rev, Operation: jetstream.OpCreate, Collection: processor.CollectionTag, RKey: rkey,
			Record: json.RawMessage(fmt.Sprintf(`{"repository":"r","tag":%q,"manifestDigest":"sha256:%064d","createdAt":"2026-01-01T00:00:00Z"}`, tagName, 1))}}
	}
	rev := func(at time.Time) string { return syntax.NewTIDFromTime(at, 1).String() }
	future := tag("t1", rev(time.Date(2041, 1, 1, 0, 0, 0, 0, time.UTC)), "poison", now)
	slightlyAhead := tag("t2", rev(now.Add(time.Minute)), "ahead", now.Add(time.Millisecond)) // a PDS clock a minute fast: within the tolerance
	out, err := testPipeline(db, c, p, webhooks.EnqueueTx).prefix(ctx, part{host: "h", events: []jetstream.Event{future, slightlyAhead}})
	if err != nil || out.future != 1 || out.stale != 0 {
		t.Fatalf("first batch: %v, future %d stale %d, want 1 and 0", err, out.future, out.stale)
	}
	later := tag("t3", rev(now.Add(2*time.Minute)), "later", now.Add(2*time.Minute))
	out, err = testPipeline(db, c, p, webhooks.EnqueueTx).prefix(ctx, part{host: "h", events: []jetstream.Event{later}})
	if err != nil || out.stale != 0 || out.future != 0 {
		t.Fatalf("later commit: %v, stale %d future %d, want both 0: the repository was silenced", err, out.stale, out.future)
	}
	var tags string
	if err := db.QueryRow(`SELECT group_concat(tag, ',') FROM (SELECT tag FROM tags WHERE did = 'did:plc:u3' ORDER BY tag)`).Scan(&tags); err != nil || tags != "ahead,later" {
		t.Fatalf("tags %q (%v), want ahead,later", tags, err)
	}
	var stored string
	if err := db.QueryRow(`SELECT CAST(rev AS BLOB) FROM repo_revs WHERE did = 'did:plc:u3'`).Scan(&stored); err != nil || stored != later.Commit.Rev {
		t.Fatalf("recorded rev %q (%v), want the later commit's %q", stored, err, later.Commit.Rev)
	}
}

// A re-read whose PDS answers getLatestCommit with a rev from the future
// fails (and is retried later) instead of recording that rev, which would
// silence the repository's later commits; the queue row stays.
func TestAReReadRefusesARevFromTheFuture(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	ctx := context.Background()
	const did = "did:plc:u4"
	if _, err := testPipeline(db, c, p, webhooks.EnqueueTx).prefix(ctx, part{host: "h", events: []jetstream.Event{
		{DID: did, TimeUS: time.Now().UnixMicro(), Kind: jetstream.KindSync, Sync: &jetstream.Sync{DID: did}}}}); err != nil {
		t.Fatal(err)
	}
	future := syntax.NewTIDFromTime(time.Date(2041, 1, 1, 0, 0, 0, 0, time.UTC), 1).String()
	pds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/xrpc/com.atproto.sync.getLatestCommit":
			fmt.Fprintf(w, `{"cid":"bafy","rev":%q}`, future)
		case "/xrpc/com.atproto.repo.listRecords":
			fmt.Fprint(w, `{"records":[]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer pds.Close()
	r := NewResyncer(db, staticPDS(pds.URL), p, time.Millisecond, zerolog.Nop(), nil)
	if err := r.one(ctx, c, did); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM repo_revs WHERE did = ?1`, did).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d recorded revs (%v), want none", n, err)
	}
	var attempts int
	var lastErr string
	if err := db.QueryRow(`SELECT attempts, last_error FROM repo_resyncs WHERE did = ?1`, did).Scan(&attempts, &lastErr); err != nil ||
		attempts != 1 || !strings.Contains(lastErr, "in the future") {
		t.Fatalf("queue row: attempts %d, last_error %q (%v); want it kept for a retry, naming the future rev", attempts, lastErr, err)
	}
}

// A re-read lists the repository on its PDS, applies what is there and
// removes what vanished, records the rev and dequeues the repository.
func TestAReReadAppliesTheRepositoryAndRemovesVanishedRecords(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	ctx := context.Background()
	const did = "did:plc:u2"
	digest := "sha256:" + strings.Repeat("a", 64)
	rec := func(tagName string) string {
		return fmt.Sprintf(`{"repository":"r","tag":%q,"manifestDigest":%q,"createdAt":"2026-01-01T00:00:00Z"}`, tagName, digest)
	}
	ev := func(rkey string) jetstream.Event {
		return jetstream.Event{DID: did, TimeUS: time.Now().Add(-time.Minute).UnixMicro(), Kind: jetstream.KindCommit, Commit: &jetstream.Commit{
			Rev: "3l3qo2vutsw22", Operation: jetstream.OpCreate, Collection: processor.CollectionTag, RKey: rkey, Record: json.RawMessage(rec(rkey))}}
	}
	if _, err := testPipeline(db, c, p, webhooks.EnqueueTx).prefix(ctx, part{host: "h", events: []jetstream.Event{ev("gone"), ev("kept"),
		{DID: did, TimeUS: time.Now().Add(-time.Minute).UnixMicro(), Kind: jetstream.KindSync, Sync: &jetstream.Sync{DID: did}}}}); err != nil {
		t.Fatal(err)
	}
	pds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/xrpc/com.atproto.sync.getLatestCommit":
			fmt.Fprint(w, `{"cid":"bafy","rev":"3l3qo2vutsw44"}`)
		case "/xrpc/com.atproto.repo.listRecords":
			if r.URL.Query().Get("collection") != processor.CollectionTag {
				fmt.Fprint(w, `{"records":[]}`)
				return
			}
			fmt.Fprintf(w, `{"records":[{"uri":"at://%s/%s/kept","cid":"bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm","value":%s},{"uri":"at://%s/%s/new","cid":"bafyreib2rxk3rybk3aobmv5cjuql3bm2twh4jo5uxgf5kpqcsgz7soxkba","value":%s}]}`,
				did, processor.CollectionTag, rec("kept"), did, processor.CollectionTag, rec("new"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer pds.Close()
	r := NewResyncer(db, staticPDS(pds.URL), p, time.Millisecond, zerolog.Nop(), nil)
	did2, found, err := r.next(ctx)
	if err != nil || !found || did2 != did {
		t.Fatalf("next: %q %v %v", did2, found, err)
	}
	if err := r.one(ctx, c, did); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`SELECT CAST(rkey AS BLOB) FROM tags WHERE did = ?1 ORDER BY rkey`, did)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		got = append(got, s)
	}
	rows.Close()
	if strings.Join(got, ",") != "kept,new" {
		t.Fatalf("tags after the re-read: %v, want kept,new", got)
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM repo_resyncs`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d re-reads still queued (%v)", n, err)
	}
}

type staticPDS string

func (s staticPDS) PDSEndpoint(context.Context, string) (string, error) { return string(s), nil }

// The consumer reports itself unhealthy once no upstream has delivered an
// event for jetstream.unhealthy_after, and healthy again on the next one.
func TestTheConsumerReportsUnhealthyWhenNoUpstreamSendsEvents(t *testing.T) {
	db := testsupport.OpenDB(t)
	f := newFixture(t, 63, 50, jetstream.ReplayOptions{})
	h := &workers.Health{}
	c := acquire(t, db, "me")
	o := optionsFor(db, c, "ws://127.0.0.1:1/subscribe")
	o.Jetstream.UnhealthyAfter = 50 * time.Millisecond
	o.Health = h
	sys := testsupport.NewActorSystem(t)
	pid := sys.Root.Spawn(NewProps(o))
	testsupport.Eventually(t, "an unhealthy report", func() bool { ok, _, _ := h.Status(); return !ok })
	stop(t, sys, pid)
	o = f.options(db, c)
	o.Jetstream.UnhealthyAfter = time.Minute
	o.Health = h
	pid = sys.Root.Spawn(NewProps(o))
	testsupport.Eventually(t, "a healthy report", func() bool { ok, _, _ := h.Status(); return ok })
	stop(t, sys, pid)
}

// A host whose numbering restarted below the stored seq is resumed by
// time, and the stored seq is dropped so its new numbering is recorded.
func TestASeqResetHostIsResumedByTimeAndItsNewNumberingStored(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	events := numbered(generateEvents(64, 40), 5000)
	const a = "ws://a.example/xrpc/network.bsky.jetstream.subscribeEvents"
	cons := bareConsumer(t, db, c, 5*time.Second)
	ctx := context.Background()
	if err := cons.handle(ctx, jetstream.Batch{URL: a, Events: events[:20], MaxSeq: 5019}); err != nil {
		t.Fatal(err)
	}
	cons.seqReset(a)
	if got := cons.resumeAt(a); got < jetstream.CursorSeqMax {
		t.Fatalf("after a reset: cursor %d, want a time", got)
	}
	fresh := numbered(events[20:], 1)
	if err := cons.handle(ctx, jetstream.Batch{URL: a, Events: fresh, MaxSeq: 20}); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := LoadPosition(ctx, db); p.Host != "a.example" || p.Seq != 20 {
		t.Fatalf("stored position %+v, want a.example seq 20 (the new numbering)", p)
	}
}

// backdate makes ev a commit whose rev and time_us both lie d in the past
// of what they were: a PDS clock that slow, or a server that stamped it so.
func backdate(ev *jetstream.Event, d time.Duration) {
	ev.TimeUS -= d.Microseconds()
	if ev.Commit != nil {
		ev.Commit.Rev = syntax.NewTID(ev.TimeUS, 7).String()
	}
}

// One event far behind its batch (a rev from a PDS clock a year slow, or a
// backdated time_us) is applied but does not drag the batch's shared time,
// the failover resume point, back with it; one ahead of this host's clock
// does not carry it forward. Without the median filter the batch's shared
// time is the outlier's.
func TestOneOutlierDoesNotMoveTheBatchsSharedTime(t *testing.T) {
	events := generateEvents(71, 50)
	want := sharedTime(events)
	if want == 0 {
		t.Fatal("the generated events carry no shared time")
	}
	withOld := append(append([]jetstream.Event(nil), events...), events[10])
	withOld[len(withOld)-1].Commit = ptrCopy(events[10].Commit)
	backdate(&withOld[len(withOld)-1], 365*24*time.Hour)
	if got := sharedTime(withOld); got != want {
		t.Errorf("with one event a year back: shared time %d, want %d (the outlier's is %d)", got, want, eventSharedTime(&withOld[len(withOld)-1]))
	}
	ahead := events[20]
	ahead.TimeUS = time.Now().Add(time.Hour).UnixMicro()
	if c := events[20].Commit; c != nil {
		cc := *c
		cc.Rev = syntax.NewTID(ahead.TimeUS, 7).String()
		ahead.Commit = &cc
	}
	if got, now := sharedTime([]jetstream.Event{ahead}), time.Now().UnixMicro(); got > now {
		t.Errorf("an event an hour ahead: shared time %d, beyond this host's clock %d", got, now)
	}
}

func ptrCopy[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// A batch of one backdated event on the live tail (the whole batch an
// outlier) leaves the stored shared time where the batches before it put
// it, in the row and in the consumer's own copy; on another host the
// shared time follows that host's batches whatever they carry.
func TestABackdatedEventAloneDoesNotMoveTheStoredSharedTimeBack(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	const a, b = "ws://a.example/subscribe", "ws://b.example/subscribe"
	cons := bareConsumer(t, db, c, 5*time.Second)
	ctx := context.Background()
	events := generateEvents(72, 40)
	if err := cons.handle(ctx, jetstream.Batch{URL: a, Events: events[:30]}); err != nil {
		t.Fatal(err)
	}
	before, _, err := LoadPosition(ctx, db)
	if err != nil || before.SharedUS == 0 {
		t.Fatalf("position %+v, %v: want a shared time", before, err)
	}
	old := events[30]
	old.Commit = ptrCopy(events[30].Commit)
	backdate(&old, 365*24*time.Hour)
	old.TimeUS = events[29].TimeUS + 1 // time_us in order: only the rev is a year slow
	if err := cons.handle(ctx, jetstream.Batch{URL: a, Events: []jetstream.Event{old}}); err != nil {
		t.Fatal(err)
	}
	after, _, _ := LoadPosition(ctx, db)
	if after.SharedUS != before.SharedUS || cons.pos.SharedUS != before.SharedUS {
		t.Fatalf("stored shared time %d (consumer's copy %d) after one event a year slow, want %d kept", after.SharedUS, cons.pos.SharedUS, before.SharedUS)
	}
	if after.TimeUS != old.TimeUS {
		t.Errorf("time_us %d, want the event's %d: the position itself still moves past it", after.TimeUS, old.TimeUS)
	}
	// Another host: its batches' shared time is taken as it is.
	moved := generateEvents(73, 5)
	for i := range moved {
		moved[i].Commit = ptrCopy(moved[i].Commit)
		backdate(&moved[i], 2*time.Hour)
	}
	if err := cons.handle(ctx, jetstream.Batch{URL: b, Events: moved}); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := LoadPosition(ctx, db); p.Host != "b.example" || p.SharedUS != sharedTime(moved) || cons.pos.SharedUS != p.SharedUS {
		t.Fatalf("position %+v (consumer's shared %d) after host b's batch, want b.example with its shared time %d", p, cons.pos.SharedUS, sharedTime(moved))
	}
}

// One event stamped a year ahead of its batch (still behind this host's
// clock: an old capture) is applied, but the stored position stays on the
// stream, wherever the event falls in the batch; a restart then resumes
// before the events still to come. Before, the position moved to the
// outlier's time less a second, and a restart skipped everything between.
func TestOneEventStampedFarAheadOfItsBatchDoesNotMoveThePosition(t *testing.T) {
	for _, at := range []int{10, 39} {
		t.Run(fmt.Sprint("at ", at), func(t *testing.T) {
			db := testsupport.OpenDB(t)
			c := acquire(t, db, "me")
			cons := bareConsumer(t, db, c, 5*time.Second)
			events := generateEvents(74, 40)
			ahead := events[at].TimeUS + (365 * 24 * time.Hour).Microseconds()
			if ahead > time.Now().UnixMicro() {
				t.Skip("the generated stream is within a year of this host's clock")
			}
			events[at].TimeUS = ahead
			var want int64
			for i, ev := range events {
				if i != at {
					want = max(want, ev.TimeUS)
				}
			}
			if err := cons.handle(context.Background(), jetstream.Batch{URL: "ws://a.example/subscribe", Events: events}); err != nil {
				t.Fatal(err)
			}
			p, _, err := LoadPosition(context.Background(), db)
			if err != nil {
				t.Fatal(err)
			}
			if p.TimeUS > want || p.TimeUS < want-reorderWindow.Microseconds() {
				t.Fatalf("stored time_us %d, want the stream's %d (the outlier is at %d)", p.TimeUS, want, ahead)
			}
		})
	}
}

// The position keeps the last decoded event at or below its seq (its
// seq and time as read), so a resume by seq can start there and check
// the host replays that very event first (Jetstream v2 renumbers after a
// crash), even when the batch ended on frames that did not decode.
func TestThePositionKeepsTheLastEventItCanCheck(t *testing.T) {
	evs := []jetstream.Event{{Seq: 5, TimeUS: 1_780_000_000_000_005}, {Seq: 6, TimeUS: 1_780_000_000_000_006}}
	if p := positionOf("h", evs, 6, 0); p.seq != 6 || p.checkSeq != 6 || p.checkUS != 1_780_000_000_000_006 {
		t.Fatalf("seq %d check %d@%d, want 6 and the event at 6", p.seq, p.checkSeq, p.checkUS)
	}
	if p := positionOf("h", evs, 7, 0); p.seq != 7 || p.checkSeq != 6 || p.checkUS != 1_780_000_000_000_006 {
		t.Fatalf("a batch ending on a frame that did not decode: seq %d check %d@%d, want 7, and 6 checked", p.seq, p.checkSeq, p.checkUS)
	}
}

// A resume by seq starts at the last event it can check, not at a frame
// that did not decode: from there the host must replay that event first,
// stamped as read, or it is resumed by time (a tester lost 294 rows
// after a position ended on an undecodable frame and the host renumbered).
func TestAResumeBySeqStartsAtTheEventItCanCheck(t *testing.T) {
	const url = "ws://jetstream.example:6008/xrpc/network.bsky.jetstream.subscribeEvents"
	host := jetstream.HostOf(url)
	c := &consumer{pos: Position{Host: host, Seq: 7, TimeUS: 1_780_000_000_000_006, CheckSeq: 6, CheckUS: 1_780_000_000_000_006}}
	if got := c.resumeAt(url); got != 6 {
		t.Fatalf("resume at %d, want 6 (the event checked)", got)
	}
	if got := c.seqTimeAt(url); got != 1_780_000_000_000_006 {
		t.Fatalf("expected time %d, want the checked event's", got)
	}
	c.pos.CheckSeq, c.pos.CheckUS = 0, 0 // a position from before: no check
	if got, us := c.resumeAt(url), c.seqTimeAt(url); got != 7 || us != 0 {
		t.Fatalf("without a checked event: resume at %d expecting %d, want 7 and no check", got, us)
	}
}
