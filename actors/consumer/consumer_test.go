package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/actors/statscache"
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/synth"
	"github.com/atcr-io/appview/internal/webhooks"
)

func TestMain(m *testing.M) {
	testsupport.VerifyTestMain(m)
}

// fixture is one synthetic stream served by a replay server.
type fixture struct {
	exp *synth.Expected
	srv *jetstream.ReplayServer
	// serverLog is the replay server's log (one JSON line per event).
	serverLog *testsupport.LockedBuffer
	// hooks receives webhook deliveries (always 200) and counts them by
	// X-Appview-Delivery.
	hooks *httptest.Server
	recv  *deliveryCounter
}

// deliveryCounter counts the requests a webhook receiver saw per delivery key.
type deliveryCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (d *deliveryCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	d.mu.Lock()
	d.counts[r.Header.Get(webhooks.HeaderDelivery)]++
	d.mu.Unlock()
}

func (d *deliveryCounter) snapshot() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]int, len(d.counts))
	for k, v := range d.counts {
		out[k] = v
	}
	return out
}

func (d *deliveryCounter) reset() {
	d.mu.Lock()
	d.counts = map[string]int{}
	d.mu.Unlock()
}

// serveReplay starts a replay server for ro, logging to log, and stops it
// when the test ends.
func serveReplay(t *testing.T, ro jetstream.ReplayOptions, log zerolog.Logger) *jetstream.ReplayServer {
	t.Helper()
	srv, err := jetstream.NewReplayServer(ro, log)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe(context.Background()) }()
	select {
	case <-srv.Listening():
	case err := <-served:
		t.Fatalf("replay server: %v", err)
	}
	t.Cleanup(func() {
		srv.Close()
		<-served
	})
	return srv
}

func newFixture(t *testing.T, seed uint64, events int, ro jetstream.ReplayOptions) *fixture {
	t.Helper()
	return newFixtureAfter(t, seed, events, ro)
}

// newFixtureAfter is newFixture with the given JSONL lines served before the
// synthetic stream (their time_us must be below synth's start).
func newFixtureAfter(t *testing.T, seed uint64, events int, ro jetstream.ReplayOptions, before ...string) *fixture {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stream.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range before {
		if _, err := f.WriteString(line + "\n"); err != nil {
			t.Fatal(err)
		}
	}
	exp, err := synth.Write(context.Background(), f, synth.Options{Seed: seed, Events: events})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	ro.File, ro.Listen = path, "127.0.0.1:0"
	serverLog := &testsupport.LockedBuffer{}
	srv := serveReplay(t, ro, zerolog.New(serverLog))
	recv := &deliveryCounter{counts: map[string]int{}}
	hooks := httptest.NewServer(recv)
	t.Cleanup(hooks.Close)
	return &fixture{exp: exp, srv: srv, serverLog: serverLog, hooks: hooks, recv: recv}
}

func (f *fixture) options(db *database.DB, c fence.Custody) Options {
	return optionsFor(db, c, f.srv.URL())
}

// optionsFor are the test options of a consumer reading url.
func optionsFor(db *database.DB, c fence.Custody, url string) Options {
	return Options{
		DB:      db,
		Custody: c,
		Log:     zerolog.Nop(),
		Jetstream: config.Jetstream{
			URLs: []string{url}, Collections: []string{"io.atcr.*"}, Compress: true,
			Rewind: 2 * time.Second, StaleTimeout: 30 * time.Second, MaxMessageBytes: 1 << 20,
		},
		Processor: processor.New(processor.Options{Log: zerolog.Nop()}),
		Dispatcher: webhooks.DispatcherOptions{DB: db, Log: zerolog.Nop(), Config: config.Webhooks{
			AllowPrivate: true, RetrySchedule: []time.Duration{0}, Timeout: 5 * time.Second, Concurrency: 4,
			PublicURL: "https://registry.example",
		}},
		Stats: func(c fence.Custody) *actor.Props {
			return statscache.NewProps(statscache.Options{DB: db, Custody: c, Log: zerolog.Nop()})
		},
		BatchSize: 64, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
	}
}

func (f *fixture) subscribe(t *testing.T, db *database.DB) {
	t.Helper()
	var dids []string
	for did := range f.exp.Tables["users"] {
		dids = append(dids, did)
	}
	sort.Strings(dids) // same webhook ids in every database
	for _, did := range dids {
		if _, err := db.Exec(`INSERT INTO webhooks (did, url, created_at) VALUES (?, ?, 0)`, did, f.hooks.URL+"/hook"); err != nil {
			t.Fatal(err)
		}
	}
}

func cursorAt(db *database.DB) int64 {
	cur, _, _ := LoadCursor(context.Background(), db)
	return cur
}

// registryDump renders the processor's tables (every column is a function
// of the events) and the webhook deliveries' keys, sorted.
func registryDump(t *testing.T, db *database.DB) string {
	t.Helper()
	var b strings.Builder
	queries := []string{"SELECT webhook_id, " + database.Text("event_key") + " FROM webhook_deliveries", "SELECT time_us FROM jetstream_cursor"}
	for _, table := range []string{
		"users", "manifests", "manifest_layers", "manifest_references", "manifest_annotations", "tags", "stars", "repo_pages",
		"hold_captains", "hold_crew", "repository_hold_stats", "repository_stats", "record_tombstones",
	} {
		q, err := testsupport.SelectAll(context.Background(), db, table)
		if err != nil {
			t.Fatal(err)
		}
		queries = append(queries, q)
	}
	for _, q := range queries {
		lines, err := testsupport.DumpRows(context.Background(), db.DB, q)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "== %s\n%s\n", q, strings.Join(lines, "\n"))
	}
	return b.String()
}

func checkExpected(t *testing.T, db *database.DB, f *fixture) {
	t.Helper()
	for _, d := range synth.Diff(context.Background(), db.DB, f.exp) {
		t.Error(d)
	}
	if got := deliveryKeys(t, db); strings.Join(got, "\n") != strings.Join(f.exp.PushEventKeys, "\n") {
		t.Errorf("deliveries for %d event keys, want %d", len(got), len(f.exp.PushEventKeys))
	}
}

func stop(t *testing.T, sys *actor.ActorSystem, pid *actor.PID) {
	t.Helper()
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
}

// runOnce consumes the whole stream into a fresh database and returns it.
func runOnce(t *testing.T, f *fixture, drops int) *database.DB {
	t.Helper()
	db := testsupport.OpenDB(t)
	f.subscribe(t, db)
	sys := testsupport.NewActorSystem(t)
	c := acquire(t, db, "me")
	pid := sys.Root.Spawn(NewProps(f.options(db, c)))
	// Drop the connection at random points of the stream: the consumer
	// reconnects from its committed cursor minus the rewind.
	rng := rand.New(rand.NewPCG(uint64(drops), 7))
	var points []int64
	for range drops {
		points = append(points, f.exp.MaxTimeUS-int64(rng.IntN(f.exp.Events))*1500)
	}
	sort.Slice(points, func(i, j int) bool { return points[i] < points[j] })
	for _, p := range points {
		testsupport.Eventually(t, "the cursor to pass a drop point", func() bool { return cursorAt(db) >= p })
		f.srv.DropConnections()
	}
	testsupport.Eventually(t, "the whole stream", func() bool { return cursorAt(db) == f.exp.MaxTimeUS })
	testsupport.Eventually(t, "every webhook delivery", func() bool {
		var pending int
		_ = db.QueryRow(`SELECT COUNT(*) FROM webhook_deliveries WHERE status <> 'delivered'`).Scan(&pending)
		return pending == 0
	})
	stop(t, sys, pid)
	if drops > 0 && f.srv.Connections() < 2 {
		t.Fatalf("%d connections for %d drops", f.srv.Connections(), drops)
	}
	return db
}

func TestReplayedStreamThroughTheConsumerProducesTheExpectedState(t *testing.T) {
	f := newFixture(t, 41, 3000, jetstream.ReplayOptions{})
	db := runOnce(t, f, 0)
	checkExpected(t, db, f)
}

func TestDroppingTheConnectionAtTenRandomPointsLeavesAnIdenticalState(t *testing.T) {
	f := newFixture(t, 42, 3000, jetstream.ReplayOptions{})
	clean := registryDump(t, runOnce(t, f, 0))
	f.recv.reset()
	dropped := runOnce(t, f, 10)
	got := f.recv.snapshot()
	for _, key := range f.exp.PushEventKeys {
		if got[key] != 1 {
			t.Errorf("push %s reached the receiver %d times, want exactly once", key, got[key])
		}
	}
	if len(got) != len(f.exp.PushEventKeys) {
		t.Errorf("receiver saw %d distinct deliveries, want %d", len(got), len(f.exp.PushEventKeys))
	}
	checkExpected(t, dropped, f)
	if got := registryDump(t, dropped); got != clean {
		t.Fatalf("a run with 10 dropped connections differs from an undisturbed run:\n%s", firstDifference(clean, got))
	}
}

func TestReplayingFromCursorZeroTwiceLeavesAnIdenticalState(t *testing.T) {
	f := newFixture(t, 43, 2000, jetstream.ReplayOptions{})
	db := runOnce(t, f, 0)
	first := registryDump(t, db)
	var deliveries int
	_ = db.QueryRow(`SELECT COUNT(*) FROM webhook_deliveries`).Scan(&deliveries)

	if _, err := db.Exec(`DELETE FROM jetstream_cursor`); err != nil {
		t.Fatal(err)
	}
	sys := testsupport.NewActorSystem(t)
	var c fence.Custody
	if err := db.QueryRow(`SELECT name, holder, fence FROM leases`).Scan(&c.Lease, &c.Holder, &c.Fence); err != nil {
		t.Fatal(err)
	}
	pid := sys.Root.Spawn(NewProps(f.options(db, c)))
	testsupport.Eventually(t, "the replay", func() bool { return cursorAt(db) == f.exp.MaxTimeUS })
	stop(t, sys, pid)
	second := registryDump(t, db)
	if second != first {
		t.Fatal("replaying from cursor 0 changed the database")
	}
	var again int
	_ = db.QueryRow(`SELECT COUNT(*) FROM webhook_deliveries`).Scan(&again)
	if again != deliveries {
		t.Fatalf("replay added deliveries: %d -> %d", deliveries, again)
	}
}

// parent spawns the consumer and reports how it failed.
type parent struct {
	props   *actor.Props
	reasons chan any
}

func (p *parent) Receive(ctx actor.Context) {
	if _, ok := ctx.Message().(*actor.Started); ok {
		ctx.Spawn(p.props)
	}
}

func TestAConsumerWhoseCustodyIsSupersededFailsWithErrSuperseded(t *testing.T) {
	f := newFixture(t, 44, 1500, jetstream.ReplayOptions{Rate: 2000})
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	c := acquire(t, db, "old")
	reasons := make(chan any, 4)
	strategy := actor.NewOneForOneStrategy(0, time.Second, func(reason any) actor.Directive {
		reasons <- reason
		return actor.StopDirective
	})
	p := &parent{props: NewProps(f.options(db, c)), reasons: reasons}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return p }, actor.WithSupervisor(strategy)))
	defer stop(t, sys, pid)
	testsupport.Eventually(t, "a first commit", func() bool { return cursorAt(db) > 0 })
	testsupport.Release(t, db, c)
	acquire(t, db, "new")
	select {
	case r := <-reasons:
		err, ok := r.(error)
		if !ok || !errors.Is(err, fence.ErrSuperseded) {
			t.Fatalf("failure %v, want ErrSuperseded", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer kept running under a superseded custody")
	}
	var stale int
	if err := db.QueryRow(`SELECT COUNT(*) FROM jetstream_cursor WHERE fence <> ?`, c.Fence).Scan(&stale); err != nil || stale != 0 {
		t.Fatalf("cursor written under another fence: %d %v", stale, err)
	}
}

func TestStoppingClosesTheSocketAndNothingIsWrittenAfter(t *testing.T) {
	f := newFixture(t, 45, 1500, jetstream.ReplayOptions{Rate: 1000})
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	pid := sys.Root.Spawn(NewProps(f.options(db, acquire(t, db, "me"))))
	testsupport.Eventually(t, "a first commit", func() bool { return cursorAt(db) > 0 })
	stop(t, sys, pid)
	at := cursorAt(db)
	if at == f.exp.MaxTimeUS {
		t.Fatal("the stream finished before the stop: the test proves nothing")
	}
	// The server sees its subscriber go (the consumer closed the socket;
	// nothing here drops it), and the cursor stays where the last commit
	// before the stop put it.
	testsupport.Eventually(t, "the server to see the subscriber go", func() bool {
		return strings.Contains(f.serverLog.String(), "subscriber gone")
	})
	if cursorAt(db) != at {
		t.Fatal("the cursor moved after the consumer stopped")
	}
}

func TestUpdateCollectionsSendsAnOptionsUpdate(t *testing.T) {
	f := newFixture(t, 46, 1500, jetstream.ReplayOptions{Rate: 500})
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	pid := sys.Root.Spawn(NewProps(f.options(db, acquire(t, db, "me"))))
	defer stop(t, sys, pid)
	testsupport.Eventually(t, "a first commit", func() bool { return cursorAt(db) > 0 })
	sys.Root.Send(pid, &UpdateCollections{Collections: []string{"io.atcr.manifest", "io.atcr.tag"}})
	testsupport.Eventually(t, "the server to apply the options_update", func() bool {
		return strings.Contains(f.serverLog.String(), "options updated") &&
			strings.Contains(f.serverLog.String(), "io.atcr.manifest")
	})
}

func firstDifference(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < min(len(w), len(g)); i++ {
		if w[i] != g[i] {
			return fmt.Sprintf("line %d:\nwant %s\ngot  %s", i+1, w[i], g[i])
		}
	}
	return fmt.Sprintf("lengths %d vs %d", len(w), len(g))
}

func TestAFailingChildFailsTheConsumerWithItsReason(t *testing.T) {
	f := newFixture(t, 47, 10, jetstream.ReplayOptions{})
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	c := acquire(t, db, "me")
	// The StatsCache warms from repository_hold_stats first thing; without
	// the table its warm-up fails.
	if _, err := db.Exec(`ALTER TABLE repository_hold_stats RENAME TO moved_away`); err != nil {
		t.Fatal(err)
	}
	reasons := make(chan any, 4)
	strategy := actor.NewOneForOneStrategy(0, time.Second, func(reason any) actor.Directive {
		reasons <- reason
		return actor.StopDirective
	})
	o := f.options(db, c)
	// Nothing to connect to: the consumer itself never commits, so the only
	// failure is the child's.
	o.Jetstream.URLs = []string{"ws://127.0.0.1:1/subscribe"}
	p := &parent{props: NewProps(o), reasons: reasons}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return p }, actor.WithSupervisor(strategy)))
	defer stop(t, sys, pid)
	select {
	case r := <-reasons:
		if err, ok := r.(error); !ok || !strings.Contains(err.Error(), "statscache warm-up") {
			t.Fatalf("failure %v, want the StatsCache's warm-up error", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the StatsCache's failure did not reach the consumer's parent")
	}
}
