package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atcr-io/appview/actors/backfill"
	"github.com/atcr-io/appview/internal/harness"
	"github.com/atcr-io/appview/internal/testsupport"
)

// backfillWorld is the network a backfill walks: a relay listing every
// DID under io.atcr.manifest and io.atcr.tag, one PDS hosting them, and a
// PLC directory resolving them to it. Each DID has the same number of
// manifests and of tags; tag i points at manifest i.
type backfillWorld struct {
	relay     *testsupport.Relay
	pds       *testsupport.PDS
	plc       *testsupport.PLC
	dids      []string
	manifests int // per DID
	tags      int // per DID
}

const (
	colManifest = "io.atcr.manifest"
	colTag      = "io.atcr.tag"
)

func newBackfillWorld(t *testing.T, manifests, tags int, dids ...string) *backfillWorld {
	w := &backfillWorld{relay: testsupport.NewRelay(t), pds: testsupport.NewPDS(t), plc: testsupport.NewPLC(t),
		dids: dids, manifests: manifests, tags: tags}
	for _, did := range dids {
		w.plc.Register(did, w.pds.URL())
		for i := range manifests {
			sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", did, i))
			w.pds.Put(did, colManifest, testsupport.Record{RKey: manifestRKey(i), Value: map[string]any{
				"$type": colManifest, "repository": "app", "digest": "sha256:" + hex.EncodeToString(sum[:]),
				"mediaType": "application/vnd.oci.image.manifest.v1+json", "schemaVersion": 2,
				"createdAt": "2025-06-01T12:00:00.000Z",
			}})
		}
		for i := range tags {
			w.pds.Put(did, colTag, testsupport.Record{RKey: fmt.Sprintf("3t%03d", i), Value: map[string]any{
				"$type": colTag, "repository": "app", "tag": fmt.Sprintf("v%d", i),
				"manifest": "at://" + did + "/" + colManifest + "/" + manifestRKey(i), "createdAt": "2025-06-01T12:00:00.000Z",
			}})
		}
	}
	w.relay.Add(colManifest, dids...)
	w.relay.Add(colTag, dids...)
	return w
}

// manifestRKey is the record key of a DID's i-th manifest; the PDS lists
// records in rkey order, so a page of 100 ends at manifestRKey(99).
func manifestRKey(i int) string { return fmt.Sprintf("3k%03d", i) }

// records is how many records the world holds in all.
func (w *backfillWorld) records() int64 { return int64(len(w.dids) * (w.manifests + w.tags)) }

// spec is an instance that runs the backfill once (interval 0) against
// this world, skipping a rerun within the hour.
func (w *backfillWorld) spec(id, db string, concurrency int) harness.Spec {
	return feedSpec(id, db, map[string]any{
		"backfill.enabled":         true,
		"backfill.interval":        "0s",
		"backfill.rerun_after":     "1h",
		"backfill.concurrency":     concurrency,
		"backfill.relay_endpoints": []string{w.relay.URL()},
		"identity.plc_url":         w.plc.URL(),
	})
}

// pages counts the PDS's listRecords requests by repo, collection and cursor.
func (w *backfillWorld) pages() map[[3]string]int {
	out := map[[3]string]int{}
	for _, r := range w.pds.Requests() {
		out[[3]string{r.Repo, r.Collection, r.Cursor}]++
	}
	return out
}

// checkRows checks that every record of the world landed once, through
// the processor, in manifests and tags, and that the one backfill run
// completed under fence, having handed each record to the processor once.
func (w *backfillWorld) checkRows(t *testing.T, ctx context.Context, reader *dbReader, fence int64) {
	t.Helper()
	for _, c := range []struct {
		table string
		want  int
	}{{"manifests", len(w.dids) * w.manifests}, {"tags", len(w.dids) * w.tags}} {
		rows := reader.int(t, ctx, "SELECT COUNT(*) FROM "+c.table)
		distinct := reader.int(t, ctx, "SELECT COUNT(*) FROM (SELECT DISTINCT did, rkey FROM "+c.table+")")
		if rows != int64(c.want) || distinct != rows {
			t.Errorf("%s: %d rows, %d distinct records; want %d, each once", c.table, rows, distinct, c.want)
		}
	}
	if n := reader.int(t, ctx, `SELECT COUNT(*) FROM tags t JOIN manifests m ON m.did = t.did AND m.digest = t.digest`); n != int64(len(w.dids)*w.tags) {
		t.Errorf("%d tags point at a stored manifest's digest; want all %d", n, len(w.dids)*w.tags)
	}
	if n := reader.int(t, ctx, `SELECT COUNT(*) FROM backfill_runs`); n != 1 {
		t.Errorf("%d backfill runs; want the one run", n)
	}
	if n := reader.int(t, ctx, `SELECT COUNT(*) FROM backfill_runs WHERE completed_at IS NOT NULL AND fence = ?1 AND records = ?2`,
		fence, w.records()); n != 1 {
		t.Errorf("the backfill run is not completed under fence %d with %d records handed to the processor (a page applied twice would count twice)",
			fence, w.records())
	}
}

// TestBackfillRunsOnceAcrossTwoInstancesAndAGracefulHandover runs two
// instances with backfill.interval 0 against one relay: one of them runs
// the backfill, the other only contends; the relay is asked for each
// collection once in all. When the holder is stopped, the other takes the
// lease, finds the completed run within rerun_after and holds the lease
// idle instead of backfilling again.
func TestBackfillRunsOnceAcrossTwoInstancesAndAGracefulHandover(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	db := fileDB(t)
	reader := newDBReader(t, db)
	w := newBackfillWorld(t, 30, 5, "did:plc:alice", "did:plc:bob", "did:plc:carol")
	ctx := within(t, 60*time.Second)
	insts, err := c.StartAll(ctx, w.spec("a", db, 4), w.spec("b", db, 4))
	if err != nil {
		t.Fatal(err)
	}
	holder, started, err := harness.WaitAny(ctx, harness.Is(harness.WorkerStarted, leaseBackfill), insts...)
	if err != nil {
		t.Fatalf("no instance started the backfill: %v", err)
	}
	second := other(insts, holder)
	done, err := holder.Wait(ctx, harness.Msg("backfill run completed"))
	if err != nil {
		t.Fatalf("%s never completed its backfill: %v", holder.ID, err)
	}
	t.Logf("%s backfilled %d records in %s", holder.ID, w.records(), done.Time.Sub(started.Time))
	if _, err := second.Wait(ctx, harness.Is(harness.LeaseContended, leaseBackfill)); err != nil {
		t.Fatal(err)
	}
	w.checkRows(t, ctx, reader, started.Fence)
	for _, col := range backfill.Collections {
		if n := w.relay.Count(col); n != 1 {
			t.Errorf("the relay saw %d listReposByCollection for %s; want exactly 1", n, col)
		}
	}
	pdsRequests := len(w.pds.Requests())

	mark := second.Log.Len()
	stopCleanly(t, ctx, holder)
	acq, err := second.Log.WaitFrom(ctx, mark, harness.Is(harness.LeaseAcquired, leaseBackfill))
	if err != nil {
		t.Fatalf("%s did not take the backfill lease over: %v", second.ID, err)
	}
	if acq.Fence != started.Fence+1 {
		t.Errorf("%s took the backfill over with fence %d; want %d", second.ID, acq.Fence, started.Fence+1)
	}
	// From mark, not from acq: custody events are written by a relay
	// goroutine, so the worker's own lines may come first in the log.
	skipped, err := second.Log.WaitFrom(ctx, mark, harness.Or(
		harness.Msg("backfill skipped: a run completed recently"), harness.Msg("backfill run started")))
	switch {
	case err != nil:
		t.Fatalf("%s did not skip the completed run: %v", second.ID, err)
	case skipped.Msg != "backfill skipped: a run completed recently":
		t.Fatalf("%s backfilled again after the handover: %s", second.ID, skipped.Line)
	}
	if skipped.Fence != acq.Fence {
		t.Errorf("the skip was logged under fence %d; want the new grant's %d", skipped.Fence, acq.Fence)
	}
	// It keeps the lease (so a third instance cannot backfill either).
	if err := holdsAfter(ctx, second, leaseBackfill, skipped.Seq, 3); err != nil {
		t.Fatal(err)
	}
	// Neither while contending nor after the handover did it run a backfill.
	for _, e := range second.Log.Find(0, harness.Or(harness.Msg("backfill run started"), harness.Is(harness.WorkerStopped, leaseBackfill))) {
		t.Errorf("%s ran or stopped a backfill: %s\n  %s", second.ID, e, e.Line)
	}
	for _, col := range backfill.Collections {
		if n := w.relay.Count(col); n != 1 {
			t.Errorf("after the handover the relay has seen %d listReposByCollection for %s; want still 1", n, col)
		}
	}
	if n := len(w.pds.Requests()); n != pdsRequests {
		t.Errorf("the new holder asked the PDS %d more times", n-pdsRequests)
	}
	w.checkRows(t, ctx, reader, started.Fence)
	stopCleanly(t, ctx, second)
	tl := c.Timeline()
	if err := harness.CheckExclusive(tl, leaseBackfill); err != nil {
		t.Error(err)
	}
	if err := harness.CheckFences(tl, map[string]int64{leaseBackfill: 1}); err != nil {
		t.Error(err)
	}
}

// TestBackfillKilledMidPageResumesFromTheCheckpointOnTheOtherInstance
// SIGKILLs the backfill's holder while the PDS stalls the second page of
// one repository. The kernel closes the stalled request's connection; the
// other instance takes the lease after the TTL, resumes the same run from
// its checkpoint (finished repositories are not fetched again, the stalled
// repository goes on from its cursor) and completes it: every record
// lands once.
func TestBackfillKilledMidPageResumesFromTheCheckpointOnTheOtherInstance(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	db := fileDB(t)
	reader := newDBReader(t, db)
	// 150 manifests are two pages of 100; concurrency 1 walks the DIDs in
	// order, so at the stall alice and bob are done and carol has one page.
	w := newBackfillWorld(t, 150, 5, "did:plc:alice", "did:plc:bob", "did:plc:carol")
	stalledAt := [3]string{"did:plc:carol", colManifest, manifestRKey(99)}
	inflight, closed := make(chan struct{}), make(chan struct{})
	var stalled atomic.Bool
	w.pds.Intercept(func(_ http.ResponseWriter, r *http.Request, req testsupport.Request) bool {
		if [3]string{req.Repo, req.Collection, req.Cursor} != stalledAt || !stalled.CompareAndSwap(false, true) {
			return false
		}
		close(inflight)
		<-r.Context().Done() // the client's connection closed
		close(closed)
		return true
	})
	ctx := within(t, 60*time.Second)
	a, err := c.Start(ctx, w.spec("a", db, 1))
	if err != nil {
		t.Fatal(err)
	}
	started, err := a.Wait(ctx, harness.Is(harness.WorkerStarted, leaseBackfill))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Start(ctx, w.spec("b", db, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(ctx, harness.Is(harness.LeaseContended, leaseBackfill)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inflight:
	case <-ctx.Done():
		t.Fatalf("carol's second manifest page was never requested: %v", ctx.Err())
	}
	// What a committed before the stall: two whole repositories and one page.
	if n := reader.int(t, ctx, `SELECT COUNT(*) FROM manifests`); n != 150+150+100 {
		t.Errorf("%d manifests stored at the stall; want 400 (alice, bob, carol's first page)", n)
	}
	if n := reader.int(t, ctx, `SELECT COUNT(*) FROM backfill_repos WHERE did = 'did:plc:carol' AND collection = ?1 AND state = 'running' AND record_cursor = ?2`,
		colManifest, manifestRKey(99)); n != 1 {
		t.Errorf("carol's checkpoint is not at %s", manifestRKey(99))
	}
	mark := b.Log.Len()
	killed := time.Now()
	a.Kill()
	select {
	case <-closed:
		t.Logf("the stalled request's connection closed %v after the SIGKILL", time.Since(killed))
	case <-ctx.Done():
		t.Fatalf("the stalled request's connection stayed open after its process was killed: %v", ctx.Err())
	}
	acq, err := b.Wait(ctx, harness.Is(harness.LeaseAcquired, leaseBackfill))
	if err != nil {
		t.Fatal(err)
	}
	took := acq.Time.Sub(killed)
	t.Logf("SIGKILL of a → b acquired the backfill (fence %d) after %v (ttl %v)", acq.Fence, took, timing.TTL)
	if acq.Fence != started.Fence+1 {
		t.Errorf("b took the backfill over with fence %d; want %d", acq.Fence, started.Fence+1)
	}
	if took > timing.TTL+crashHandoverSlack {
		t.Errorf("crash handover took %v; want within ttl + %v", took, crashHandoverSlack)
	}
	resumed, err := b.Log.WaitFrom(ctx, mark, harness.Msg("backfill run started"))
	if err != nil {
		t.Fatal(err)
	}
	var wasResumed bool
	if err := json.Unmarshal(resumed.Fields["resumed"], &wasResumed); err != nil || !wasResumed {
		t.Errorf("b started a new run instead of resuming a's: %s", resumed.Line)
	}
	if _, err := b.Log.WaitFrom(ctx, resumed.Seq, harness.Msg("backfill run completed")); err != nil {
		t.Fatalf("b never completed the resumed run: %v", err)
	}

	// Every page was fetched once, except the stalled one, fetched again by b.
	for _, did := range w.dids {
		for _, page := range []string{"", manifestRKey(99)} {
			want := 1
			if [3]string{did, colManifest, page} == stalledAt {
				want = 2
			}
			if n := w.pages()[[3]string{did, colManifest, page}]; n != want {
				t.Errorf("%s's manifest page after %q fetched %d times; want %d", did, page, n, want)
			}
		}
		if n := w.pages()[[3]string{did, colTag, ""}]; n != 1 {
			t.Errorf("%s's tags fetched %d times; want 1", did, n)
		}
	}
	if got, want := len(w.pds.Requests()), 2*len(w.dids)+len(w.dids)+1; got != want {
		t.Errorf("the PDS served %d listRecords in all; want %d", got, want)
	}
	// The relay listing of manifests was not finished, so b lists it again
	// (finished DIDs are skipped by their checkpoint); tags only b lists.
	if n := w.relay.Count(colManifest); n != 2 {
		t.Errorf("the relay listed manifests %d times; want 2 (a's, then b's resume)", n)
	}
	if n := w.relay.Count(colTag); n != 1 {
		t.Errorf("the relay listed tags %d times; want 1", n)
	}
	w.checkRows(t, ctx, reader, acq.Fence)
	stopCleanly(t, ctx, b)
	tl := c.Timeline()
	if err := harness.CheckExclusive(tl, leaseBackfill); err != nil {
		t.Error(err)
	}
	if err := harness.CheckFences(tl, map[string]int64{leaseBackfill: 1}); err != nil {
		t.Error(err)
	}
}
