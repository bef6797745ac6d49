package processor_test

import (
	"context"
	"errors"
	"fmt"
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
)

// fakeHandles is a HandleResolver whose answers a test sets.
type fakeHandles struct {
	mu        sync.Mutex
	handles   map[string]string
	failing   map[string]bool
	refreshed []string
}

func (f *fakeHandles) Handle(_ context.Context, did string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failing[did] {
		return "", errors.New("directory unreachable")
	}
	return f.handles[did], nil
}

func (f *fakeHandles) refreshedDIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.refreshed)
}

func identityEvent(did string, us int64, handle string) jetstream.Event {
	return jetstream.Event{DID: did, TimeUS: us, Kind: jetstream.KindIdentity,
		Identity: &jetstream.Identity{DID: did, Handle: handle}}
}

func (f *fakeHandles) RefreshHandle(ctx context.Context, did string) (string, error) {
	f.mu.Lock()
	f.refreshed = append(f.refreshed, did)
	f.mu.Unlock()
	return f.Handle(ctx, did)
}

// applyWithHandles returns a function that applies a batch as the consumer
// does (PrepareBatch, then Apply under a fresh custody), verifying handles
// with res.
func applyWithHandles(t *testing.T, db *database.DB, res *fakeHandles) func(events ...jetstream.Event) {
	p := processor.New(processor.Options{Log: zerolog.Nop(), Handles: res})
	c := acquire(t, db, "jetstream-consumer", "instance-a")
	return func(events ...jetstream.Event) {
		t.Helper()
		ctx := p.PrepareBatch(context.Background(), db, events)
		if _, err := p.Apply(ctx, db, c, events); err != nil {
			t.Fatal(err)
		}
	}
}

func userHandle(t *testing.T, db *database.DB, did string) string {
	t.Helper()
	var h string
	if err := db.QueryRow(`SELECT handle FROM users WHERE did = ?1`, did).Scan(&h); err != nil {
		t.Fatalf("users row of %s: %v", did, err)
	}
	return h
}

// Bluesky's relay forwards #identity events without a handle: on the old
// code users.handle stayed empty for every account, including after a
// handle change. The handle now comes from the DID document, verified,
// when a user's row is created and on every #identity event.
func TestHandlesComeFromTheResolverNotTheEvent(t *testing.T) {
	db := testsupport.OpenDB(t)
	res := &fakeHandles{handles: map[string]string{"did:plc:alice": "alice.test"}, failing: map[string]bool{}}
	apply := applyWithHandles(t, db, res)
	// Live events: each #identity event is newer than the last refresh.
	now := time.Now().UnixMicro()
	identity := func(did string, us int64, handle string) jetstream.Event {
		return identityEvent(did, now+us, handle)
	}
	apply(commit("did:plc:alice", now+10, "create", "io.atcr.tag", "t1", tagRecord("app", "latest", "sha256:"+strings.Repeat("a", 64))))
	if h := userHandle(t, db, "did:plc:alice"); h != "alice.test" {
		t.Fatalf("a new user's handle = %q, want alice.test from its DID document", h)
	}
	// A handle change, announced without a handle.
	res.mu.Lock()
	res.handles["did:plc:alice"] = "alice2.test"
	res.mu.Unlock()
	apply(identity("did:plc:alice", 20, ""))
	if h := userHandle(t, db, "did:plc:alice"); h != "alice2.test" {
		t.Fatalf("after #identity: %q, want alice2.test", h)
	}
	if len(res.refreshedDIDs()) != 1 || res.refreshed[0] != "did:plc:alice" {
		t.Fatalf("refreshed %v, want the cache of did:plc:alice purged once", res.refreshed)
	}
	// An event claiming a handle the DID document does not verify.
	res.mu.Lock()
	res.handles["did:plc:alice"] = ""
	res.mu.Unlock()
	apply(identity("did:plc:alice", 30, "impostor.test"))
	if h := userHandle(t, db, "did:plc:alice"); h != "" {
		t.Fatalf("unverified handle kept: %q", h)
	}
	// A directory outage keeps the row's handle, and the event's own
	// handle is not taken instead: the owner of a did:web whose document
	// host hangs could otherwise name itself with anyone's handle.
	res.mu.Lock()
	res.handles["did:plc:alice"] = "alice3.test"
	res.failing["did:plc:alice"] = true
	res.mu.Unlock()
	apply(identity("did:plc:alice", 40, ""))
	if h := userHandle(t, db, "did:plc:alice"); h != "" {
		t.Fatalf("outage changed the handle to %q", h)
	}
	apply(identity("did:plc:alice", 50, "atcr.io"))
	if h := userHandle(t, db, "did:plc:alice"); h != "" {
		t.Fatalf("outage took the event's unverified handle %q", h)
	}
}

// Without a resolver (none configured) no handle is stored at all: the
// event's is never verified.
func TestWithoutAResolverTheEventsHandleIsNotStored(t *testing.T) {
	db := testsupport.OpenDB(t)
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	now := time.Now().UnixMicro()
	events := []jetstream.Event{
		commit("did:plc:bob", now+10, "create", "io.atcr.tag", "t1", tagRecord("app", "latest", "sha256:"+strings.Repeat("a", 64))),
		identityEvent("did:plc:bob", now+20, "Bob.EXAMPLE.com"),
	}
	if _, err := p.Apply(context.Background(), db, unfenced, events); err != nil {
		t.Fatal(err)
	}
	if h := userHandle(t, db, "did:plc:bob"); h != "" {
		t.Fatalf("handle %q stored from the event", h)
	}
	// An identity naming another DID than its event is refused.
	other := identityEvent("did:plc:bob", now+30, "")
	other.Identity.DID = "did:plc:carol"
	res, err := p.Apply(context.Background(), db, unfenced, []jetstream.Event{other})
	if err != nil || res.Skipped[processor.ReasonBadValue] != 1 {
		t.Fatalf("identity of another DID: %+v, %v; want it skipped as bad_value", res, err)
	}
}

// A user whose first handle lookup failed (directory down, timeout) got a
// row without a handle and, being "known", was never looked up again: the
// handle stayed empty until the account's next #identity event. Found on
// the real chain under load. A later batch with a record of that DID now
// verifies it again and fills the handle in.
func TestAHandleWhoseFirstLookupFailedIsFilledInByALaterBatch(t *testing.T) {
	db := testsupport.OpenDB(t)
	res := &fakeHandles{handles: map[string]string{"did:plc:bob": "bob.test"}, failing: map[string]bool{"did:plc:bob": true}}
	apply := applyWithHandles(t, db, res)
	digest := "sha256:" + strings.Repeat("b", 64)
	apply(commit("did:plc:bob", 10, "create", "io.atcr.tag", "t1", tagRecord("app", "latest", digest)))
	if h := userHandle(t, db, "did:plc:bob"); h != "" {
		t.Fatalf("handle %q while the directory was down", h)
	}
	res.mu.Lock()
	res.failing["did:plc:bob"] = false
	res.mu.Unlock()
	apply(commit("did:plc:bob", 20, "create", "io.atcr.tag", "t2", tagRecord("app", "v2", digest)))
	if h := userHandle(t, db, "did:plc:bob"); h != "bob.test" {
		t.Fatalf("handle after the directory came back = %q, want bob.test", h)
	}
	// Once set, a handle changes only with #identity events: a later lookup
	// saying otherwise does not overwrite it.
	res.mu.Lock()
	res.handles["did:plc:bob"] = "other.test"
	res.mu.Unlock()
	apply(commit("did:plc:bob", 30, "create", "io.atcr.tag", "t3", tagRecord("app", "v3", digest)))
	if h := userHandle(t, db, "did:plc:bob"); h != "bob.test" {
		t.Fatalf("a set handle changed without #identity: %q", h)
	}
}

// The first #identity event of a DID with no users row is kept (a row,
// so that later events have something to update): its handle is
// verified like a new user's, and so is that of a DID whose first event
// is an #account event. A DID with a row is not looked up again for an
// #account event.
func TestTheFirstEventOfAnUnknownAccountKeepsARowWithItsVerifiedHandle(t *testing.T) {
	db := testsupport.OpenDB(t)
	res := &fakeHandles{handles: map[string]string{"did:plc:alice": "alice.test", "did:plc:carol": "carol.test",
		"did:plc:stranger": "stranger.test", "did:plc:dora": "dora.test"}, failing: map[string]bool{}}
	apply := applyWithHandles(t, db, res)
	now := time.Now().UnixMicro()
	digest := "sha256:" + strings.Repeat("c", 64)
	apply(commit("did:plc:alice", now, "create", "io.atcr.tag", "t1", tagRecord("app", "latest", digest)))
	apply(identityEvent("did:plc:stranger", now+1, ""), identityEvent("did:plc:alice", now+2, ""),
		identityEvent("did:plc:carol", now+3, ""), commit("did:plc:carol", now+4, "create", "io.atcr.tag", "t1", tagRecord("app", "latest", digest)),
		accountEvent("did:plc:dora", now+5, false, "deactivated"), accountEvent("did:plc:alice", now+6, true, ""))
	got := res.refreshedDIDs()
	slices.Sort(got)
	if want := []string{"did:plc:alice", "did:plc:carol", "did:plc:stranger"}; !slices.Equal(got, want) {
		t.Fatalf("refreshed %v, want %v (every #identity DID)", got, want)
	}
	for did, want := range map[string]string{"did:plc:stranger": "stranger.test", "did:plc:carol": "carol.test", "did:plc:dora": "dora.test"} {
		if h := userHandle(t, db, did); h != want {
			t.Fatalf("%s's handle = %q, want %q", did, h, want)
		}
	}
	var active int
	var status string
	if err := db.DB.QueryRow(`SELECT active, status FROM users WHERE did = 'did:plc:dora'`).Scan(&active, &status); err != nil ||
		active != 0 || status != "deactivated" {
		t.Fatalf("dora's row: active %d status %q (%v), want the status of her first event", active, status, err)
	}
}

func accountEvent(did string, us int64, active bool, status string) jetstream.Event {
	return jetstream.Event{DID: did, TimeUS: us, Kind: jetstream.KindAccount,
		Account: &jetstream.Account{DID: did, Active: &active, Status: status}}
}

// Catching up on history (a backfill of the stream, a cursor rewound by
// hours) an account's every #identity event purged and re-read its DID
// document: one lookup per event, each delaying its batch. A refresh
// that started after an event (by more than the margin for clock skew)
// already read what that event announced; only newer events refresh again.
func TestOneRefreshAnswersEveryOlderIdentityEventOfTheDID(t *testing.T) {
	db := testsupport.OpenDB(t)
	res := &fakeHandles{handles: map[string]string{"did:plc:alice": "alice.test"}, failing: map[string]bool{}}
	apply := applyWithHandles(t, db, res)
	past := time.Now().Add(-time.Hour).UnixMicro()
	digest := "sha256:" + strings.Repeat("d", 64)
	apply(commit("did:plc:alice", past, "create", "io.atcr.tag", "t1", tagRecord("app", "latest", digest)))
	for i := range 5 {
		apply(identityEvent("did:plc:alice", past+int64(i+1)*1000, ""))
	}
	if got := res.refreshedDIDs(); len(got) != 1 {
		t.Fatalf("%d refreshes for five #identity events an hour old, want 1", len(got))
	}
	// A handle change announced live is refreshed.
	res.mu.Lock()
	res.handles["did:plc:alice"] = "alice2.test"
	res.mu.Unlock()
	apply(identityEvent("did:plc:alice", time.Now().UnixMicro(), ""))
	if got := res.refreshedDIDs(); len(got) != 2 {
		t.Fatalf("%d refreshes after a live #identity event, want 2", len(got))
	}
	if h := userHandle(t, db, "did:plc:alice"); h != "alice2.test" {
		t.Fatalf("handle %q after a live #identity event, want alice2.test", h)
	}
}

// During a directory outage every batch with an old #identity event of a
// user retried its lookup and waited for it. A failed refresh answers the
// older events for a minute (as long as the resolver caches a failure);
// a live event is still tried at once.
func TestAFailedRefreshIsNotRetriedForOlderEvents(t *testing.T) {
	db := testsupport.OpenDB(t)
	res := &fakeHandles{handles: map[string]string{"did:plc:alice": "alice.test"}, failing: map[string]bool{}}
	apply := applyWithHandles(t, db, res)
	past := time.Now().Add(-time.Hour).UnixMicro()
	digest := "sha256:" + strings.Repeat("e", 64)
	apply(commit("did:plc:alice", past, "create", "io.atcr.tag", "t1", tagRecord("app", "latest", digest)))
	res.mu.Lock()
	res.failing["did:plc:alice"] = true
	res.mu.Unlock()
	apply(identityEvent("did:plc:alice", past+1000, ""))
	apply(identityEvent("did:plc:alice", past+2000, ""))
	if got := res.refreshedDIDs(); len(got) != 1 {
		t.Fatalf("%d refreshes while the directory fails, want 1", len(got))
	}
	if h := userHandle(t, db, "did:plc:alice"); h != "alice.test" {
		t.Fatalf("outage changed the handle to %q", h)
	}
	apply(identityEvent("did:plc:alice", time.Now().UnixMicro(), ""))
	if got := res.refreshedDIDs(); len(got) != 2 {
		t.Fatalf("%d refreshes after a live #identity event, want 2", len(got))
	}
}

// Failed handle lookups and skipped events shared one sampled logger:
// during a directory outage its burst went to "handle not verified" and a
// new user found invalid records counted but never logged. Each now has
// its own burst.
func TestFailedLookupsDoNotUseUpTheSkippedEventsLogBurst(t *testing.T) {
	db := testsupport.OpenDB(t)
	res := &fakeHandles{handles: map[string]string{}, failing: map[string]bool{}}
	var events []jetstream.Event
	now := time.Now().UnixMicro()
	digest := "sha256:" + strings.Repeat("f", 64)
	for i := range 12 {
		did := fmt.Sprintf("did:plc:user%02d", i)
		res.failing[did] = true
		events = append(events, commit(did, now+int64(i), "create", "io.atcr.tag", "t1", tagRecord("app", "latest", digest)))
	}
	events = append(events, commit("did:plc:user00", now+100, "create", "io.atcr.tag", "bad", map[string]any{"repository": "app"}))
	var logs testsupport.LockedBuffer
	p := processor.New(processor.Options{Log: zerolog.New(&logs), Handles: res, LogBurst: 5})
	c := acquire(t, db, "jetstream-consumer", "instance-a")
	ctx := p.PrepareBatch(context.Background(), db, events)
	if _, err := p.Apply(ctx, db, c, events); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if n := strings.Count(out, "handle not verified"); n != 5 {
		t.Errorf("%d lookup warnings, want the burst of 5", n)
	}
	if !strings.Contains(out, "event skipped") {
		t.Errorf("the invalid tag was not logged after the lookup warnings:\n%s", out)
	}
}

// A commit the decoder already found invalid makes no users row, so its
// DID's handle is not looked up: a new user's flood of 500 invalid tags
// from 500 new DIDs became 500 directory requests a delivery.
func TestInvalidCommitsCauseNoHandleLookups(t *testing.T) {
	db := testsupport.OpenDB(t)
	res := &fakeHandles{handles: map[string]string{}, failing: map[string]bool{}}
	var events []jetstream.Event
	now := time.Now().UnixMicro()
	for i := range 20 {
		did := fmt.Sprintf("did:plc:bad%02d", i)
		res.failing[did] = true // a lookup would be logged as failed
		ev := commit(did, now+int64(i), "create", "io.atcr.tag", "t1", map[string]any{"repository": "app", "TAG": "latest"})
		processor.Prepare(&ev)
		events = append(events, ev)
	}
	var logs testsupport.LockedBuffer
	p := processor.New(processor.Options{Log: zerolog.New(&logs), Handles: res})
	ctx := p.PrepareBatch(context.Background(), db, events)
	res2, err := p.Apply(ctx, db, acquire(t, db, "jetstream-consumer", "instance-a"), events)
	if err != nil || res2.Skipped[processor.ReasonMissingField] != 20 {
		t.Fatalf("apply: %+v, %v; want the 20 invalid tags skipped", res2, err)
	}
	if strings.Contains(logs.String(), "handle not verified") {
		t.Errorf("handles of invalid commits were looked up:\n%s", logs.String())
	}
}
