package backfill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"

	"github.com/atcr-io/appview/internal/identity"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	testsupport.VerifyTestMain(m)
}

// waitFor bounds every wait on a fake peer or a running job.
const waitFor = 10 * time.Second

const (
	colManifest = "io.atcr.manifest"
	colTag      = "io.atcr.tag"
)

// openDB is a test database with the table the fake applier writes.
func openDB(t *testing.T) *database.DB {
	t.Helper()
	db := testsupport.OpenDB(t)
	// What the fake applier writes: deliberately without a unique key, so
	// a record applied twice shows up as a duplicate row.
	if _, err := db.Exec(`CREATE TABLE backfilled (did TEXT, collection TEXT, rkey TEXT, cid TEXT, time_us INTEGER, fence INTEGER)`); err != nil {
		t.Fatal(err)
	}
	return db
}

// fakeApplier records every event it is given, inside the caller's
// transaction, stamped with the custody's fence.
var fakeApplier = ApplierFunc(func(ctx context.Context, tx *sql.Tx, c fence.Custody, events []jetstream.Event) (Applied, error) {
	for _, ev := range events {
		if ev.Kind != jetstream.KindCommit || ev.Commit == nil || ev.Commit.Operation != jetstream.OpCreate {
			return Applied{}, fmt.Errorf("not a create event: %+v", ev)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO backfilled VALUES (?1, ?2, ?3, ?4, ?5, ?6)`,
			ev.DID, ev.Commit.Collection, ev.Commit.RKey, ev.Commit.CID, ev.TimeUS, c.Fence); err != nil {
			return Applied{}, err
		}
	}
	return Applied{Applied: len(events)}, nil
})

// env is one database, one PLC directory and the peers a test adds.
type env struct {
	t       *testing.T
	db      *database.DB
	plc     *testsupport.PLC
	http    *http.Client
	metrics *Metrics
	writes  atomic.Int64
	// afterWrite, when set, also sees every committed write.
	afterWrite func(what string)
	mu         sync.Mutex
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, db: openDB(t), plc: testsupport.NewPLC(t)}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	e.http = &http.Client{Transport: tr}
	e.metrics, _ = NewMetrics(nil)
	return e
}

func (e *env) options(relays ...string) Options {
	return Options{
		DB:             e.db,
		Log:            zerolog.Nop(),
		Applier:        fakeApplier,
		Resolver:       &identity.Resolver{PLCURL: e.plc.URL(), HTTP: e.http},
		HTTP:           e.http,
		RelayEndpoints: relays,
		Collections:    []string{colManifest, colTag},
		Concurrency:    2,
		RelayPageSize:  2,
		RecordPageSize: 2,
		Retry:          RetryPolicy{Initial: time.Millisecond, Max: 5 * time.Millisecond, MaxTries: 3},
		Metrics:        e.metrics,
		AfterWrite: func(what string) {
			e.writes.Add(1)
			e.mu.Lock()
			hook := e.afterWrite
			e.mu.Unlock()
			if hook != nil {
				hook(what)
			}
		},
	}
}

func (e *env) backfiller(o Options) *Backfiller {
	e.t.Helper()
	b, err := New(o)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// acquire takes the backfill lease for holder, releasing any current grant
// first (a handover), and returns the new custody.
func (e *env) acquire(holder string) fence.Custody {
	e.t.Helper()
	if _, err := e.db.Exec(`UPDATE leases SET expires_at = 0 WHERE name = ?1`, LeaseName); err != nil {
		e.t.Fatal(err)
	}
	return testsupport.Custody(e.t, e.db, LeaseName, holder, time.Minute)
}

func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.db.QueryRow(query, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// noDuplicates fails when a record was applied more than once.
func (e *env) noDuplicates() {
	e.t.Helper()
	all := e.count(`SELECT COUNT(*) FROM backfilled`)
	distinct := e.count(`SELECT COUNT(*) FROM (SELECT DISTINCT did, collection, rkey FROM backfilled)`)
	if all != distinct {
		e.t.Fatalf("%d records applied, %d distinct: some were applied twice", all, distinct)
	}
}

// pds starts a fake PDS hosting each did with n records per collection.
func (e *env) pds(n int, dids ...string) *testsupport.PDS {
	p := testsupport.NewPDS(e.t)
	for _, did := range dids {
		e.plc.Register(did, p.URL())
		for _, col := range []string{colManifest, colTag} {
			p.Put(did, col, records(n)...)
		}
	}
	return p
}

func records(n int) []testsupport.Record {
	out := make([]testsupport.Record, n)
	for i := range out {
		out[i] = testsupport.Record{RKey: fmt.Sprintf("3k%03d", i), Value: map[string]any{"$type": "x", "i": i}}
	}
	return out
}

func cursors(reqs []testsupport.Request, repo, col string) []string {
	var out []string
	for _, r := range reqs {
		if r.Repo == repo && r.Collection == col {
			out = append(out, r.Cursor)
		}
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestBackfillFollowsRelayAndPDSPagesSkipsBrokenPeersAndFailsOverRelays(t *testing.T) {
	e := newEnv(t)
	deadRelay := testsupport.NewRelay(t)
	deadRelay.Intercept(func(w http.ResponseWriter, r *http.Request, req testsupport.Request) bool {
		testsupport.XRPCError(w, http.StatusBadGateway, "UpstreamFailure", "down")
		return true
	})
	relay := testsupport.NewRelay(t)
	good := e.pds(5, "did:plc:alice", "did:plc:bob", "did:plc:erin")
	good.Put("did:plc:bob", colManifest,
		testsupport.Record{RKey: "3kzzz1", URI: "at://did:plc:mallory/io.atcr.manifest/3kzzz1", Value: map[string]any{}},
		testsupport.Record{RKey: "3kzzz2", Value: "not an object"})
	broken := testsupport.NewPDS(t)
	broken.Intercept(func(w http.ResponseWriter, r *http.Request, req testsupport.Request) bool {
		testsupport.XRPCError(w, http.StatusInternalServerError, "InternalServerError", "disk on fire")
		return true
	})
	e.plc.Register("did:plc:carol", broken.URL())
	// did:plc:dave is listed by the relay but resolves nowhere.
	relay.Add(colManifest, "did:plc:alice", "did:plc:bob", "did:plc:carol", "did:plc:dave", "did:plc:erin")
	relay.Add(colTag, "did:plc:alice", "did:plc:carol")

	c := e.acquire("instance-a")
	b := e.backfiller(e.options(deadRelay.URL(), relay.URL()))
	if err := b.Run(context.Background(), c); err != nil {
		t.Fatalf("Run: %v", err)
	}

	if got := e.count(`SELECT COUNT(*) FROM backfilled`); got != 5+5+5+5 {
		t.Fatalf("%d records applied, want 20 (alice, bob, erin manifests and alice tags)", got)
	}
	e.noDuplicates()
	if got := e.count(`SELECT COUNT(*) FROM backfilled WHERE did = 'did:plc:alice' AND collection = ?1`, colTag); got != 5 {
		t.Fatalf("alice tags applied = %d, want 5", got)
	}
	// Pagination: 5 records at 2 a page is 3 pages, each from the last cursor.
	if got := cursors(good.Requests(), "did:plc:alice", colManifest); !equal(got, []string{"", "3k001", "3k003"}) {
		t.Fatalf("alice manifest pages requested with cursors %q", got)
	}
	// 5 DIDs at 2 a page: pages from "", alice..bob's last, then carol..dave's last.
	if got := cursors(relay.Requests(), "", colManifest); !equal(got, []string{"", "did:plc:bob", "did:plc:dave"}) {
		t.Fatalf("relay pages requested with cursors %q", got)
	}
	if n := deadRelay.Count(colManifest); n != 3 {
		t.Fatalf("the dead relay was tried %d times for manifests, want 3 (MaxTries) before failover", n)
	}
	// carol's PDS is asked for manifests (with retries) and not again for tags.
	if n := broken.Count("did:plc:carol", colTag); n != 0 {
		t.Fatalf("the broken PDS was asked again for tags (%d requests) in the same run", n)
	}

	failed := map[string]string{}
	rows, err := e.db.Query(`SELECT did || ' ' || collection, error FROM backfill_repos WHERE state = 'failed'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k, v string
		_ = rows.Scan(&k, &v)
		failed[k] = v
	}
	rows.Close()
	for _, want := range []string{"did:plc:carol " + colManifest, "did:plc:dave " + colManifest, "did:plc:carol " + colTag} {
		if failed[want] == "" {
			t.Errorf("%s not recorded as failed with a reason (failed: %v)", want, failed)
		}
	}
	if len(failed) != 3 {
		t.Errorf("failed repositories = %v, want 3", failed)
	}
	var completed sql.NullInt64
	var fence, reposDone, reposFailed, recs int64
	if err := e.db.QueryRow(`SELECT completed_at, fence, repos_done, repos_failed, records FROM backfill_runs`).
		Scan(&completed, &fence, &reposDone, &reposFailed, &recs); err != nil {
		t.Fatal(err)
	}
	if !completed.Valid || fence != c.Fence || reposDone != 4 || reposFailed != 3 || recs != 20 {
		t.Fatalf("run row: completed %v fence %d repos_done %d repos_failed %d records %d", completed, fence, reposDone, reposFailed, recs)
	}

	m := e.metrics
	for class, atLeast := range map[string]float64{classRelay: 2, classResolve: 1, classServer: 3, classInvalid: 2} {
		if got := testutil.ToFloat64(m.Errors.WithLabelValues(class)); got < atLeast {
			t.Errorf("errors{class=%s} = %v, want at least %v", class, got, atLeast)
		}
	}
	if got := testutil.ToFloat64(m.Records.WithLabelValues(colManifest, "applied")); got != 15 {
		t.Errorf("records{manifest, applied} = %v, want 15", got)
	}
	if got := testutil.ToFloat64(m.Records.WithLabelValues(colManifest, "invalid")); got != 2 {
		t.Errorf("records{manifest, invalid} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.Repos.WithLabelValues(colManifest, repoFailed)); got != 2 {
		t.Errorf("repos{manifest, failed} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.Runs.WithLabelValues(runCompleted)); got != 1 {
		t.Errorf("runs{completed} = %v, want 1", got)
	}
}

func TestIntervalZeroRunsOnceAcrossTwoCustodies(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	pds := e.pds(3, "did:plc:alice")
	for _, col := range Collections {
		relay.Add(col, "did:plc:alice")
	}
	o := e.options(relay.URL())
	o.Collections = nil // every io.atcr.* collection
	o.RelayPageSize = 100
	o.RerunAfter = time.Hour

	first := e.acquire("instance-a")
	if err := e.backfiller(o).Once(context.Background(), first); err != nil {
		t.Fatalf("first custody: %v", err)
	}
	pdsRequests := len(pds.Requests())

	// Instance b takes over and runs the same job.
	second := e.acquire("instance-b")
	if second.Fence != first.Fence+1 {
		t.Fatalf("second custody fence %d, want %d", second.Fence, first.Fence+1)
	}
	if err := e.backfiller(o).Once(context.Background(), second); err != nil {
		t.Fatalf("second custody: %v", err)
	}

	for _, col := range Collections {
		if n := relay.Count(col); n != 1 {
			t.Errorf("relay saw %d listReposByCollection for %s, want exactly 1 in total", n, col)
		}
	}
	if n := len(pds.Requests()); n != pdsRequests {
		t.Errorf("the second custody asked the PDS %d more times", n-pdsRequests)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_runs`); n != 1 {
		t.Errorf("%d backfill runs recorded, want 1", n)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_runs WHERE completed_at IS NOT NULL AND fence = ?1`, first.Fence); n != 1 {
		t.Errorf("the run is not recorded as completed under fence %d", first.Fence)
	}
	if got := testutil.ToFloat64(e.metrics.Runs.WithLabelValues(runSkipped)); got != 1 {
		t.Errorf("runs{skipped} = %v, want 1", got)
	}

	// Once rerun_after has passed, a new holder runs again.
	if _, err := e.db.Exec(`UPDATE backfill_runs SET completed_at = completed_at - 2 * 3600 * 1000`); err != nil {
		t.Fatal(err)
	}
	third := e.acquire("instance-c")
	if err := e.backfiller(o).Once(context.Background(), third); err != nil {
		t.Fatalf("third custody: %v", err)
	}
	if n := relay.Count(colManifest); n != 2 {
		t.Errorf("after rerun_after the relay saw %d manifest listings, want 2", n)
	}
}

// stallOnce makes the PDS stall the first request matching match until the
// client gives up, signalling when it arrives and when it was cancelled.
func stallOnce(p *testsupport.PDS, match func(testsupport.Request) bool) (inflight, cancelled chan struct{}) {
	inflight, cancelled = make(chan struct{}), make(chan struct{})
	var stalled atomic.Bool
	p.Intercept(func(w http.ResponseWriter, r *http.Request, req testsupport.Request) bool {
		if !match(req) || !stalled.CompareAndSwap(false, true) {
			return false
		}
		close(inflight)
		<-r.Context().Done()
		close(cancelled)
		return true
	})
	return inflight, cancelled
}

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitFor):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// interruptedRun backfills four repositories (5 records each in two
// collections, one at a time) under instance-a's custody and stops it
// while c's second manifest page is in flight, checking that Run returned
// context.Canceled. It returns the peers, the options and the custody for
// the test to resume with; pds still stalls until Intercept(nil).
func (e *env) interruptedRun() (*testsupport.Relay, *testsupport.PDS, Options, fence.Custody) {
	t := e.t
	t.Helper()
	relay := testsupport.NewRelay(t)
	dids := []string{"did:plc:a", "did:plc:b", "did:plc:c", "did:plc:d"}
	pds := e.pds(5, dids...)
	relay.Add(colManifest, dids...)
	relay.Add(colTag, dids...)
	o := e.options(relay.URL())
	o.Concurrency = 1
	inflight, cancelled := stallOnce(pds, func(r testsupport.Request) bool {
		return r.Repo == "did:plc:c" && r.Collection == colManifest && r.Cursor == "3k001"
	})
	first := e.acquire("instance-a")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.backfiller(o).Run(ctx, first) }()
	wait(t, inflight, "c's second page to be requested")
	cancel()
	wait(t, cancelled, "the request in flight to be cancelled")
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("first Run returned %v, want context.Canceled", err)
	}
	return relay, pds, o, first
}

func TestFailoverMidRunResumesFromTheCheckpointWithoutDuplicates(t *testing.T) {
	e := newEnv(t)
	// The first holder is stopped while fetching c's second manifest page.
	relay, pds, o, _ := e.interruptedRun()
	if got := e.count(`SELECT COUNT(*) FROM backfilled`); got != 5+5+2 {
		t.Fatalf("%d records before failover, want 12 (a, b and c's first page)", got)
	}
	var relayCursor, recordCursor string
	_ = e.db.QueryRow(`SELECT relay_cursor FROM backfill_collections WHERE collection = ?1`, colManifest).Scan(&relayCursor)
	_ = e.db.QueryRow(`SELECT record_cursor FROM backfill_repos WHERE did = 'did:plc:c' AND collection = ?1`, colManifest).Scan(&recordCursor)
	if relayCursor != "did:plc:b" || recordCursor != "3k001" {
		t.Fatalf("checkpoint relay cursor %q, c's record cursor %q; want did:plc:b and 3k001", relayCursor, recordCursor)
	}

	pds.Intercept(nil)
	relayBefore, pdsBefore := len(relay.Requests()), len(pds.Requests())
	second := e.acquire("instance-b")
	if err := e.backfiller(o).Run(context.Background(), second); err != nil {
		t.Fatalf("second Run: %v", err)
	}

	if got := e.count(`SELECT COUNT(*) FROM backfilled`); got != 4*5*2 {
		t.Fatalf("%d records in total, want 40", got)
	}
	e.noDuplicates()
	resumed := pds.Requests()[pdsBefore:]
	if n := len(cursors(resumed, "did:plc:a", colManifest)) + len(cursors(resumed, "did:plc:b", colManifest)); n != 0 {
		t.Errorf("the new holder fetched a and b's finished manifests again (%d requests)", n)
	}
	if got := cursors(resumed, "did:plc:c", colManifest); len(got) == 0 || got[0] != "3k001" {
		t.Errorf("the new holder fetched c's manifests from cursors %q, want to resume at 3k001", got)
	}
	if got := relay.Requests()[relayBefore]; got.Collection != colManifest || got.Cursor != "did:plc:b" {
		t.Errorf("the new holder's first relay request was %+v, want manifests from cursor did:plc:b", got)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfilled WHERE fence = ?1`, second.Fence); n != 40-12 {
		t.Errorf("%d records written under the new fence, want 28", n)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_runs WHERE completed_at IS NOT NULL AND fence = ?1`, second.Fence); n != 1 {
		t.Errorf("the single run was not completed under the new fence")
	}
	if n := e.count(`SELECT records FROM backfill_runs`); n != 40 {
		t.Errorf("backfill_runs.records = %d, want 40", n)
	}
}

func TestResumedRunSendsADateLikeRecordCursorExactlyAsStored(t *testing.T) {
	e := newEnv(t)
	// io.atcr.repo.page records are keyed by repository name, and a PDS
	// pages by rkey: the cursor is a name like 2024-06-02, which go-libsql
	// would hand a plain read back as 2024-06-02T00:00:00Z.
	const colRepoPage = "io.atcr.repo.page"
	relay := testsupport.NewRelay(t)
	relay.Add(colRepoPage, "did:plc:a")
	pds := testsupport.NewPDS(t)
	e.plc.Register("did:plc:a", pds.URL())
	var pages []testsupport.Record
	for day := 1; day <= 5; day++ {
		pages = append(pages, testsupport.Record{RKey: fmt.Sprintf("2024-06-%02d", day), Value: map[string]any{"$type": colRepoPage}})
	}
	pds.Put("did:plc:a", colRepoPage, pages...)
	o := e.options(relay.URL())
	o.Collections = []string{colRepoPage}

	inflight, cancelled := stallOnce(pds, func(r testsupport.Request) bool { return r.Cursor == "2024-06-02" })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.backfiller(o).Run(ctx, e.acquire("instance-a")) }()
	wait(t, inflight, "the second page to be requested")
	cancel()
	wait(t, cancelled, "the request in flight to be cancelled")
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("first Run returned %v, want context.Canceled", err)
	}

	pds.Intercept(nil)
	before := len(pds.Requests())
	if err := e.backfiller(o).Run(context.Background(), e.acquire("instance-b")); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	if got := cursors(pds.Requests()[before:], "did:plc:a", colRepoPage); !equal(got, []string{"2024-06-02", "2024-06-04"}) {
		t.Fatalf("the new holder asked for pages with cursors %q, want [2024-06-02 2024-06-04]", got)
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled`); got != 5 {
		t.Fatalf("%d records, want 5", got)
	}
	e.noDuplicates()
}

func TestShutdownCancelsTheRequestInFlightAndNothingIsWrittenAfter(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	pds := e.pds(5, "did:plc:a", "did:plc:b")
	relay.Add(colManifest, "did:plc:a", "did:plc:b")
	inflight, cancelled := stallOnce(pds, func(r testsupport.Request) bool { return r.Cursor == "3k003" })

	var returned atomic.Bool
	var lateWrites atomic.Int64
	e.afterWrite = func(string) {
		if returned.Load() {
			lateWrites.Add(1)
		}
	}
	before := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		err := e.backfiller(e.options(relay.URL())).Run(ctx, e.acquire("instance-a"))
		returned.Store(true)
		done <- err
	}()
	wait(t, inflight, "a request to be in flight")
	cancel()
	wait(t, cancelled, "the PDS to see its request cancelled")
	var err error
	select {
	case err = <-done:
	case <-time.After(waitFor):
		t.Fatal("Run did not return after its context was cancelled")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v, want context.Canceled", err)
	}
	writes := e.writes.Load()
	e.http.Transport.(*http.Transport).CloseIdleConnections()
	// Nothing Run started is still running, so nothing can write later.
	testsupport.VerifyNone(t, before)
	if lateWrites.Load() != 0 || e.writes.Load() != writes {
		t.Fatalf("%d writes after Run returned", e.writes.Load()-writes)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_runs WHERE completed_at IS NULL`); n != 1 {
		t.Fatalf("the interrupted run is not left unfinished for the next holder")
	}
	if got := testutil.ToFloat64(e.metrics.Runs.WithLabelValues(runInterrupted)); got != 1 {
		t.Errorf("runs{interrupted} = %v, want 1", got)
	}
}

func TestASupersededCustodyCannotWriteRecordsOrCheckpoints(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	pds := e.pds(5, "did:plc:a")
	relay.Add(colManifest, "did:plc:a")
	c := e.acquire("instance-a")
	// While a's second page is being fetched, instance b takes the lease over.
	pds.Intercept(func(w http.ResponseWriter, r *http.Request, req testsupport.Request) bool {
		if req.Cursor == "3k001" {
			if _, err := e.db.Exec(`UPDATE leases SET holder = 'instance-b', fence = fence + 1 WHERE name = ?1`, LeaseName); err != nil {
				t.Error(err)
			}
		}
		return false
	})
	writes := func() int64 { return e.writes.Load() }
	o := e.options(relay.URL())
	o.Concurrency = 1
	err := e.backfiller(o).Run(context.Background(), c)
	if !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("Run returned %v, want fence.ErrSuperseded", err)
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled`); got != 2 {
		t.Fatalf("%d records applied, want only the first page's 2", got)
	}
	var cursor string
	_ = e.db.QueryRow(`SELECT record_cursor FROM backfill_repos WHERE did = 'did:plc:a'`).Scan(&cursor)
	if cursor != "3k001" {
		t.Fatalf("checkpoint moved to %q after supersession, want 3k001", cursor)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_runs WHERE completed_at IS NULL AND fence = ?1`, c.Fence); n != 1 {
		t.Fatalf("the run row changed after supersession")
	}
	before := writes()
	// A stale custody cannot even claim a run.
	if err := e.backfiller(o).Run(context.Background(), c); !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("Run under a stale custody returned %v, want fence.ErrSuperseded", err)
	}
	if writes() != before {
		t.Fatalf("a stale custody wrote %d times", writes()-before)
	}
}

func TestOnceResumesAnUnfinishedRunUntilItCompletes(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	e.pds(1, "did:plc:a")
	relay.Add(colManifest, "did:plc:a")
	relay.Add(colTag, "did:plc:a")
	var outage atomic.Int32
	outage.Store(4) // longer than one run's MaxTries of 3
	relay.Intercept(func(w http.ResponseWriter, r *http.Request, req testsupport.Request) bool {
		if req.Collection == colTag && outage.Add(-1) >= 0 {
			testsupport.XRPCError(w, http.StatusServiceUnavailable, "Unavailable", "maintenance")
			return true
		}
		return false
	})
	o := e.options(relay.URL())
	o.OnceRetryMin, o.OnceRetryMax = time.Millisecond, 5*time.Millisecond
	if err := e.backfiller(o).Once(context.Background(), e.acquire("instance-a")); err != nil {
		t.Fatalf("Once: %v", err)
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled`); got != 2 {
		t.Fatalf("%d records, want 2", got)
	}
	e.noDuplicates()
	if n := relay.Count(colManifest); n != 1 {
		t.Errorf("manifests listed %d times, want once: the resumed run skips the finished collection", n)
	}
	if got := testutil.ToFloat64(e.metrics.Runs.WithLabelValues(runIncomplete)); got != 1 {
		t.Errorf("runs{incomplete} = %v, want 1", got)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_runs`); n != 1 {
		t.Errorf("%d runs recorded, want the one run resumed", n)
	}
}

func TestOneRecordTheDatabaseRefusesDoesNotStallTheRun(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	e.pds(5, "did:plc:alice")
	relay.Add(colManifest, "did:plc:alice")
	relay.Add(colTag, "did:plc:alice")
	// Like a repository_stats refresh that overflows: the record's effect
	// fails the whole transaction it is in, not just its own savepoint.
	const poisoned = "3k002"
	poisonFails := ApplierFunc(func(ctx context.Context, tx *sql.Tx, c fence.Custody, events []jetstream.Event) (Applied, error) {
		for _, ev := range events {
			if ev.Commit.Collection == colManifest && ev.Commit.RKey == poisoned {
				return Applied{}, errors.New("refresh repository_stats: failed to execute query UPDATE repository_stats\nerror code = 2: Error executing statement: SQLite failure: `integer overflow`")
			}
		}
		return fakeApplier(ctx, tx, c, events)
	})
	o := e.options(relay.URL())
	o.Applier = poisonFails
	c := e.acquire("instance-a")
	if err := e.backfiller(o).Run(context.Background(), c); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled WHERE collection = ?1`, colManifest); got != 4 {
		t.Fatalf("%d manifests applied, want the 4 beside the refused one", got)
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled WHERE rkey = ?1 AND collection = ?2`, poisoned, colManifest); got != 0 {
		t.Fatal("the refused record was applied")
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled WHERE collection = ?1`, colTag); got != 5 {
		t.Fatalf("%d tags applied, want 5", got)
	}
	e.noDuplicates()
	if got := e.count(`SELECT COUNT(*) FROM backfill_runs WHERE completed_at IS NOT NULL AND repos_done = 2 AND records = 10`); got != 1 {
		t.Fatal("the run is not completed with both collections of alice done and 10 records counted")
	}
	if got := testutil.ToFloat64(e.metrics.Errors.WithLabelValues(classDatabase)); got != 1 {
		t.Errorf("errors{db_error} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(e.metrics.Records.WithLabelValues(colManifest, "skipped")); got != 1 {
		t.Errorf("records{manifest, skipped} = %v, want 1", got)
	}
}

func TestADatabaseFailureOfAPageStopsTheRunWithoutSkippingRecords(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	e.pds(3, "did:plc:alice")
	relay.Add(colManifest, "did:plc:alice")
	o := e.options(relay.URL())
	o.Collections = []string{colManifest}
	o.Applier = ApplierFunc(func(context.Context, *sql.Tx, fence.Custody, []jetstream.Event) (Applied, error) {
		return Applied{}, errors.New("database is locked")
	})
	if err := e.backfiller(o).Run(context.Background(), e.acquire("instance-a")); err == nil {
		t.Fatal("Run succeeded over a locked database")
	}
	if got := e.count(`SELECT COUNT(*) FROM backfill_repos WHERE record_cursor <> ''`); got != 0 {
		t.Fatal("a checkpoint moved past records that were never applied")
	}
	if got := testutil.ToFloat64(e.metrics.Errors.WithLabelValues(classDatabase)); got != 0 {
		t.Errorf("errors{db_error} = %v, want no record skipped", got)
	}
}
