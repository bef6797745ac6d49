package labeler

import (
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
)

// TestMain fails the package if goroutines outlive the tests, except
// protoactor-go's dead-letter throttle (see internal/testsupport): a message
// that reaches a stopped subscriber starts it, and it lives a second.
func TestMain(m *testing.M) {
	testsupport.VerifyTestMain(m)
}

// waitFor bounds every wait on the subscriber or the fake labeler.
const waitFor = 10 * time.Second

func acquire(t *testing.T, db *database.DB, holder string) fence.Custody {
	t.Helper()
	return testsupport.Custody(t, db, LeaseName, holder, time.Minute)
}

// harness is one subscriber against one fake labeler.
type harness struct {
	t       *testing.T
	db      *database.DB
	sys     *actor.ActorSystem
	fake    *testsupport.Labeler
	metrics *Metrics
	logs    *testsupport.LockedBuffer
	writes  atomic.Int64
	opts    Options
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t, db: testsupport.OpenDB(t), sys: testsupport.NewActorSystem(t), fake: testsupport.NewLabeler(t), logs: &testsupport.LockedBuffer{}}
	endpoint, err := SubscribeURL(h.fake.URL())
	if err != nil {
		t.Fatal(err)
	}
	h.metrics, _ = NewMetrics(nil)
	h.opts = Options{
		DB:           h.db,
		Log:          zerolog.New(h.logs).Level(zerolog.DebugLevel),
		Endpoint:     endpoint,
		StaleTimeout: 5 * time.Second,
		Metrics:      h.metrics,
		ReconnectMin: 5 * time.Millisecond,
		ReconnectMax: 20 * time.Millisecond,
		AfterWrite:   func() { h.writes.Add(1) },
	}
	return h
}

// start spawns a subscriber under custody c and stops it at cleanup.
func (h *harness) start(c fence.Custody) *actor.PID {
	h.t.Helper()
	pid := h.sys.Root.Spawn(NewProps(h.opts, c))
	h.t.Cleanup(func() { _ = h.sys.Root.StopFuture(pid).Wait() })
	return pid
}

func (h *harness) cursor() int64 {
	var seq int64 = -1
	_ = h.db.QueryRow(`SELECT seq FROM labeler_cursors WHERE endpoint = ?1`, h.opts.Endpoint).Scan(&seq)
	return seq
}

func (h *harness) waitCursor(seq int64) {
	h.t.Helper()
	testsupport.Eventually(h.t, "cursor "+strconv.FormatInt(seq, 10), func() bool { return h.cursor() == seq })
}

type takedown struct {
	src, did, repo string
}

func (h *harness) takedowns() map[takedown]bool {
	h.t.Helper()
	rows, err := h.db.Query(`SELECT ` + database.Text("src") + `, ` + database.Text("did") + `, ` + database.Text("repo") + `
FROM taken_down_subjects`)
	if err != nil {
		h.t.Fatalf("read taken_down_subjects: %v", err)
	}
	defer rows.Close()
	out := map[takedown]bool{}
	for rows.Next() {
		var td takedown
		if err := rows.Scan(&td.src, &td.did, &td.repo); err != nil {
			h.t.Fatal(err)
		}
		out[td] = true
	}
	return out
}

const src = "did:plc:labeler"

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func takedownLabel(uri string) testsupport.Label {
	return testsupport.Label{"ver": 1, "src": src, "uri": uri, "val": ValTakedown, "cts": rfc3339(time.Now())}
}

func with(l testsupport.Label, key string, value any) testsupport.Label {
	out := testsupport.Label{}
	for k, v := range l {
		out[k] = v
	}
	if value == nil {
		delete(out, key)
	} else {
		out[key] = value
	}
	return out
}

func TestTakedownsNegationsAndExpiriesShapeTakenDownSubjects(t *testing.T) {
	h := newHarness(t)
	if _, err := h.db.Exec(`INSERT INTO manifests (did, repository, digest, rkey, media_type, schema_version, created_at, indexed_at)
VALUES ('did:plc:erin', 'api', 'sha256:aa', '3kmanifest1', 'application/vnd.oci.image.manifest.v1+json', 2, 0, 0)`); err != nil {
		t.Fatalf("seed manifest: %v", err)
	}
	c := acquire(t, h.db, "instance-a")
	h.start(c)
	conn := h.fake.Accept(t, waitFor)
	if conn.Cursor != "0" {
		t.Fatalf("first connection cursor = %q, want 0 (the labeler's whole history)", conn.Cursor)
	}
	future, past := rfc3339(time.Now().Add(time.Hour)), rfc3339(time.Now().Add(-time.Hour))
	cts := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	conn.SendLabels(t, 1, with(takedownLabel("at://did:plc:alice/io.atcr.repo.page/web"), "cts", rfc3339(cts)))
	conn.SendLabels(t, 2, takedownLabel("did:plc:bob"))
	conn.SendLabels(t, 3, takedownLabel("at://did:plc:carol/io.atcr.repo.page/tools"))
	conn.SendLabels(t, 4, with(takedownLabel("at://did:plc:carol/io.atcr.repo.page/tools"), "neg", true))
	conn.SendLabels(t, 5, with(takedownLabel("at://did:plc:dave/io.atcr.repo.page/old"), "exp", future))
	conn.SendLabels(t, 6,
		with(takedownLabel("at://did:plc:dave/io.atcr.repo.page/old"), "exp", past),
		with(takedownLabel("at://did:plc:dave/io.atcr.repo.page/gone"), "exp", past))
	conn.SendLabels(t, 7,
		takedownLabel("at://did:plc:erin/io.atcr.manifest/3kmanifest1"),
		with(takedownLabel("at://did:plc:erin/io.atcr.repo.page/api"), "val", "porn"),
		takedownLabel("at://did:plc:erin/app.bsky.feed.post/3kpost"),
		takedownLabel("at://did:plc:erin/io.atcr.manifest/3knotindexed"),
		with(takedownLabel("did:plc:frank"), "cts", nil))
	h.waitCursor(7)

	want := map[takedown]bool{
		{src, "did:plc:alice", "web"}: true,
		{src, "did:plc:bob", ""}:      true,
		{src, "did:plc:erin", "api"}:  true,
	}
	got := h.takedowns()
	if len(got) != len(want) {
		t.Fatalf("taken_down_subjects = %v, want %v", got, want)
	}
	for td := range want {
		if !got[td] {
			t.Fatalf("taken_down_subjects = %v, missing %v", got, td)
		}
	}
	var (
		uri            string
		createdAt, seq int64
		fence          int64
		expires        sql.NullInt64
	)
	if err := h.db.QueryRow(`SELECT uri, created_at, expires_at, seq, fence FROM taken_down_subjects WHERE did = 'did:plc:alice'`).
		Scan(&uri, &createdAt, &expires, &seq, &fence); err != nil {
		t.Fatal(err)
	}
	if uri != "at://did:plc:alice/io.atcr.repo.page/web" || createdAt != cts.UnixMilli() || expires.Valid || seq != 1 || fence != c.Fence {
		t.Fatalf("alice row = uri %q created_at %d expires %v seq %d fence %d", uri, createdAt, expires, seq, fence)
	}

	for outcome, n := range map[string]float64{
		outcomeTakedown: 5, outcomeNegated: 1, outcomeExpired: 2, outcomeIgnored: 1,
		outcomeUnsupported: 1, outcomePending: 1, outcomeMalformed: 1,
	} {
		if got := testutil.ToFloat64(h.metrics.Labels.WithLabelValues(outcome)); got != n {
			t.Errorf("labels{outcome=%s} = %v, want %v", outcome, got, n)
		}
	}
	if got := testutil.ToFloat64(h.metrics.Frames.WithLabelValues(frameLabels)); got != 7 {
		t.Errorf("frames{kind=labels} = %v, want 7", got)
	}
}

func TestTakedownOfARecordInADateNamedRepositoryNamesThatRepository(t *testing.T) {
	h := newHarness(t)
	// go-libsql would hand a plain read of this name back as 2024-06-01T00:00:00Z.
	const repo = "2024-06-01"
	for _, q := range []string{
		`INSERT INTO manifests (did, repository, digest, rkey, media_type, schema_version, created_at, indexed_at)
VALUES ('did:plc:erin', '` + repo + `', 'sha256:aa', '3kmanifest1', 'application/vnd.oci.image.manifest.v1+json', 2, 0, 0)`,
		`INSERT INTO tags (did, repository, tag, digest, rkey, created_at, updated_at)
VALUES ('did:plc:gina', '` + repo + `', 'latest', 'sha256:aa', '3ktag1', 0, 0)`,
	} {
		if _, err := h.db.Exec(q); err != nil {
			t.Fatalf("seed: %v", err)
		}
	}
	h.start(acquire(t, h.db, "instance-a"))
	conn := h.fake.Accept(t, waitFor)
	conn.SendLabels(t, 1,
		takedownLabel("at://did:plc:erin/io.atcr.manifest/3kmanifest1"),
		takedownLabel("at://did:plc:gina/io.atcr.tag/3ktag1"))
	h.waitCursor(1)

	got := h.takedowns()
	want := map[takedown]bool{{src, "did:plc:erin", repo}: true, {src, "did:plc:gina", repo}: true}
	if len(got) != len(want) || !got[takedown{src, "did:plc:erin", repo}] || !got[takedown{src, "did:plc:gina", repo}] {
		t.Fatalf("taken_down_subjects = %v, want %v", got, want)
	}
}

func TestAFutureExpiryIsStoredForReadersToHonour(t *testing.T) {
	h := newHarness(t)
	h.start(acquire(t, h.db, "instance-a"))
	conn := h.fake.Accept(t, waitFor)
	exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	conn.SendLabels(t, 1, with(takedownLabel("did:plc:bob"), "exp", rfc3339(exp)))
	h.waitCursor(1)
	var expires sql.NullInt64
	if err := h.db.QueryRow(`SELECT expires_at FROM taken_down_subjects WHERE did = 'did:plc:bob'`).Scan(&expires); err != nil {
		t.Fatal(err)
	}
	if !expires.Valid || expires.Int64 != exp.UnixMilli() {
		t.Fatalf("expires_at = %v, want %d", expires, exp.UnixMilli())
	}
}

func TestInfoIsLoggedAndErrorFramesAreHandledByCode(t *testing.T) {
	h := newHarness(t)
	h.start(acquire(t, h.db, "instance-a"))

	conn := h.fake.Accept(t, waitFor)
	conn.SendInfo(t, "OutdatedCursor", "cursor is older than retention")
	conn.SendLabels(t, 10, takedownLabel("did:plc:alice"))
	h.waitCursor(10)
	if strings.Count(h.logs.String(), `"name":"OutdatedCursor"`) != 1 {
		t.Fatalf("OutdatedCursor info not logged once:\n%s", h.logs.String())
	}

	// ConsumerTooSlow: the labeler drops us; we come back from the stored cursor.
	conn.SendError(t, "ConsumerTooSlow", "buffer full")
	conn = h.fake.Accept(t, waitFor)
	if conn.Cursor != "10" {
		t.Fatalf("after ConsumerTooSlow reconnected with cursor %q, want 10", conn.Cursor)
	}

	// FutureCursor: the labeler's sequence was reset; replay it from 0.
	conn.SendError(t, "FutureCursor", "cursor in the future")
	conn = h.fake.Accept(t, waitFor)
	if conn.Cursor != "0" {
		t.Fatalf("after FutureCursor reconnected with cursor %q, want 0", conn.Cursor)
	}
	if got := h.cursor(); got != 0 {
		t.Fatalf("stored cursor after FutureCursor = %d, want 0", got)
	}
	if !h.takedowns()[takedown{src, "did:plc:alice", ""}] {
		t.Fatal("a FutureCursor reset lost an applied takedown")
	}

	// An unknown error code: reconnect from the stored cursor.
	conn.SendLabels(t, 1, takedownLabel("did:plc:bob"))
	h.waitCursor(1)
	conn.SendError(t, "InternalError", "oops")
	conn = h.fake.Accept(t, waitFor)
	if conn.Cursor != "1" {
		t.Fatalf("after InternalError reconnected with cursor %q, want 1", conn.Cursor)
	}

	for code, n := range map[string]float64{"ConsumerTooSlow": 1, "FutureCursor": 1, "other": 1} {
		if got := testutil.ToFloat64(h.metrics.StreamErrors.WithLabelValues(code)); got != n {
			t.Errorf("stream_errors{error=%s} = %v, want %v", code, got, n)
		}
	}
	if got := testutil.ToFloat64(h.metrics.Frames.WithLabelValues(frameInfo)); got != 1 {
		t.Errorf("frames{kind=info} = %v, want 1", got)
	}
}

func TestMalformedFramesAreSkippedLoggedAndCountedAndTheStreamGoesOn(t *testing.T) {
	h := newHarness(t)
	h.start(acquire(t, h.db, "instance-a"))
	conn := h.fake.Accept(t, waitFor)

	header := map[string]any{"op": 1, "t": "#labels"}
	malformed := [][]byte{
		{0xff, 0x00, 0x13},                                                                      // not CBOR
		testsupport.Frame(t, header, "x")[:7],                                                   // header and no body
		testsupport.Frame(t, header, map[string]any{"labels": []any{}}),                         // #labels without seq
		testsupport.Frame(t, map[string]any{"t": "#labels"}, map[string]any{"seq": 1}),          // header without op
		append(testsupport.Frame(t, header, map[string]any{"seq": 1, "labels": []any{}}), 0x01), // trailing bytes
		testsupport.Frame(t, map[string]any{"op": 7}, map[string]any{}),                         // unknown op
		testsupport.Frame(t, header, map[string]any{"seq": "one", "labels": []any{}}),           // mistyped seq
	}
	for _, m := range malformed {
		conn.SendRaw(t, m)
	}
	conn.SendText(t, `{"op":1}`)
	for i := 0; i < 10; i++ { // enough to exceed the log sampler's burst
		conn.SendRaw(t, []byte{0xff})
	}
	conn.SendRaw(t, testsupport.Frame(t, map[string]any{"op": 1, "t": "#future"}, map[string]any{"x": 1}))
	conn.SendLabels(t, 3, takedownLabel("did:plc:alice"))
	h.waitCursor(3)

	wantMalformed := float64(len(malformed) + 1 + 10)
	if got := testutil.ToFloat64(h.metrics.Frames.WithLabelValues(frameMalformed)); got != wantMalformed {
		t.Errorf("frames{kind=malformed} = %v, want %v", got, wantMalformed)
	}
	if got := testutil.ToFloat64(h.metrics.Frames.WithLabelValues(frameUnknown)); got != 1 {
		t.Errorf("frames{kind=unknown} = %v, want 1", got)
	}
	if n := strings.Count(h.logs.String(), "labeler frame skipped"); n != skipLogBurst {
		t.Errorf("logged %d skipped frames, want the sampler's burst of %d", n, skipLogBurst)
	}
	select {
	case <-conn.Closed():
		t.Fatal("a malformed frame ended the connection")
	default:
	}
	if !h.takedowns()[takedown{src, "did:plc:alice", ""}] {
		t.Fatal("the frame after the malformed ones was not applied")
	}
}

func TestReconnectResumesFromTheLastAppliedSeq(t *testing.T) {
	h := newHarness(t)
	pid := h.start(acquire(t, h.db, "instance-a"))
	conn := h.fake.Accept(t, waitFor)
	conn.SendLabels(t, 5, takedownLabel("did:plc:alice"))
	conn.SendLabels(t, 6, takedownLabel("did:plc:bob"))
	h.waitCursor(6)

	conn.Close()
	conn = h.fake.Accept(t, waitFor)
	if conn.Cursor != "6" {
		t.Fatalf("reconnected with cursor %q, want 6", conn.Cursor)
	}
	conn.SendLabels(t, 7, takedownLabel("did:plc:carol"))
	h.waitCursor(7)

	// A handover: the next holder resumes from the same cursor.
	if err := h.sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	testsupport.Release(t, h.db, fence.Custody{Lease: LeaseName, Holder: "instance-a", Fence: 1})
	next := acquire(t, h.db, "instance-b")
	h.start(next)
	conn = h.fake.Accept(t, waitFor)
	if conn.Cursor != "7" {
		t.Fatalf("new holder connected with cursor %q, want 7", conn.Cursor)
	}
	conn.SendLabels(t, 8, takedownLabel("did:plc:dave"))
	h.waitCursor(8)
	var fence int64
	if err := h.db.QueryRow(`SELECT fence FROM labeler_cursors`).Scan(&fence); err != nil || fence != next.Fence {
		t.Fatalf("cursor fence = %d (%v), want the new holder's %d", fence, err, next.Fence)
	}
}

func TestStoppingClosesTheSocketAndNothingIsWrittenAfter(t *testing.T) {
	h := newHarness(t)
	pid := h.start(acquire(t, h.db, "instance-a"))
	conn := h.fake.Accept(t, waitFor)
	conn.SendLabels(t, 1, takedownLabel("did:plc:alice"))
	h.waitCursor(1)

	// A graceful stop sends Drain first; the subscriber has nothing to
	// finish and says nothing about it (it used to warn "unexpected
	// message ignored" on every clean stop).
	// Poisoned, as a LeaseActor stops it: the poison follows Drain in
	// the mailbox, so Drain has been handled when it stops.
	h.sys.Root.Send(pid, &workers.Drain{})
	if err := h.sys.Root.PoisonFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(h.logs.String(), "unexpected message") {
		t.Errorf("Drain logged as unexpected:\n%s", h.logs.String())
	}
	writes := h.writes.Load()
	select {
	case <-conn.Closed():
	case <-time.After(waitFor):
		t.Fatal("stopping the subscriber did not close its socket")
	}
	if writes != 1 || h.writes.Load() != writes || h.cursor() != 1 {
		t.Fatalf("writes %d then %d, cursor %d: want exactly the one frame before stop", writes, h.writes.Load(), h.cursor())
	}
}

func TestStoppingWhileWaitingToReconnectCancelsTheTimer(t *testing.T) {
	h := newHarness(t)
	h.opts.ReconnectMin, h.opts.ReconnectMax = time.Hour, time.Hour
	pid := h.start(acquire(t, h.db, "instance-a"))
	conn := h.fake.Accept(t, waitFor)
	conn.Close()
	testsupport.Eventually(t, "the session to end", func() bool {
		return strings.Count(h.logs.String(), "reconnecting") == 1
	})
	if err := h.sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	// goleak (TestMain) proves the timer and session goroutines are gone.
}

// A labeler refusing the dial with 429 or 503 and Retry-After said when to
// come back; the next dial came after the backoff alone (milliseconds).
func TestARefusedDialWaitsAsLongAsRetryAfterAsks(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()
	h := newHarness(t)
	endpoint, err := SubscribeURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	h.opts.Endpoint = endpoint
	h.start(acquire(t, h.db, "instance-a"))
	testsupport.Eventually(t, "the refused session to end", func() bool {
		return strings.Contains(h.logs.String(), "reconnecting")
	})
	if !strings.Contains(h.logs.String(), `"retry_in":120000`) || !strings.Contains(h.logs.String(), "HTTP 429") {
		t.Fatalf("log %s, want retry_in 120000 (ms) and the status", h.logs.String())
	}
	if n := hits.Load(); n != 1 {
		t.Fatalf("%d dials, want 1", n)
	}
}

func TestAStaleStreamIsReconnected(t *testing.T) {
	h := newHarness(t)
	h.opts.StaleTimeout = 300 * time.Millisecond
	h.fake.SetQuiet(true)
	h.start(acquire(t, h.db, "instance-a"))
	first := h.fake.Accept(t, waitFor)
	h.fake.Accept(t, waitFor) // the reconnect
	select {
	case <-first.Closed():
	case <-time.After(waitFor):
		t.Fatal("the stale connection was not closed")
	}
	if strings.Count(h.logs.String(), "labeler stream stale") < 1 {
		t.Fatalf("staleness not logged:\n%s", h.logs.String())
	}
}

func TestAQuietStreamThatAnswersPingsIsNotStale(t *testing.T) {
	h := newHarness(t)
	// Three seconds: one ping-pong round trip (a ping goes out every
	// second) must fit in a stale timeout however loaded the host is (at
	// one second it did not, once, with two race-enabled test suites on
	// two cores); a dropped keepalive still fails.
	h.opts.StaleTimeout = 3 * time.Second
	h.start(acquire(t, h.db, "instance-a"))
	conn := h.fake.Accept(t, waitFor)
	// Two stale timeouts pass with no frame; pongs keep it alive.
	deadline := time.After(2 * h.opts.StaleTimeout)
	select {
	case <-conn.Closed():
		t.Fatal("a quiet but live connection was dropped as stale")
	case <-deadline:
	}
	conn.SendLabels(t, 1, takedownLabel("did:plc:alice"))
	h.waitCursor(1)
}

// failureRecorder is a parent that records why its child failed and stops it.
type failureRecorder struct {
	props *actor.Props
}

func (p *failureRecorder) Receive(ctx actor.Context) {
	if _, ok := ctx.Message().(*actor.Started); ok {
		ctx.Spawn(p.props)
	}
}

func TestASupersededCustodyWritesNothingAndFailsTheWorker(t *testing.T) {
	h := newHarness(t)
	c := acquire(t, h.db, "instance-a")
	reasons := make(chan any, 4)
	strategy := actor.NewOneForOneStrategy(0, 0, func(reason any) actor.Directive {
		reasons <- reason
		return actor.StopDirective
	})
	parent := &failureRecorder{props: NewProps(h.opts, c)}
	pid := h.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return parent }, actor.WithSupervisor(strategy)))
	t.Cleanup(func() { _ = h.sys.Root.StopFuture(pid).Wait() })

	conn := h.fake.Accept(t, waitFor)
	conn.SendLabels(t, 1, takedownLabel("did:plc:alice"))
	h.waitCursor(1)

	// Another instance takes the lease over.
	if _, err := h.db.Exec(`UPDATE leases SET holder = 'instance-b', fence = fence + 1 WHERE name = ?1`, LeaseName); err != nil {
		t.Fatal(err)
	}
	conn.SendLabels(t, 2, takedownLabel("did:plc:bob"))
	select {
	case r := <-reasons:
		err, ok := r.(error)
		if !ok || !errors.Is(err, fence.ErrSuperseded) {
			t.Fatalf("worker failed with %v, want fence.ErrSuperseded", r)
		}
	case <-time.After(waitFor):
		t.Fatal("the worker did not fail after its custody was superseded")
	}
	select {
	case <-conn.Closed():
	case <-time.After(waitFor):
		t.Fatal("the superseded worker left its socket open")
	}
	if h.cursor() != 1 || h.takedowns()[takedown{src, "did:plc:bob", ""}] {
		t.Fatalf("a superseded custody wrote: cursor %d, takedowns %v", h.cursor(), h.takedowns())
	}
}

// A labeler's own text (an info message here, 100 KB) is cut with a marker
// in the log line.
func TestALabelersMessageIsLoggedBounded(t *testing.T) {
	h := newHarness(t)
	h.start(acquire(t, h.db, "instance-a"))
	conn := h.fake.Accept(t, waitFor)
	conn.SendInfo(t, "OutdatedCursor", strings.Repeat("m", 100_000))
	conn.SendLabels(t, 10, takedownLabel("did:plc:alice"))
	h.waitCursor(10)
	logs := h.logs.String()
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, `"name":"OutdatedCursor"`) {
			if len(line) > 4<<10 || !strings.Contains(line, "…[truncated ") {
				t.Fatalf("a %d-byte info line, want at most 4 KiB with a truncation marker", len(line))
			}
			return
		}
	}
	t.Fatalf("the info frame was not logged:\n%.2000s", logs)
}

func TestALabelsFrameWhoseSeqDoesNotAdvanceIsSkippedLoggedAndCounted(t *testing.T) {
	h := newHarness(t)
	h.start(acquire(t, h.db, "instance-a"))
	conn := h.fake.Accept(t, waitFor)
	u0 := takedownLabel("did:plc:u0")
	conn.SendLabels(t, 1, u0)
	conn.SendLabels(t, 2, takedownLabel("did:plc:u1"))
	conn.SendLabels(t, 3, with(u0, "neg", true))
	h.waitCursor(3)

	conn.SendLabels(t, 2, u0) // a replay going backwards
	conn.SendLabels(t, 3, u0) // a replay of the last applied seq
	// A later frame proves the two before it were read and handled.
	conn.SendLabels(t, 4, takedownLabel("did:plc:u2"))
	h.waitCursor(4)
	// Writes are counted after they commit, in frame order: once seq 4's
	// is counted, any write for the replays has been counted too.
	testsupport.Eventually(t, "4 writes counted", func() bool { return h.writes.Load() >= 4 })
	if got := h.writes.Load(); got != 4 {
		t.Errorf("%d writes, want 4 (seqs 1 to 4, the replays none)", got)
	}
	if h.takedowns()[takedown{src, "did:plc:u0", ""}] {
		t.Error("a replayed seq re-applied the takedown of u0 that seq 3 negated")
	}
	if got := testutil.ToFloat64(h.metrics.Frames.WithLabelValues(frameSeqRegression)); got != 2 {
		t.Errorf("frames{kind=seq_regression} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(h.metrics.Frames.WithLabelValues(frameLabels)); got != 4 {
		t.Errorf("frames{kind=labels} = %v, want 4", got)
	}
	if n := strings.Count(h.logs.String(), "seq not above the last applied seq"); n != 2 {
		t.Errorf("logged %d seq regressions, want 2", n)
	}

	// The stored cursor is the floor on a new connection too.
	conn.Close()
	conn = h.fake.Accept(t, waitFor)
	if conn.Cursor != "4" {
		t.Fatalf("reconnected with cursor %q, want 4", conn.Cursor)
	}
	conn.SendLabels(t, 4, u0)
	conn.SendLabels(t, 5, takedownLabel("did:plc:u3"))
	h.waitCursor(5)
	if h.takedowns()[takedown{src, "did:plc:u0", ""}] {
		t.Error("a replay of the cursor's seq after a reconnect re-applied a takedown")
	}
	if got := testutil.ToFloat64(h.metrics.Frames.WithLabelValues(frameSeqRegression)); got != 3 {
		t.Errorf("frames{kind=seq_regression} = %v, want 3", got)
	}
}
