//go:build interop2

// Package interop2 is interop tier 2: io.atcr.* records written on
// Bluesky's reference PDS reach the index through the real chain (PLC →
// PDS → relay → Jetstream v2 → appview) and through the backfill (relay
// listRepos → PDS describeRepo/listRecords). scripts/interop.d/tier2
// installs and starts the chain and runs it; see docs/interop.md.
package interop2

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/harness"
)

func env(t *testing.T, key string) string {
	t.Helper()
	v := os.Getenv(key)
	if v == "" {
		t.Fatalf("%s is not set: run scripts/interop.d/tier2", key)
	}
	return v
}

const (
	colManifest = "io.atcr.manifest"
	colTag      = "io.atcr.tag"
	colStar     = "io.atcr.sailor.star"
	colProfile  = "io.atcr.sailor.profile"
	colPage     = "io.atcr.repo.page"
	colCaptain  = "io.atcr.hold.captain"
	colCrew     = "io.atcr.hold.crew"
	colStats    = "io.atcr.hold.stats"
)

var collections = []string{colManifest, colTag, colStar, colProfile, colPage, colCaptain, colCrew, colStats}

func digest(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

func now() string { return time.Now().UTC().Format("2006-01-02T15:04:05.000Z") }

func manifestRecord(repo, dig, hold string, blob map[string]any, list bool) map[string]any {
	r := map[string]any{
		"repository": repo, "digest": dig, "holdDid": hold, "schemaVersion": 2, "createdAt": now(),
		"manifestBlob": blob,
	}
	if list {
		r["mediaType"] = "application/vnd.oci.image.index.v1+json"
		r["manifests"] = []any{
			map[string]any{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest('1'), "size": 1024,
				"platform": map[string]any{"os": "linux", "architecture": "amd64"}},
			map[string]any{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest('2'), "size": 2048,
				"platform": map[string]any{"os": "linux", "architecture": "arm64", "variant": "v8"}},
		}
	} else {
		r["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
		r["config"] = map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest('c'), "size": 1469}
		// The largest integer the data model allows survives CBOR → JSON.
		r["layers"] = []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest('l'), "size": int64(9007199254740991)}}
		r["annotations"] = map[string]any{"org.opencontainers.image.source": "https://example.test/src"}
	}
	return r
}

// webhookReceiver counts deliveries by X-Appview-Delivery.
type webhookReceiver struct {
	mu  sync.Mutex
	got map[string]int
	srv *httptest.Server
}

func newReceiver(t *testing.T) *webhookReceiver {
	w := &webhookReceiver{got: map[string]int{}}
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.mu.Lock()
		w.got[r.Header.Get("X-Appview-Delivery")]++
		w.mu.Unlock()
	}))
	t.Cleanup(w.srv.Close)
	return w
}

func (w *webhookReceiver) counts() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, v := range w.got {
		out[k] = v
	}
	return out
}

func TestTier2(t *testing.T) {
	started := time.Now()
	defer func() { t.Logf("tier 2 suite ran in %s", time.Since(started).Round(time.Millisecond)) }()
	work := env(t, "INTEROP2_WORK")
	pds := &pdsClient{base: env(t, "INTEROP2_PDS"), bypass: env(t, "INTEROP2_BYPASS"), http: &http.Client{Timeout: 30 * time.Second}}
	plcURL, relayURL, jsURL, bin := env(t, "INTEROP2_PLC"), env(t, "INTEROP2_RELAY"), env(t, "INTEROP2_JETSTREAM"), env(t, "INTEROP2_APPVIEW")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// Every frame Jetstream sends, kept for the processor's test data
	// (internal/processor/testdata/realchain-*.jsonl).
	go capture(ctx, strings.Replace(jsURL, "http://", "ws://", 1)+"/subscribe?wantedCollections=io.atcr.*", filepath.Join(work, "capture.jsonl"))

	alice := pds.createAccount(t, "alice.test")
	bob := pds.createAccount(t, "bob.test")
	carol := pds.createAccount(t, "carol.test")
	hold := pds.createAccount(t, "hold.test")
	dave := pds.createAccount(t, "dave.test") // taken down by the PDS's admin below

	// Live path: two instances on one database, consuming the real
	// Jetstream v2 on its v2 wire (its legacy /subscribe as the fallback).
	liveDB := "file:" + filepath.Join(work, "live.db")
	recv := newReceiver(t)
	if out, err := exec.CommandContext(ctx, bin, "webhooks", "add", "--did", alice.DID, "--url", recv.srv.URL,
		"--allow-private", "--set", "database.url="+liveDB).CombinedOutput(); err != nil {
		t.Fatalf("webhooks add: %v\n%s", err, out)
	}
	live := harness.NewCluster(bin, filepath.Join(work, "live"))
	t.Cleanup(live.Close)
	liveSet := map[string]any{
		"jetstream.urls": []string{strings.Replace(jsURL, "http://", "ws://", 1) + "/xrpc/network.bsky.jetstream.subscribeEvents",
			strings.Replace(jsURL, "http://", "ws://", 1) + "/subscribe"}, "jetstream.compress": false,
		"identity.plc_url": plcURL, "identity.handle_well_known_url": pds.base,
		"webhooks.allow_private": true, "log_level": "info",
	}
	var insts []*harness.Instance
	for _, id := range []string{"live-a", "live-b"} {
		in, err := live.Start(ctx, harness.Spec{ID: id, DatabaseURL: liveDB, Set: liveSet})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := in.Ready(ctx); err != nil {
			t.Fatalf("%s not ready: %v\n%s", id, err, in.Tail(30))
		}
		insts = append(insts, in)
	}

	// Every record type, with real blobs.
	mblob := pds.uploadBlob(t, alice, randomBytes(3000), "application/vnd.oci.image.manifest.v1+json")
	avatar := pds.uploadBlob(t, alice, randomBytes(1500), "image/png")
	pds.create(t, alice, colProfile, "self", map[string]any{"defaultHold": hold.DID, "autoRemoveUntagged": true, "createdAt": now()})
	m1 := pds.create(t, alice, colManifest, "", manifestRecord("app", digest('a'), hold.DID, mblob, false))
	m2 := pds.create(t, alice, colManifest, "", manifestRecord("app", digest('b'), hold.DID, mblob, false))
	pds.create(t, alice, colManifest, "", manifestRecord("multi", digest('m'), hold.DID, mblob, true))
	pds.put(t, alice, colTag, "app_latest", map[string]any{"repository": "app", "tag": "latest", "manifest": m1, "createdAt": now()})
	pds.put(t, alice, colTag, "multi_v1", map[string]any{"repository": "multi", "tag": "v1", "manifestDigest": digest('m'), "createdAt": now()})
	pds.put(t, alice, colTag, "app_old", map[string]any{"repository": "app", "tag": "old", "manifestDigest": digest('a'), "createdAt": now()})
	pds.create(t, alice, colPage, "app", map[string]any{"repository": "app", "description": "# app\nreal chain", "avatar": avatar, "createdAt": now(), "updatedAt": now()})
	// Stars in both subject shapes.
	pds.create(t, bob, colStar, "", map[string]any{"subject": map[string]any{"did": alice.DID, "repository": "app"}, "createdAt": now()})
	pds.create(t, carol, colStar, "", map[string]any{"subject": "at://" + alice.DID + "/" + colPage + "/app", "createdAt": now()})
	bobStar := pds.create(t, bob, colStar, "", map[string]any{"subject": map[string]any{"did": alice.DID, "repository": "multi"}, "createdAt": now()})
	pds.create(t, carol, colManifest, "", manifestRecord("tool", digest('t'), hold.DID, pds.uploadBlob(t, carol, randomBytes(500), "application/octet-stream"), false))
	pds.create(t, dave, colManifest, "", manifestRecord("gone", digest('d'), hold.DID, pds.uploadBlob(t, dave, randomBytes(400), "application/octet-stream"), false))
	pds.put(t, dave, colTag, "gone_v1", map[string]any{"repository": "gone", "tag": "v1", "manifestDigest": digest('d'), "createdAt": now()})
	// The hold's own records.
	pds.create(t, hold, colCaptain, "self", map[string]any{"owner": alice.DID, "public": true, "allowAllCrew": false, "enableBlueskyPosts": false, "deployedAt": now(), "region": "local"})
	pds.create(t, hold, colCrew, "", map[string]any{"member": bob.DID, "role": "write", "permissions": []any{"blob:read", "blob:write"}, "addedAt": now()})
	crewCarol := pds.create(t, hold, colCrew, "", map[string]any{"member": carol.DID, "role": "read", "permissions": []any{"blob:read"}, "addedAt": now()})
	pds.put(t, hold, colStats, "alice-app", map[string]any{"ownerDid": alice.DID, "repository": "app", "pullCount": 7, "pushCount": 2, "updatedAt": now(), "lastPull": now(), "lastPush": now()})

	// Kill the holder of the consumer lease mid-stream, write on, restart it.
	holder := waitHolder(t, ctx, bin, liveDB, "jetstream-consumer")
	for i, in := range insts {
		if in.ID == holder {
			in.Signal(syscall.SIGKILL)
			<-in.Exited()
			t.Logf("killed %s, the consumer's holder", holder)
			re, err := live.Start(ctx, harness.Spec{ID: holder + "-restarted", DatabaseURL: liveDB, Set: liveSet})
			if err != nil {
				t.Fatal(err)
			}
			insts[i] = re
		}
	}
	// A tag moved between manifests, an update, deletes.
	pds.put(t, alice, colTag, "app_latest", map[string]any{"repository": "app", "tag": "latest", "manifest": m2, "createdAt": now()})
	pds.put(t, hold, colStats, "alice-app", map[string]any{"ownerDid": alice.DID, "repository": "app", "pullCount": 9, "pushCount": 3, "updatedAt": now(), "lastPull": now(), "lastPush": now()})
	pds.delete(t, alice, colTag, "app_old")
	pds.delete(t, bob, colStar, rkeyOf(bobStar))
	pds.delete(t, hold, colCrew, rkeyOf(crewCarol))

	// What the PDS holds, read back, for every account (carol's before she
	// is deactivated: the PDS refuses to list a deactivated repository).
	accounts := []*account{alice, bob, carol, hold, dave}
	expected := expectedRows(t, pds, accounts)

	// Identity: a handle change and a deactivation, through the live stream.
	if err := pds.call(ctx, http.MethodPost, "com.atproto.identity.updateHandle", bob.JWT, map[string]any{"handle": "robert.test"}, "", nil); err != nil {
		t.Fatalf("updateHandle: %v", err)
	}
	if err := pds.call(ctx, http.MethodPost, "com.atproto.server.deactivateAccount", carol.JWT, map[string]any{}, "", nil); err != nil {
		t.Fatalf("deactivateAccount: %v", err)
	}

	// A takedown by the PDS's operator (com.atproto.admin.updateSubjectStatus):
	// the PDS emits #account with status "takendown". Only once the index
	// has verified dave's handle: a taken-down account's handle no longer
	// verifies (the PDS stops answering for it), so a takedown that
	// overtakes the first verification leaves the handle empty, which is
	// right but not what this step checks (that a takedown keeps the
	// account's verified handle and marks it inactive).
	db := openDB(t, liveDB)
	if err := poll(90*time.Second, func() error { return users(db, map[string]string{dave.DID: "dave.test|1|"}) }); err != nil {
		t.Fatalf("live: dave's handle before the takedown: %v\n%s", err, live.Dump(60))
	}
	if err := pds.call(ctx, http.MethodPost, "com.atproto.admin.updateSubjectStatus",
		"Basic "+base64.StdEncoding.EncodeToString([]byte("admin:admin")), map[string]any{
			"subject":  map[string]any{"$type": "com.atproto.admin.defs#repoRef", "did": dave.DID},
			"takedown": map[string]any{"applied": true, "ref": "interop-tier2"},
		}, "", nil); err != nil {
		t.Fatalf("takedown: %v", err)
	}

	if err := poll(90*time.Second, func() error { return diffRows(db, expected) }); err != nil {
		t.Fatalf("live: the appview database does not equal what the PDS holds:\n%v\n%s", err, live.Dump(40))
	}
	if err := poll(30*time.Second, func() error {
		// An inactive account's handle no longer verifies (its PDS stops
		// answering for it): whether the index still shows the last
		// verified handle or none depends on whether an #identity event
		// made it look again after the deactivation, so both are accepted;
		// active and status are exact.
		if err := users(db, map[string]string{alice.DID: "alice.test|1|", bob.DID: "robert.test|1|"}); err != nil {
			return err
		}
		if users(db, map[string]string{carol.DID: "carol.test|0|deactivated"}) != nil {
			if err := users(db, map[string]string{carol.DID: "|0|deactivated"}); err != nil {
				return err
			}
		}
		if users(db, map[string]string{dave.DID: "dave.test|0|takendown"}) != nil {
			return users(db, map[string]string{dave.DID: "|0|takendown"})
		}
		return nil
	}); err != nil {
		t.Fatalf("live: users: %v\n%s", err, live.Dump(40))
	}
	// Each push delivered once.
	if err := poll(30*time.Second, func() error {
		got := recv.counts()
		for _, d := range []string{digest('a'), digest('b'), digest('m')} {
			key := "push:" + alice.DID + "/" + map[string]string{digest('a'): "app", digest('b'): "app", digest('m'): "multi"}[d] + "@" + d
			if got[key] != 1 {
				return fmt.Errorf("delivery %s received %d times, want 1 (all: %v)", key, got[key], got)
			}
		}
		if len(got) != 3 {
			return fmt.Errorf("%d distinct deliveries, want 3: %v", len(got), got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := live.Races(); len(r) > 0 {
		t.Fatalf("data races: %v", r)
	}

	// Backfill path: a fresh appview, no live stream, the relay (which has
	// no listReposByCollection) and the PDS with its rate limits on.
	bfDB := "file:" + filepath.Join(work, "backfill.db")
	bf := harness.NewCluster(bin, filepath.Join(work, "backfill"))
	t.Cleanup(bf.Close)
	in, err := bf.Start(ctx, harness.Spec{ID: "backfill", DatabaseURL: bfDB, Set: map[string]any{
		"backfill.enabled": true, "backfill.relay_endpoints": []string{relayURL},
		"identity.plc_url": plcURL, "identity.handle_well_known_url": pds.base, "log_level": "info",
	}})
	if err != nil {
		t.Fatal(err)
	}
	bfStart := time.Now()
	if _, err := in.Wait(ctx, harness.Msg("backfill run completed")); err != nil {
		t.Fatalf("backfill did not complete: %v\n%s", err, in.Tail(40))
	}
	ev, _ := in.Wait(ctx, harness.Msg("backfill run completed"))
	t.Logf("backfill completed in %s: %s", time.Since(bfStart).Round(time.Millisecond), ev.String())
	bdb := openDB(t, bfDB)
	var failed int
	if err := bdb.QueryRow(`SELECT COUNT(*) FROM backfill_repos WHERE state = 'failed'`).Scan(&failed); err != nil || failed != 0 {
		t.Fatalf("backfill marked %d repositories failed (%v)", failed, err)
	}
	// Deactivated and taken-down accounts: neither path shows their
	// records (docs/interop.md).
	want := withoutInactive(expected, carol.DID, dave.DID)
	if err := diffRows(bdb, want); err != nil {
		t.Fatalf("backfill: the appview database does not equal what the PDS serves:\n%v", err)
	}
	if err := diffRowsVisible(db, want, carol.DID, dave.DID); err != nil {
		t.Fatalf("live and backfill disagree on what is visible: %v", err)
	}
	t.Logf("backfill rate-limit figures: %s", metricLines(t, in, "appview_backfill_rate_limit"))
}

// capture writes every frame of a Jetstream /subscribe connection to path
// until ctx ends.
func capture(ctx context.Context, url, path string) {
	f, err := os.Create(path)
	if err != nil {
		return
	}
	defer f.Close()
	c, _, err := websocket.DefaultDialer.DialContext(ctx, url, nil)
	if err != nil {
		fmt.Fprintf(f, "capture: %v\n", err)
		return
	}
	go func() { <-ctx.Done(); c.Close() }()
	for {
		_, b, err := c.ReadMessage()
		if err != nil {
			return
		}
		f.Write(append(b, '\n'))
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func rkeyOf(uri string) string { return uri[strings.LastIndex(uri, "/")+1:] }

func openDB(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := database.Open(context.Background(), database.Options{URL: url, BusyTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db.DB
}

// waitHolder returns the instance holding lease, as `appview leases` says.
func waitHolder(t *testing.T, ctx context.Context, bin, dbURL, lease string) string {
	t.Helper()
	var holder string
	err := poll(30*time.Second, func() error {
		rows, err := harness.Leases(ctx, bin, dbURL)
		if err != nil {
			return err
		}
		r, ok := rows[lease]
		if !ok || r.State != "held" {
			return fmt.Errorf("%s not held: %+v", lease, r)
		}
		holder = r.Holder
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return holder
}

func metricLines(t *testing.T, in *harness.Instance, prefix string) string {
	resp, err := http.Get("http://" + in.AdminAddr() + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}

// rows are the comparable rows of each table: table → sorted "a|b|c".
type rows map[string][]string

var queries = map[string]string{
	"manifests":             `SELECT did||'|'||repository||'|'||digest||'|'||hold_did||'|'||media_type FROM manifests`,
	"manifest_references":   `SELECT m.did||'|'||m.digest||'|'||r.position||'|'||r.digest FROM manifest_references r JOIN manifests m ON m.id = r.manifest_id`,
	"manifest_layers":       `SELECT m.did||'|'||m.digest||'|'||l.position||'|'||l.digest||'|'||l.size FROM manifest_layers l JOIN manifests m ON m.id = l.manifest_id`,
	"tags":                  `SELECT did||'|'||repository||'|'||tag||'|'||digest FROM tags`,
	"stars":                 `SELECT did||'|'||rkey||'|'||owner_did||'|'||repository FROM stars`,
	"repo_pages":            `SELECT did||'|'||repository||'|'||rkey FROM repo_pages`,
	"profiles":              `SELECT did||'|'||default_hold||'|'||auto_remove_untagged FROM users WHERE profile_created_at IS NOT NULL`,
	"hold_captains":         `SELECT hold_did||'|'||owner_did FROM hold_captains`,
	"hold_crew":             `SELECT hold_did||'|'||rkey||'|'||member_did FROM hold_crew`,
	"repository_hold_stats": `SELECT did||'|'||repository||'|'||hold_did||'|'||pull_count||'|'||push_count FROM repository_hold_stats`,
}

func readRows(db *sql.DB) (rows, error) {
	out := rows{}
	for table, q := range queries {
		rs, err := db.Query(q)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", table, err)
		}
		var list []string
		for rs.Next() {
			var s string
			if err := rs.Scan(&s); err != nil {
				rs.Close()
				return nil, err
			}
			list = append(list, s)
		}
		rs.Close()
		sort.Strings(list)
		out[table] = list
	}
	return out, nil
}

func diffRows(db *sql.DB, want rows) error {
	got, err := readRows(db)
	if err != nil {
		return err
	}
	var diffs []string
	for table := range queries {
		if strings.Join(got[table], "\n") != strings.Join(want[table], "\n") {
			diffs = append(diffs, fmt.Sprintf("%s:\n  got  %q\n  want %q", table, got[table], want[table]))
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		return fmt.Errorf("%s", strings.Join(diffs, "\n"))
	}
	return nil
}

// diffRowsVisible compares what readers see: rows of inactive accounts hidden.
func diffRowsVisible(db *sql.DB, want rows, inactive ...string) error {
	got, err := readRows(db)
	if err != nil {
		return err
	}
	visible := withoutInactive(got, inactive...)
	for table := range queries {
		if strings.Join(visible[table], "\n") != strings.Join(want[table], "\n") {
			return fmt.Errorf("%s: live %q, backfill %q", table, visible[table], want[table])
		}
	}
	return nil
}

func withoutInactive(r rows, dids ...string) rows {
	out := rows{}
	for table, list := range r {
		for _, row := range list {
			keep := true
			for _, d := range dids {
				if strings.HasPrefix(row, d+"|") {
					keep = false
				}
			}
			if keep {
				out[table] = append(out[table], row)
			}
		}
	}
	return out
}

func users(db *sql.DB, want map[string]string) error {
	for did, w := range want {
		var handle, status string
		var active int
		if err := db.QueryRow(`SELECT handle, active, status FROM users WHERE did = ?1`, did).Scan(&handle, &active, &status); err != nil {
			return fmt.Errorf("users %s: %w", did, err)
		}
		if got := fmt.Sprintf("%s|%d|%s", handle, active, status); got != w {
			return fmt.Errorf("users %s = %s, want %s", did, got, w)
		}
	}
	return nil
}

// expectedRows reads every account's records back from the PDS and
// derives the rows the index must hold.
func expectedRows(t *testing.T, pds *pdsClient, accounts []*account) rows {
	t.Helper()
	out := rows{}
	add := func(table, row string) { out[table] = append(out[table], row) }
	manifestDigest := map[string]string{} // at-uri → digest
	type tagRec struct{ did, repo, tag, manifest, digest string }
	var tags []tagRec
	for _, a := range accounts {
		for _, col := range collections {
			for _, rec := range pds.list(t, a.DID, col) {
				var v map[string]any
				if err := json.Unmarshal(rec.Value, &v); err != nil {
					t.Fatal(err)
				}
				s := func(k string) string { x, _ := v[k].(string); return x }
				n := func(k string) string { x, _ := v[k].(float64); return fmt.Sprint(int64(x)) }
				switch col {
				case colManifest:
					manifestDigest[rec.URI] = s("digest")
					add("manifests", strings.Join([]string{a.DID, s("repository"), s("digest"), s("holdDid"), s("mediaType")}, "|"))
					if ms, ok := v["manifests"].([]any); ok {
						for i, m := range ms {
							add("manifest_references", fmt.Sprintf("%s|%s|%d|%s", a.DID, s("digest"), i, m.(map[string]any)["digest"]))
						}
					}
					if ls, ok := v["layers"].([]any); ok {
						for i, l := range ls {
							lm := l.(map[string]any)
							add("manifest_layers", fmt.Sprintf("%s|%s|%d|%s|%d", a.DID, s("digest"), i, lm["digest"], int64(lm["size"].(float64))))
						}
					}
				case colTag:
					tags = append(tags, tagRec{a.DID, s("repository"), s("tag"), s("manifest"), s("manifestDigest")})
				case colStar:
					switch sub := v["subject"].(type) {
					case map[string]any:
						add("stars", fmt.Sprintf("%s|%s|%s|%s", a.DID, rkeyOf(rec.URI), sub["did"], sub["repository"]))
					case string:
						parts := strings.Split(strings.TrimPrefix(sub, "at://"), "/")
						add("stars", fmt.Sprintf("%s|%s|%s|%s", a.DID, rkeyOf(rec.URI), parts[0], parts[2]))
					}
				case colProfile:
					auto := "0"
					if b, _ := v["autoRemoveUntagged"].(bool); b {
						auto = "1"
					}
					add("profiles", strings.Join([]string{a.DID, s("defaultHold"), auto}, "|"))
				case colPage:
					add("repo_pages", strings.Join([]string{a.DID, s("repository"), rkeyOf(rec.URI)}, "|"))
				case colCaptain:
					add("hold_captains", a.DID+"|"+s("owner"))
				case colCrew:
					add("hold_crew", strings.Join([]string{a.DID, rkeyOf(rec.URI), s("member")}, "|"))
				case colStats:
					add("repository_hold_stats", strings.Join([]string{s("ownerDid"), s("repository"), a.DID, n("pullCount"), n("pushCount")}, "|"))
				}
			}
		}
	}
	for _, tg := range tags {
		d := tg.digest
		if tg.manifest != "" {
			d = manifestDigest[tg.manifest]
		}
		add("tags", strings.Join([]string{tg.did, tg.repo, tg.tag, d}, "|"))
	}
	for table := range queries {
		sort.Strings(out[table])
	}
	return out
}
