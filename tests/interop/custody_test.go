//go:build interop

package interop

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/harness"
)

// Health-aware custody: two appviews on one database; the holder's
// Jetstream is unreachable, the contender's fine: the holder yields, the
// contender takes the lease and consumes with no gap. Needs the lease
// runtime's yield (skipped, saying so, without it).
func TestAnUnhealthyHolderYieldsToAHealthyContender(t *testing.T) {
	parallel(t)
	root, err := harness.ModuleRoot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command("grep", "-rl", "lease.yielded", filepath.Join(root, "actors", "lease")).Output()
	if len(strings.TrimSpace(string(out))) == 0 {
		t.Skip("skipped: needs lease yield (the lease runtime does not yield custody on workers.Health yet)")
	}
	w := newWorld(t, 1)
	j := w.js[0]
	db := filepath.Join(w.dir, "custody.db")
	// The holder's only URL refuses connections, so it is silent from its
	// start: unhealthy_after needs no margin over stale_timeout here (the
	// other scenarios' 2 x stale_timeout), only over the contender's live
	// stream's gaps between events, of milliseconds.
	const unhealthyAfter = 2 * time.Second
	fast := map[string]any{"leases.yield_grace": "2s", "leases.min_hold": "2s", "jetstream.unhealthy_after": unhealthyAfter.String()}
	holder := appview(t, w.c, "holder", db, []string{"ws://" + freeAddr(t) + "/xrpc/network.bsky.jetstream.subscribeEvents"}, fast)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := holder.Wait(ctx, harness.Is("worker.started", "jetstream-consumer")); err != nil {
		t.Fatal(err)
	}
	contender := appview(t, w.c, "contender", db, []string{j.v2URL()}, fast)
	started := time.Now()
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	if _, err := holder.Wait(ctx2, harness.Is("lease.yielded", "jetstream-consumer")); err != nil {
		t.Fatalf("the unhealthy holder never yielded: %v\n%s\n%s", err, holder.Tail(10), contender.Tail(10))
	}
	if _, err := contender.Wait(ctx2, harness.Is("worker.started", "jetstream-consumer")); err != nil {
		t.Fatalf("the healthy contender never took the lease: %v\n%s\n%s", err, holder.Tail(10), contender.Tail(10))
	}
	t.Logf("FIGURE health-aware custody: the contender consumes %v after it started (unhealthy_after %v, yield_grace 2s, min_hold 2s)",
		time.Since(started).Round(time.Millisecond), unhealthyAfter)
	target := newestSeq(t, j)
	waitSeq(t, j.addr, target, time.Minute, contender)
	// The holder never reached Jetstream, so it stored only where it
	// began (no event): the contender resumes from there, by time, and
	// from its first batch on misses nothing.
	bs := batches(contender)
	checkCovered(t, j.addr, probe(t, j, target, 3*time.Second), bs[0].first, target, bs)
	if host, seq, _ := position(t, db); host != j.addr || seq < target {
		t.Fatalf("stored position %s seq %d, want %s seq >= %d", host, seq, j.addr, target)
	}
}
