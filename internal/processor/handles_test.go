package processor_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

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

func (f *fakeHandles) RefreshHandle(ctx context.Context, did string) (string, error) {
	f.mu.Lock()
	f.refreshed = append(f.refreshed, did)
	f.mu.Unlock()
	return f.Handle(ctx, did)
}

// applyWithHandles returns a function that applies a batch as the consumer
// does (PrepareBatch, then Apply under a fresh custody), verifying handles
// with res.
func applyWithHandles(t *testing.T, db *sql.DB, res *fakeHandles) func(events ...jetstream.Event) {
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

func userHandle(t *testing.T, db *sql.DB, did string) string {
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
	apply := applyWithHandles(t, db.DB, res)
	identity := func(did string, us int64, handle string) jetstream.Event {
		return jetstream.Event{DID: did, TimeUS: us, Kind: jetstream.KindIdentity,
			Identity: &jetstream.Identity{DID: did, Handle: handle}}
	}
	apply(commit("did:plc:alice", 10, "create", "io.atcr.tag", "t1", tagRecord("app", "latest", "sha256:"+strings.Repeat("a", 64))))
	if h := userHandle(t, db.DB, "did:plc:alice"); h != "alice.test" {
		t.Fatalf("a new user's handle = %q, want alice.test from its DID document", h)
	}
	// A handle change, announced without a handle.
	res.mu.Lock()
	res.handles["did:plc:alice"] = "alice2.test"
	res.mu.Unlock()
	apply(identity("did:plc:alice", 20, ""))
	if h := userHandle(t, db.DB, "did:plc:alice"); h != "alice2.test" {
		t.Fatalf("after #identity: %q, want alice2.test", h)
	}
	if len(res.refreshed) != 1 || res.refreshed[0] != "did:plc:alice" {
		t.Fatalf("refreshed %v, want the cache of did:plc:alice purged once", res.refreshed)
	}
	// An event claiming a handle the DID document does not verify.
	res.mu.Lock()
	res.handles["did:plc:alice"] = ""
	res.mu.Unlock()
	apply(identity("did:plc:alice", 30, "impostor.test"))
	if h := userHandle(t, db.DB, "did:plc:alice"); h != "" {
		t.Fatalf("unverified handle kept: %q", h)
	}
	// A directory outage keeps the row's handle (the event's, if any).
	res.mu.Lock()
	res.handles["did:plc:alice"] = "alice3.test"
	res.failing["did:plc:alice"] = true
	res.mu.Unlock()
	apply(identity("did:plc:alice", 40, ""))
	if h := userHandle(t, db.DB, "did:plc:alice"); h != "" {
		t.Fatalf("outage changed the handle to %q", h)
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
	apply := applyWithHandles(t, db.DB, res)
	digest := "sha256:" + strings.Repeat("b", 64)
	apply(commit("did:plc:bob", 10, "create", "io.atcr.tag", "t1", tagRecord("app", "latest", digest)))
	if h := userHandle(t, db.DB, "did:plc:bob"); h != "" {
		t.Fatalf("handle %q while the directory was down", h)
	}
	res.mu.Lock()
	res.failing["did:plc:bob"] = false
	res.mu.Unlock()
	apply(commit("did:plc:bob", 20, "create", "io.atcr.tag", "t2", tagRecord("app", "v2", digest)))
	if h := userHandle(t, db.DB, "did:plc:bob"); h != "bob.test" {
		t.Fatalf("handle after the directory came back = %q, want bob.test", h)
	}
	// Once set, a handle changes only with #identity events: a later lookup
	// saying otherwise does not overwrite it.
	res.mu.Lock()
	res.handles["did:plc:bob"] = "other.test"
	res.mu.Unlock()
	apply(commit("did:plc:bob", 30, "create", "io.atcr.tag", "t3", tagRecord("app", "v3", digest)))
	if h := userHandle(t, db.DB, "did:plc:bob"); h != "bob.test" {
		t.Fatalf("a set handle changed without #identity: %q", h)
	}
}
