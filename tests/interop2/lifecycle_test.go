//go:build interop2

package interop2

import (
	"context"
	"database/sql"
	"encoding/base64"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/harness"
)

// The account lifecycle on the real chain (docs/interop.md, "Account
// lifecycle"): for each sequence, an index built from the live stream and
// one built by a backfill (run while the account was in its "before"
// state, then attached to the live stream) end showing the same thing,
// equal to what the PDS serves, on both Jetstream wires. The scenarios run
// at once, each on its own account, on the second PDS (no rate limits)
// but for the migration, which moves an account from the first to it.

// resyncInterval is jetstream.resync_interval here (1 s by default):
// several scenarios queue re-reads at once on every instance.
const resyncInterval = "100ms"

// scenario is one lifecycle sequence on one account.
type scenario struct {
	name string
	acct *account
	pds  *pdsClient // where the account lives at the end
	// before brings the account to the state the backfill sees; after is
	// the sequence's last step(s); hidden says the account ends inactive.
	before, after func(t *testing.T)
	hidden        bool
	// prepared and began are when before and after began; lastStep is
	// when after made the call whose event ends the sequence (a call's
	// event may be seen before the call returns).
	prepared, began, lastStep time.Time
}

func TestLifecycle(t *testing.T) {
	started := time.Now()
	defer func() { t.Logf("lifecycle suite ran in %s", time.Since(started).Round(time.Millisecond)) }()
	work := env(t, "INTEROP2_WORK")
	bypass := env(t, "INTEROP2_BYPASS")
	pds1 := &pdsClient{base: env(t, "INTEROP2_PDS"), bypass: bypass, http: &http.Client{Timeout: 30 * time.Second}}
	pds2 := &pdsClient{base: env(t, "INTEROP2_PDS2"), http: &http.Client{Timeout: 30 * time.Second}}
	plcURL, relayURL, jsURL, bin := env(t, "INTEROP2_PLC"), env(t, "INTEROP2_RELAY"), env(t, "INTEROP2_JETSTREAM"), env(t, "INTEROP2_APPVIEW")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	admin := "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:admin"))
	wellKnown := handleProxy(t, pds2.base, pds1.base)
	wires := map[string]string{
		"v2":     strings.Replace(jsURL, "http://", "ws://", 1) + "/xrpc/network.bsky.jetstream.subscribeEvents",
		"legacy": strings.Replace(jsURL, "http://", "ws://", 1) + "/subscribe",
	}
	base := map[string]any{"jetstream.compress": false, "jetstream.resync_interval": resyncInterval,
		"identity.plc_url": plcURL, "identity.handle_well_known_url": wellKnown, "log_level": "info"}
	set := func(wire string, more map[string]any) map[string]any {
		out := map[string]any{"jetstream.urls": []string{wires[wire]}}
		for k, v := range base {
			out[k] = v
		}
		for k, v := range more {
			out[k] = v
		}
		return out
	}

	relayFwd, v2Fwd, legacyFwd := newForwarded(), newForwarded(), newForwarded()
	captureRelay(ctx, t, relayURL, relayFwd)
	captureJetstream(ctx, t, jsURL, true, v2Fwd)
	captureJetstream(ctx, t, jsURL, false, legacyFwd)

	// The live indexes, one per wire, before any of the accounts exists.
	cluster := harness.NewCluster(bin, filepath.Join(work, "lifecycle"))
	t.Cleanup(cluster.Close)
	instances := map[string]*harness.Instance{}
	dbs := map[string]*sql.DB{}
	startIndex := func(id string, s map[string]any) {
		t.Helper()
		dbURL := "file:" + filepath.Join(work, "lifecycle-"+id+".db")
		in, err := cluster.Start(ctx, harness.Spec{ID: id, DatabaseURL: dbURL, LogLevel: "info", Set: s})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := in.Ready(ctx); err != nil {
			t.Fatalf("%s not ready: %v\n%s", id, err, in.Tail(30))
		}
		instances[id], dbs[id] = in, openDB(t, dbURL)
	}
	connected := func(id string) {
		t.Helper()
		if err := poll(30*time.Second, func() error {
			if !strings.Contains(metricLines(t, instances[id], "appview_jetstream_connected"), "appview_jetstream_connected 1") {
				return fmt.Errorf("%s: no Jetstream connection", id)
			}
			return nil
		}); err != nil {
			t.Fatalf("%v\n%s", err, instances[id].Tail(30))
		}
	}
	for _, wire := range []string{"v2", "legacy"} {
		startIndex("live-"+wire, set(wire, nil))
		connected("live-" + wire)
	}

	// The accounts: an anchor whose repository the others star, and one
	// account per sequence with seven io.atcr records (a profile, two
	// manifests with layers, two tags, a repo page, a star).
	anchor := pds2.createAccount(t, "anchor.test")
	pds2.create(t, anchor, colManifest, "", manifestRecord("base", digest('0'), anchor.DID, pds2.uploadBlob(t, anchor, randomBytes(300), "application/octet-stream"), false))
	seven := func(pds *pdsClient, a *account, repo string) {
		t.Helper()
		blob := pds.uploadBlob(t, a, randomBytes(500), "application/vnd.oci.image.manifest.v1+json")
		pds.create(t, a, colProfile, "self", map[string]any{"defaultHold": anchor.DID, "createdAt": now()})
		m1 := pds.create(t, a, colManifest, "", manifestRecord(repo, digest('a'), anchor.DID, blob, false))
		pds.create(t, a, colManifest, "", manifestRecord(repo, digest('b'), anchor.DID, blob, false))
		pds.put(t, a, colTag, repo+"_latest", map[string]any{"repository": repo, "tag": "latest", "manifest": m1, "createdAt": now()})
		pds.put(t, a, colTag, repo+"_v1", map[string]any{"repository": repo, "tag": "v1", "manifestDigest": digest('b'), "createdAt": now()})
		pds.create(t, a, colPage, repo, map[string]any{"repository": repo, "description": "lifecycle", "createdAt": now(), "updatedAt": now()})
		pds.create(t, a, colStar, "", map[string]any{"subject": map[string]any{"did": anchor.DID, "repository": "base"}, "createdAt": now()})
	}
	call := func(pds *pdsClient, nsid, jwt string, in any) {
		t.Helper()
		if err := pds.call(ctx, http.MethodPost, nsid, jwt, in, "", nil); err != nil {
			t.Fatalf("%s: %v", nsid, err)
		}
	}
	takedown := func(did string, applied bool) map[string]any {
		return map[string]any{"subject": map[string]any{"$type": "com.atproto.admin.defs#repoRef", "did": did},
			"takedown": map[string]any{"applied": applied, "ref": "interop-lifecycle"}}
	}
	var mover *account
	scenarios := []*scenario{
		{name: "deactivate-reactivate", acct: pds2.createAccount(t, "react.test"), pds: pds2},
		{name: "takedown-reversal", acct: pds2.createAccount(t, "takedown.test"), pds: pds2},
		{name: "pds-migration", acct: pds1.createAccount(t, "mover.test"), pds: pds2},
		{name: "deletion", acct: pds2.createAccount(t, "deleted.test"), pds: pds2, hidden: true},
		{name: "event-before-first-record", acct: pds2.createAccount(t, "newcomer.test"), pds: pds2},
	}
	react, down, move, gone, newcomer := scenarios[0], scenarios[1], scenarios[2], scenarios[3], scenarios[4]
	seven(pds2, react.acct, "react")
	seven(pds2, down.acct, "down")
	seven(pds1, move.acct, "move")
	seven(pds2, gone.acct, "gone")
	react.before = func(t *testing.T) {
		call(pds2, "com.atproto.server.deactivateAccount", react.acct.JWT, map[string]any{})
	}
	react.after = func(t *testing.T) {
		react.lastStep = time.Now()
		call(pds2, "com.atproto.server.activateAccount", react.acct.JWT, nil)
	}
	down.before = func(t *testing.T) {
		call(pds2, "com.atproto.admin.updateSubjectStatus", admin, takedown(down.acct.DID, true))
	}
	down.after = func(t *testing.T) {
		down.lastStep = time.Now()
		call(pds2, "com.atproto.admin.updateSubjectStatus", admin, takedown(down.acct.DID, false))
	}
	// The migration up to its PLC operation: the DID names the new PDS,
	// where the account is not active yet.
	move.before = func(t *testing.T) { mover = migrate(t, pds1, pds2, filepath.Join(work, "pds"), move.acct) }
	move.after = func(t *testing.T) {
		move.lastStep = time.Now() // the old PDS's deactivation, next, is not forwarded
		call(pds2, "com.atproto.server.activateAccount", mover.JWT, nil)
		call(pds1, "com.atproto.server.deactivateAccount", move.acct.JWT, map[string]any{})
	}
	gone.before = func(t *testing.T) {}
	gone.after = func(t *testing.T) {
		call(pds2, "com.atproto.server.requestAccountDelete", gone.acct.JWT, nil)
		gone.lastStep = time.Now()
		call(pds2, "com.atproto.server.deleteAccount", "", map[string]any{"did": gone.acct.DID, "password": "pw-" + gone.acct.Handle,
			"token": emailToken(t, filepath.Join(work, "pds2"), gone.acct.DID, "delete_account")})
	}
	// Its #identity and #account events come before any record; then it
	// is deactivated, and its first records come after the reactivation.
	newcomer.before = func(t *testing.T) {
		call(pds2, "com.atproto.server.deactivateAccount", newcomer.acct.JWT, map[string]any{})
	}
	newcomer.after = func(t *testing.T) {
		call(pds2, "com.atproto.server.activateAccount", newcomer.acct.JWT, nil)
		blob := pds2.uploadBlob(t, newcomer.acct, randomBytes(200), "application/octet-stream")
		m := pds2.create(t, newcomer.acct, colManifest, "", manifestRecord("first", digest('f'), anchor.DID, blob, false))
		pds2.put(t, newcomer.acct, colTag, "first_latest", map[string]any{"repository": "first", "tag": "latest", "manifest": m, "createdAt": now()})
		newcomer.lastStep = time.Now()
		pds2.create(t, newcomer.acct, colStar, "", map[string]any{"subject": map[string]any{"did": anchor.DID, "repository": "base"}, "createdAt": now()})
	}

	// Before: each account in the state the backfill will see, and the
	// live indexes showing it. The first event of the newcomer (before any
	// record) is kept: a users row with its status.
	for _, s := range scenarios {
		s.prepared = time.Now()
		s.before(t)
	}
	dids := []string{anchor.DID}
	beforeWant := map[string]string{anchor.DID: served(t, pds2, anchor, true)}
	for _, s := range scenarios {
		dids = append(dids, s.acct.DID)
		beforeWant[s.acct.DID] = served(t, s.pds, s.acct, s == gone)
	}
	for _, id := range []string{"live-v2", "live-legacy"} {
		if err := poll(60*time.Second, func() error { return sameAs(dbs[id], beforeWant) }); err != nil {
			t.Fatalf("%s before the lifecycle events: %v\n%s", id, err, instances[id].Tail(30))
		}
		if err := users(dbs[id], map[string]string{newcomer.acct.DID: "newcomer.test|0|deactivated"}); err != nil {
			if err2 := users(dbs[id], map[string]string{newcomer.acct.DID: "|0|deactivated"}); err2 != nil {
				t.Fatalf("%s: the newcomer's first events were not kept: %v", id, err)
			}
		}
	}

	// The backfilled indexes: a backfill run while the accounts are in
	// their "before" state, the consumer attached to one wire from the
	// start (so no event after the run is missed).
	bfStart := time.Now()
	for _, wire := range []string{"v2", "legacy"} {
		startIndex("backfill-"+wire, set(wire, map[string]any{"backfill.enabled": true, "backfill.relay_endpoints": []string{relayURL}}))
	}
	for _, wire := range []string{"v2", "legacy"} {
		id := "backfill-" + wire
		if _, err := instances[id].Wait(ctx, harness.Msg("backfill run completed")); err != nil {
			t.Fatalf("%s: backfill did not complete: %v\n%s", id, err, instances[id].Tail(40))
		}
		connected(id)
		if err := sameAs(dbs[id], beforeWant); err != nil {
			t.Fatalf("%s after its backfill: %v", id, err)
		}
	}
	t.Logf("FIGURE lifecycle: two backfills (relay listRepos, rate-limited first PDS) completed in %s", time.Since(bfStart).Round(time.Millisecond))

	// The sequences' last steps, at once, every index watched from then on.
	ids := []string{"live-v2", "live-legacy", "backfill-v2", "backfill-legacy"}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w := startWatch(wctx, dbs, dids)
	var wg sync.WaitGroup
	for _, s := range scenarios {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.began = time.Now()
			s.after(t)
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// What the PDS serves now, and when each index came to show it.
	took := map[string]map[string]time.Duration{}
	for _, s := range scenarios {
		want := served(t, s.pds, s.acct, !s.hidden)
		took[s.name] = map[string]time.Duration{}
		for _, id := range ids {
			var at time.Time
			err := poll(30*time.Second, func() (err error) { at, err = w.settled(id, s.acct.DID, want); return err })
			if err != nil {
				t.Errorf("%s on %s: not converged to what the PDS serves: %v\n%s", s.name, id, err, instances[id].Tail(20))
				continue
			}
			took[s.name][id] = at.Sub(s.lastStep)
		}
	}
	stopWatch()
	// The anchor's star count: the stars of the accounts active at the end.
	wantStars := 0
	for _, s := range scenarios {
		if !s.hidden {
			wantStars++
		}
	}
	for _, id := range ids {
		if n := starCount(dbs[id], anchor.DID, "base"); n != wantStars {
			t.Errorf("%s: star_count of the anchor's repository %d, want %d", id, n, wantStars)
		}
		if err := users(dbs[id], map[string]string{gone.acct.DID: "deleted.test|0|deleted"}); err != nil {
			if users(dbs[id], map[string]string{gone.acct.DID: "|0|deleted"}) != nil {
				t.Errorf("%s: %v", id, err)
			}
		}
	}
	// The times, and what each hop forwarded before and in the last steps
	// (read once every index converged), for the record.
	for _, s := range scenarios {
		var times []string
		for _, id := range ids {
			times = append(times, fmt.Sprintf("%s %s", id, took[s.name][id].Round(10*time.Millisecond)))
		}
		t.Logf("FIGURE lifecycle %s: shown as the PDS serves it, after its last step, in %s", s.name, strings.Join(times, ", "))
		// The before steps write no records (the commits of the records
		// written just earlier may still be on their way then).
		for _, phase := range []struct {
			name     string
			from, to time.Time
			commits  bool
		}{{"before", s.prepared, s.began, false}, {"final steps", s.began, time.Now(), true}} {
			t.Logf("FIGURE lifecycle %s: forwarded (%s): relay [%s]; jetstream v2 [%s]; legacy [%s]", s.name, phase.name,
				relayFwd.between(s.acct.DID, phase.from, phase.to, phase.commits), v2Fwd.between(s.acct.DID, phase.from, phase.to, phase.commits),
				legacyFwd.between(s.acct.DID, phase.from, phase.to, phase.commits))
		}
	}
	if r := cluster.Races(); len(r) > 0 {
		t.Fatalf("data races: %v", r)
	}
}

// sameAs compares what db shows of the accounts of want (DID → shown's
// string) with want.
func sameAs(db *sql.DB, want map[string]string) error {
	var dids []string
	for did := range want {
		dids = append(dids, did)
	}
	got, err := shown(db, dids)
	if err != nil {
		return err
	}
	for _, did := range dids {
		if got[did] != want[did] {
			return diff(got[did], want[did])
		}
	}
	return nil
}
