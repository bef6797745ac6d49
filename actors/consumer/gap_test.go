package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/webhooks"
)

// A Jetstream gap hides deletes, and records deleted and created again:
// a backfill run only adds what it lists, with no rev, so besides the run
// every repository held here is queued for a re-read at its rev (which
// removes what the PDS no longer lists). A #sync queued before keeps its
// reason and goes first.
func TestAGapQueuesAReReadOfEveryRepositoryHeldHere(t *testing.T) {
	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	ctx := context.Background()
	digest := "sha256:" + strings.Repeat("a", 64)
	tag := func(did, rkey string) jetstream.Event {
		return jetstream.Event{DID: did, TimeUS: time.Now().Add(-time.Minute).UnixMicro(), Kind: jetstream.KindCommit, Commit: &jetstream.Commit{
			Rev: "3l3qo2vutsw22", Operation: jetstream.OpCreate, Collection: processor.CollectionTag, RKey: rkey,
			Record: json.RawMessage(fmt.Sprintf(`{"repository":"r","tag":%q,"manifestDigest":%q,"createdAt":"2026-01-01T00:00:00Z"}`, rkey, digest))}}
	}
	events := []jetstream.Event{tag("did:plc:u1", "a"), tag("did:plc:u2", "b"), tag("did:plc:u3", "c"),
		{DID: "did:plc:u3", TimeUS: time.Now().Add(-time.Minute).UnixMicro(), Kind: jetstream.KindSync, Sync: &jetstream.Sync{DID: "did:plc:u3", Rev: "3l3qo2vutsw23"}}}
	if _, err := testPipeline(db, c, p, webhooks.EnqueueTx).prefix(ctx, part{host: "h", events: events}); err != nil {
		t.Fatal(err)
	}
	cons := bareConsumer(t, db, c, 0)
	r := NewResyncer(db, staticPDS("http://127.0.0.1:1"), p, time.Millisecond, zerolog.Nop(), nil)
	cons.o.Resync = r
	cons.cursorTooOld("wss://jetstream.example/subscribe", 5, 10)

	got := map[string]string{}
	rows, err := db.Query(`SELECT CAST(did AS BLOB), CAST(reason AS BLOB) FROM repo_resyncs`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var did, reason string
		if err := rows.Scan(&did, &reason); err != nil {
			t.Fatal(err)
		}
		got[did] = reason
	}
	rows.Close()
	want := map[string]string{"did:plc:u1": reasonGap, "did:plc:u2": reasonGap, "did:plc:u3": reasonSync}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("queued re-reads %v, want %v", got, want)
	}
	var gaps, runs int
	if err := db.QueryRow(`SELECT (SELECT COUNT(*) FROM jetstream_gaps), (SELECT COUNT(*) FROM backfill_runs WHERE completed_at IS NULL)`).
		Scan(&gaps, &runs); err != nil || gaps != 1 || runs != 1 {
		t.Fatalf("%d gaps and %d pending backfill runs (%v), want 1 and 1", gaps, runs, err)
	}
	if did, found, err := r.next(ctx); err != nil || !found || did != "did:plc:u3" {
		t.Fatalf("next re-read %q %v %v, want the #sync's did:plc:u3 ahead of the gap's", did, found, err)
	}
}

// A re-read of an account its PDS no longer serves (deactivated, taken
// down, gone: what a gap's re-read of every repository meets) is not a
// failure to retry eight times: it leaves the queue at once, counted
// inactive, and the rows held for the account stay.
func TestAReReadOfAnInactiveRepositoryLeavesTheQueueAndKeepsItsRows(t *testing.T) {
	for name, answer := range map[string]string{
		"RepoDeactivated":               `{"error":"RepoDeactivated","message":"Repo has been deactivated: did:plc:u1"}`,
		"RepoNotFound":                  `{"error":"RepoNotFound","message":"Could not find repo for DID: did:plc:u1"}`,
		"reference listRecords refusal": `{"error":"InvalidRequest","message":"Could not find repo: did:plc:u1"}`,
	} {
		t.Run(name, func(t *testing.T) {
			db := testsupport.OpenDB(t)
			c := acquire(t, db, "me")
			p := processor.New(processor.Options{Log: zerolog.Nop()})
			ctx := context.Background()
			digest := "sha256:" + strings.Repeat("a", 64)
			events := []jetstream.Event{
				{DID: "did:plc:u1", TimeUS: time.Now().Add(-time.Minute).UnixMicro(), Kind: jetstream.KindCommit, Commit: &jetstream.Commit{
					Rev: "3l3qo2vutsw22", Operation: jetstream.OpCreate, Collection: processor.CollectionTag, RKey: "a",
					Record: json.RawMessage(fmt.Sprintf(`{"repository":"r","tag":"a","manifestDigest":%q,"createdAt":"2026-01-01T00:00:00Z"}`, digest))}},
				{DID: "did:plc:u1", TimeUS: time.Now().Add(-time.Minute).UnixMicro(), Kind: jetstream.KindSync, Sync: &jetstream.Sync{DID: "did:plc:u1", Rev: "3l3qo2vutsw23"}},
			}
			if _, err := testPipeline(db, c, p, webhooks.EnqueueTx).prefix(ctx, part{host: "h", events: events}); err != nil {
				t.Fatal(err)
			}
			pds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/xrpc/com.atproto.sync.getLatestCommit" && name != "reference listRecords refusal" {
					w.WriteHeader(http.StatusBadRequest)
					fmt.Fprint(w, answer)
					return
				}
				switch r.URL.Path {
				case "/xrpc/com.atproto.sync.getLatestCommit":
					fmt.Fprint(w, `{"cid":"bafy","rev":"3l3qo2vutsw44"}`)
				default:
					w.WriteHeader(http.StatusBadRequest)
					fmt.Fprint(w, answer)
				}
			}))
			defer pds.Close()
			m, err := NewResyncMetrics(prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			r := NewResyncer(db, staticPDS(pds.URL), p, time.Millisecond, zerolog.Nop(), m)
			if err := r.one(ctx, c, "did:plc:u1"); err != nil {
				t.Fatal(err)
			}
			var queued, tags int
			if err := db.QueryRow(`SELECT (SELECT COUNT(*) FROM repo_resyncs), (SELECT COUNT(*) FROM tags)`).Scan(&queued, &tags); err != nil {
				t.Fatal(err)
			}
			if queued != 0 || tags != 1 {
				t.Fatalf("%d re-reads queued and %d tags after the refusal, want 0 and the 1 held", queued, tags)
			}
			if got := testutil.ToFloat64(m.outcomes.WithLabelValues(resyncInactive)); got != 1 {
				t.Fatalf("resyncs{outcome=inactive} = %v, want 1", got)
			}
		})
	}
}
