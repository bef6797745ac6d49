package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/webhooks"
)

func accountEv(did string, us int64, active bool, status string) jetstream.Event {
	return jetstream.Event{DID: did, TimeUS: us, Kind: jetstream.KindAccount,
		Account: &jetstream.Account{DID: did, Active: &active, Status: status}}
}

func identityEv(did string, us int64) jetstream.Event {
	return jetstream.Event{DID: did, TimeUS: us, Kind: jetstream.KindIdentity, Identity: &jetstream.Identity{DID: did}}
}

// queued is the re-read queue: DID → reason.
func queued(t *testing.T, db *database.DB) map[string]string {
	t.Helper()
	rows, err := db.Query(`SELECT CAST(did AS TEXT), CAST(reason AS TEXT) FROM repo_resyncs`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var did, reason string
		if err := rows.Scan(&did, &reason); err != nil {
			t.Fatal(err)
		}
		out[did] = reason
	}
	return out
}

func userRow(t *testing.T, db *database.DB, did string) string {
	t.Helper()
	var active int
	var status string
	if err := db.QueryRow(`SELECT active, status FROM users WHERE did = ?1`, did).Scan(&active, &status); err != nil {
		return "none"
	}
	return fmt.Sprintf("%d|%s", active, status)
}

// An index that never saw an account's records learns of them from its
// lifecycle events: the first #account event of an unknown DID keeps a
// users row with its status and, when it says active, queues the same
// re-read a #sync does; an #account event making an inactive row active
// queues one; an inactive one never does. Found on the real chain: an
// index built by backfill while the account was deactivated stayed
// without its records after the reactivation.
func TestAccountEventsThatMayLeaveARepositoryIncompleteQueueAReRead(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	ctx := context.Background()
	now := time.Now().UnixMicro()
	pl := testPipeline(db, c, p, webhooks.EnqueueTx)
	out, err := pl.prefix(ctx, part{host: "h", events: []jetstream.Event{
		accountEv("did:plc:new", now, true, ""),
		accountEv("did:plc:asleep", now+1, false, "deactivated"),
		identityEv("did:plc:named", now+2),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if out.rereads != 2 || out.shed != 0 {
		t.Fatalf("rereads %d shed %d, want 2 queued (the active first event, the #identity first event)", out.rereads, out.shed)
	}
	if got, want := queued(t, db), map[string]string{"did:plc:new": processor.RereadFirst, "did:plc:named": processor.RereadFirst}; !equalMaps(got, want) {
		t.Fatalf("queue %v, want %v", got, want)
	}
	for did, want := range map[string]string{"did:plc:new": "1|", "did:plc:asleep": "0|deactivated", "did:plc:named": "1|"} {
		if got := userRow(t, db, did); got != want {
			t.Fatalf("users %s = %s, want %s (the first event is kept)", did, got, want)
		}
	}
	if _, err := db.Exec(`DELETE FROM repo_resyncs`); err != nil {
		t.Fatal(err)
	}
	// Reactivation of the inactive row: a re-read. A repeated active event
	// and a deactivation: none.
	if _, err := pl.prefix(ctx, part{host: "h", events: []jetstream.Event{
		accountEv("did:plc:asleep", now+10, true, ""),
		accountEv("did:plc:new", now+11, true, ""),
		accountEv("did:plc:named", now+12, false, "takendown"),
	}}); err != nil {
		t.Fatal(err)
	}
	if got, want := queued(t, db), map[string]string{"did:plc:asleep": processor.RereadAccount}; !equalMaps(got, want) {
		t.Fatalf("queue %v, want %v", got, want)
	}
	// A repository a backfill skipped or failed (repo_incomplete) is
	// re-read on its next #account (active) or #identity event even with
	// an active row.
	for _, q := range []string{`DELETE FROM repo_resyncs`, `INSERT INTO repo_incomplete (did, reason, noted_at) VALUES ('did:plc:new', 'backfill-failed', 0)`} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pl.prefix(ctx, part{host: "h", events: []jetstream.Event{identityEv("did:plc:new", now+20)}}); err != nil {
		t.Fatal(err)
	}
	if got, want := queued(t, db), map[string]string{"did:plc:new": processor.RereadIdentity}; !equalMaps(got, want) {
		t.Fatalf("queue %v, want %v", got, want)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// endpointHandles is a processor.HandleResolver and EndpointResolver whose
// DID documents name the PDS in pds.
type endpointHandles struct {
	mu  sync.Mutex
	pds map[string]string
}

func (e *endpointHandles) Handle(context.Context, string) (string, error) { return "", nil }
func (e *endpointHandles) RefreshHandle(context.Context, string) (string, error) {
	return "", nil
}
func (e *endpointHandles) PDSEndpoint(_ context.Context, did string) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pds[did], nil
}

// An #identity event whose DID document names another PDS than the one
// the users row recorded means the repository moved (a PDS migration):
// what the new PDS holds may differ, so it is re-read there. One naming
// the same PDS queues nothing.
func TestAnIdentityEventThatMovesTheAccountToAnotherPDSQueuesAReRead(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	res := &endpointHandles{pds: map[string]string{"did:plc:mover": "https://old.example"}}
	p := processor.New(processor.Options{Log: zerolog.Nop(), Handles: res})
	ctx := context.Background()
	now := time.Now().UnixMicro()
	pl := testPipeline(db, c, p, webhooks.EnqueueTx)
	commitOf := func(events ...jetstream.Event) {
		t.Helper()
		if _, err := pl.prefix(ctx, part{host: "h", events: events}); err != nil {
			t.Fatal(err)
		}
	}
	commitOf(accountEv("did:plc:mover", now, true, ""))
	var pds string
	if err := db.QueryRow(`SELECT pds FROM users WHERE did = 'did:plc:mover'`).Scan(&pds); err != nil || pds != "https://old.example" {
		t.Fatalf("users.pds %q (%v), want the PDS its DID document named", pds, err)
	}
	if _, err := db.Exec(`DELETE FROM repo_resyncs`); err != nil {
		t.Fatal(err)
	}
	commitOf(identityEv("did:plc:mover", now+1))
	if got := queued(t, db); len(got) != 0 {
		t.Fatalf("queue %v after an #identity naming the same PDS, want none", got)
	}
	res.mu.Lock()
	res.pds["did:plc:mover"] = "https://new.example"
	res.mu.Unlock()
	commitOf(identityEv("did:plc:mover", now+2))
	if got, want := queued(t, db), map[string]string{"did:plc:mover": processor.RereadIdentity}; !equalMaps(got, want) {
		t.Fatalf("queue %v, want %v", got, want)
	}
	if err := db.QueryRow(`SELECT pds FROM users WHERE did = 'did:plc:mover'`).Scan(&pds); err != nil || pds != "https://new.example" {
		t.Fatalf("users.pds %q (%v), want the new PDS", pds, err)
	}
}

// Jetstream sends every account's lifecycle events: re-reads of first
// events (DIDs with no users row) wait in the queue up to a bound, past
// which they are shed (a backfill run reads those repositories); a
// re-read of an account the index knows is never shed, and a request for
// a repository already queued is not counted twice.
func TestReReadsOfFirstEventsAreBoundedAndTheRestShed(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	ctx := context.Background()
	now := time.Now().UnixMicro()
	pl := testPipeline(db, c, p, webhooks.EnqueueTx)
	pl.firstEvents = 3
	var events []jetstream.Event
	for i := range 5 {
		events = append(events, accountEv(fmt.Sprintf("did:plc:stranger%d", i), now+int64(i), true, ""))
	}
	out, err := pl.prefix(ctx, part{host: "h", events: events})
	if err != nil {
		t.Fatal(err)
	}
	if out.rereads != 3 || out.shed != 2 {
		t.Fatalf("queued %d shed %d, want 3 and 2", out.rereads, out.shed)
	}
	// A known account's reactivation is queued past the bound.
	out, err = pl.prefix(ctx, part{host: "h", events: []jetstream.Event{
		accountEv("did:plc:stranger4", now+10, false, "deactivated"), accountEv("did:plc:stranger4", now+11, true, ""),
		accountEv("did:plc:stranger9", now+12, true, "")}})
	if err != nil {
		t.Fatal(err)
	}
	if out.rereads != 1 || out.shed != 1 {
		t.Fatalf("queued %d shed %d, want the reactivation queued and the new stranger shed", out.rereads, out.shed)
	}
	if got := len(queued(t, db)); got != 4 {
		t.Fatalf("%d queued, want 4", got)
	}
}

// pdsFake serves the XRPC a re-read asks a PDS, for one repository whose
// state a test sets, and counts the requests by method.
type pdsFake struct {
	mu       sync.Mutex
	refusal  string // an XRPC error name: every repository request is refused with it
	records  map[string][]string
	calls    map[string]int
	describe bool // answer describeRepo (else 404)
	srv      *httptest.Server
}

func newPDSFake(t *testing.T) *pdsFake {
	f := &pdsFake{records: map[string][]string{}, calls: map[string]int{}, describe: true}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *pdsFake) serve(w http.ResponseWriter, r *http.Request) {
	method := strings.TrimPrefix(r.URL.Path, "/xrpc/")
	did := r.URL.Query().Get("did") + r.URL.Query().Get("repo")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[method]++
	if f.refusal != "" {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":%q,"message":"Repo refused: %s"}`, f.refusal, did)
		return
	}
	switch method {
	case "com.atproto.sync.getLatestCommit":
		fmt.Fprint(w, `{"cid":"bafy","rev":"3l3qo2vutsw44"}`)
	case "com.atproto.repo.describeRepo":
		if !f.describe {
			http.NotFound(w, r)
			return
		}
		cols := []string{"app.bsky.actor.profile"}
		for col, recs := range f.records {
			if len(recs) > 0 {
				cols = append(cols, col)
			}
		}
		b, _ := json.Marshal(cols)
		fmt.Fprintf(w, `{"did":%q,"handle":"x.test","collections":%s}`, did, b)
	case "com.atproto.repo.listRecords":
		col := r.URL.Query().Get("collection")
		var recs []string
		for _, v := range f.records[col] {
			recs = append(recs, fmt.Sprintf(`{"uri":"at://%s/%s/%s","cid":"bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm","value":%s}`,
				did, col, v[:strings.Index(v, " ")], v[strings.Index(v, " ")+1:]))
		}
		fmt.Fprintf(w, `{"records":[%s]}`, strings.Join(recs, ","))
	default:
		http.NotFound(w, r)
	}
}

func (f *pdsFake) set(fn func(f *pdsFake)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *pdsFake) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// A re-read takes the account's status from its PDS: a refusal as
// deactivated or taken down makes an active row inactive with that status
// and notes the repository in repo_incomplete, so the #account event that
// makes it active again re-reads it. A repository served clears the note
// but does not make an inactive row active (a relay takes accounts down
// by #account events while their PDS may still serve them): the #account
// event does. An #account event applied while the PDS was being asked is
// newer than its answer and wins.
func TestAReReadTakesTheAccountStatusFromThePDS(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	ctx := context.Background()
	const did = "did:plc:lifecycle"
	now := time.Now().UnixMicro()
	pl := testPipeline(db, c, p, webhooks.EnqueueTx)
	if _, err := pl.prefix(ctx, part{host: "h", events: []jetstream.Event{accountEv(did, now, true, "")}}); err != nil {
		t.Fatal(err)
	}
	pds := newPDSFake(t)
	r := NewResyncer(db, staticPDS(pds.srv.URL), p, time.Millisecond, zerolog.Nop(), nil)
	pds.set(func(f *pdsFake) { f.refusal = "RepoTakendown" })
	if err := r.one(ctx, c, did); err != nil {
		t.Fatal(err)
	}
	if got := userRow(t, db, did); got != "0|takendown" {
		t.Fatalf("users after a RepoTakendown refusal: %s, want 0|takendown", got)
	}
	var notes int
	if err := db.QueryRow(`SELECT COUNT(*) FROM repo_incomplete WHERE did = ?1`, did).Scan(&notes); err != nil || notes != 1 {
		t.Fatalf("repo_incomplete rows %d (%v), want 1", notes, err)
	}
	if got := queued(t, db); len(got) != 0 {
		t.Fatalf("queue %v after the refusal, want empty", got)
	}
	// Served again, with a tag: the records and the note follow, the
	// status waits for the #account event.
	digest := "sha256:" + strings.Repeat("a", 64)
	pds.set(func(f *pdsFake) {
		f.refusal = ""
		f.records[processor.CollectionTag] = []string{`t1 {"repository":"r","tag":"t1","manifestDigest":"` + digest + `","createdAt":"2026-01-01T00:00:00Z"}`}
	})
	if _, err := db.Exec(requestResyncSQL, did, reasonSync); err != nil {
		t.Fatal(err)
	}
	if err := r.one(ctx, c, did); err != nil {
		t.Fatal(err)
	}
	if got := userRow(t, db, did); got != "0|takendown" {
		t.Fatalf("users after a re-read the PDS served: %s, want 0|takendown until an #account event says otherwise", got)
	}
	var tags int
	if err := db.QueryRow(`SELECT (SELECT COUNT(*) FROM repo_incomplete), (SELECT COUNT(*) FROM tags WHERE did = ?1)`, did).Scan(&notes, &tags); err != nil ||
		notes != 0 || tags != 1 {
		t.Fatalf("%d notes and %d tags (%v), want 0 and 1", notes, tags, err)
	}
	if _, err := pl.prefix(ctx, part{host: "h", events: []jetstream.Event{accountEv(did, now+10, true, "")}}); err != nil {
		t.Fatal(err)
	}
	if got := userRow(t, db, did); got != "1|" {
		t.Fatalf("users after the #account event: %s, want 1|", got)
	}
	// An #account event applied after the re-read read the users row and
	// before it wrote: the PDS's older answer does not overwrite it.
	before, err := r.readUser(ctx, did)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pl.prefix(ctx, part{host: "h", events: []jetstream.Event{accountEv(did, now+20, true, "")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Apply(ctx, db, c, statusEvents(did, before, "deactivated")); err != nil {
		t.Fatal(err)
	}
	if got := userRow(t, db, did); got != "1|" {
		t.Fatalf("users %s: the PDS's answer overwrote a newer #account event", got)
	}
}

// describeRepo tells a re-read which collections hold records: an account
// with no io.atcr.* record (the first event of an account new to this
// index, as a rule) costs getLatestCommit and describeRepo, not one
// listRecords per collection. A collection the database holds rows of is
// listed whatever describeRepo says, so what is removed is decided by
// listRecords; a PDS that does not answer describeRepo gets every
// collection listed.
func TestAReReadListsOnlyTheCollectionsThePDSOrTheIndexHas(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	ctx := context.Background()
	pds := newPDSFake(t)
	r := NewResyncer(db, staticPDS(pds.srv.URL), p, time.Millisecond, zerolog.Nop(), nil)
	if err := r.one(ctx, c, "did:plc:empty"); err != nil {
		t.Fatal(err)
	}
	if n := pds.count("com.atproto.repo.listRecords"); n != 0 {
		t.Fatalf("%d listRecords for a repository without io.atcr records, want 0", n)
	}
	// The index holds a tag the PDS no longer has: listed, and removed.
	digest := "sha256:" + strings.Repeat("b", 64)
	if _, err := p.Apply(ctx, db, c, []jetstream.Event{{DID: "did:plc:held", TimeUS: time.Now().UnixMicro(), Kind: jetstream.KindCommit,
		Commit: &jetstream.Commit{Rev: "3l3qo2vutsw22", Operation: jetstream.OpCreate, Collection: processor.CollectionTag, RKey: "gone",
			Record: json.RawMessage(`{"repository":"r","tag":"gone","manifestDigest":"` + digest + `","createdAt":"2026-01-01T00:00:00Z"}`)}}}); err != nil {
		t.Fatal(err)
	}
	if err := r.one(ctx, c, "did:plc:held"); err != nil {
		t.Fatal(err)
	}
	var tags int
	if err := db.QueryRow(`SELECT COUNT(*) FROM tags`).Scan(&tags); err != nil || tags != 0 {
		t.Fatalf("%d tags (%v) after a re-read of a repository without them, want 0", tags, err)
	}
	if n := pds.count("com.atproto.repo.listRecords"); n != 1 {
		t.Fatalf("%d listRecords, want 1 (the collection the index held)", n)
	}
	pds.set(func(f *pdsFake) { f.describe = false })
	if err := r.one(ctx, c, "did:plc:empty"); err != nil {
		t.Fatal(err)
	}
	if n := pds.count("com.atproto.repo.listRecords"); n != 1+len(resyncCollections) {
		t.Fatalf("%d listRecords, want every collection listed without describeRepo", n)
	}
}

// A request that comes in while a re-read is under way (an #account event
// making the account active while its PDS still refused it) is not
// dequeued by that re-read: the repository is read again, as asked.
func TestARequestMadeDuringAReReadOutlivesIt(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	ctx := context.Background()
	const did = "did:plc:racer"
	if _, err := db.Exec(`INSERT INTO repo_resyncs (did, reason, requested_at, next_at) VALUES (?1, 'identity', 1000, 1000)`, did); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	pds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() {
			if _, err := db.Exec(requestRereadsSQL, `[["`+did+`","account"]]`); err != nil {
				t.Error(err)
			}
		})
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":"RepoDeactivated","message":"Repo has been deactivated"}`)
	}))
	defer pds.Close()
	r := NewResyncer(db, staticPDS(pds.URL), p, time.Millisecond, zerolog.Nop(), nil)
	if err := r.one(ctx, c, did); err != nil {
		t.Fatal(err)
	}
	var requested int64
	if err := db.QueryRow(`SELECT requested_at FROM repo_resyncs WHERE did = ?1`, did).Scan(&requested); err != nil || requested <= 1000 {
		t.Fatalf("queue row requested at %d (%v): the request made during the re-read was dropped", requested, err)
	}
	// The queue serves a #sync and a known account's event before the
	// first events of unknown accounts, and those before a gap's.
	if _, err := db.Exec(`DELETE FROM repo_resyncs`); err != nil {
		t.Fatal(err)
	}
	for i, reason := range []string{reasonGap, processor.RereadFirst, processor.RereadAccount} {
		if _, err := db.Exec(`INSERT INTO repo_resyncs (did, reason, requested_at, next_at) VALUES (?1, ?2, 0, ?3)`,
			fmt.Sprintf("did:plc:q%d", i), reason, i); err != nil {
			t.Fatal(err)
		}
	}
	var order []string
	for range 3 {
		d, found, err := r.next(ctx)
		if err != nil || !found {
			t.Fatalf("next: %v %v", found, err)
		}
		order = append(order, d)
		if _, err := db.Exec(`DELETE FROM repo_resyncs WHERE did = ?1`, d); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"did:plc:q2", "did:plc:q1", "did:plc:q0"}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
}
