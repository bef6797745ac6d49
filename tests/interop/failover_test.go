//go:build interop

package interop

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/harness"
)

// Two Jetstreams on one simulator: the first is killed, appview moves to
// the second and resumes there by time, with no gap: every event the
// second serves from the first one appview had not committed from the
// first on is committed. Prints the failover time.
func TestFailoverToASecondJetstreamResumesByTimeWithoutAGap(t *testing.T) {
	parallel(t)
	w := newWorld(t, 2)
	j1, j2 := w.js[0], w.js[1]
	p1 := startProbe(t, j1)
	db := filepath.Join(w.dir, "failover.db")
	a := appview(t, w.c, "appview", db, []string{j1.v2URL(), j2.v2URL()}, nil)
	// Killed while consuming live: it committed an event Jetstream served
	// after this call (newestSeq waits for one).
	waitSeq(t, j1.addr, newestSeq(t, j1), time.Minute, a)
	killed := time.Now()
	j1.proc.Kill()
	<-p1.done
	var lastOn1 int64
	for _, b := range batches(a) {
		if b.host == j1.addr {
			lastOn1 = max(lastOn1, b.last)
		}
	}
	seenOn1 := map[string]bool{}
	for _, p := range p1.snapshot() {
		if p.seq <= lastOn1 {
			seenOn1[p.key] = true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := a.Wait(ctx, committedOn(j2.addr, 0))
	if err != nil {
		t.Fatalf("appview never committed a batch from the second Jetstream: %v", err)
	}
	first := batchOf(e, 0)
	t.Logf("FIGURE failover: first batch from the second Jetstream %v after the first was killed", first.at.Sub(killed).Round(time.Millisecond))
	target := newestSeq(t, j2)
	p2 := probe(t, j2, target, 5*time.Second)
	waitSeq(t, j2.addr, target, time.Minute, a)
	var from int64
	for _, p := range p2 {
		if !seenOn1[p.key] {
			from = p.seq
			break
		}
	}
	if from == 0 {
		t.Fatal("every event on the second Jetstream had been committed from the first: no failover traffic to check")
	}
	checkCovered(t, j2.addr, p2, from, target, batches(a))
	if host, _, _ := position(t, db); host != j2.addr {
		t.Fatalf("stored position on %q, want the second Jetstream %q", host, j2.addr)
	}
}

// The simulator is frozen (SIGSTOP): both Jetstreams stay up, answer
// pings, and send nothing. appview leaves its host within 2x
// stale_timeout. Prints the detection time (last event to the dial of
// the other host).
func TestASilentJetstreamIsLeftWithinTwiceTheStaleTimeout(t *testing.T) {
	parallel(t)
	w := newWorld(t, 2)
	j1, j2 := w.js[0], w.js[1]
	db := filepath.Join(w.dir, "silent.db")
	a := appview(t, w.c, "appview", db, []string{j1.v2URL(), j2.v2URL()}, nil)
	waitSeq(t, j1.addr, newestSeq(t, j1), time.Minute, a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.sim.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	t.Cleanup(func() { _ = w.sim.Signal(syscall.SIGCONT) })
	from := a.Log.Len()
	e, err := a.Log.WaitFrom(ctx, from, func(e harness.Event) bool {
		return e.Msg == "jetstream connected" && e.Str("url") == j2.v2URL()
	})
	if err != nil {
		t.Fatalf("appview did not move to the second Jetstream within 10s of the freeze: %v\n%s", err, a.Tail(20))
	}
	var lastEvent time.Time
	for _, b := range batches(a) {
		if b.host == j1.addr && b.at.Before(e.Logged) {
			lastEvent = b.at
		}
	}
	silentFrom := frozen
	if lastEvent.After(frozen) {
		silentFrom = lastEvent
	}
	since := e.Logged.Sub(silentFrom)
	t.Logf("FIGURE silent host: moved to the second Jetstream %v after the freeze (%v after the last batch; stale_timeout %v)",
		e.Logged.Sub(frozen).Round(time.Millisecond), e.Logged.Sub(lastEvent).Round(time.Millisecond), staleTimeout)
	if since > 2*staleTimeout {
		t.Fatalf("moved %v after the stream went silent, want within 2 x stale_timeout (%v)", since, 2*staleTimeout)
	}
}

// The first Jetstream is frozen (SIGSTOP), so appview moves to the
// second; once the first is thawed, appview switches back to it within a
// few failback intervals (jetstream.failback_interval) and goes on
// consuming there. Before failback, one bad moment of the first host left
// appview on the second for as long as that one delivered. Prints the time
// from the thaw to the switch.
func TestAThawedFirstJetstreamIsSwitchedBackTo(t *testing.T) {
	parallel(t)
	w := newWorld(t, 2)
	j1, j2 := w.js[0], w.js[1]
	db := filepath.Join(w.dir, "failback.db")
	a := appview(t, w.c, "appview", db, []string{j1.v2URL(), j2.v2URL()}, map[string]any{"jetstream.failback_interval": "1s"})
	waitSeq(t, j1.addr, newestSeq(t, j1), time.Minute, a)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := j1.proc.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j1.proc.Signal(syscall.SIGCONT) })
	from := a.Log.Len()
	if _, err := a.Log.WaitFrom(ctx, from, func(e harness.Event) bool {
		return e.Msg == "jetstream connected" && e.Str("url") == j2.v2URL()
	}); err != nil {
		t.Fatalf("appview did not move to the second Jetstream after the first froze: %v\n%s", err, a.Tail(20))
	}
	// Frozen, the first one takes connections (the kernel's backlog) and
	// never answers them: a failback probe of it fails (after
	// stale_timeout), and none may have switched back by then.
	if _, err := a.Log.WaitFrom(ctx, from, func(e harness.Event) bool {
		return e.Msg == "jetstream failback probe: the earlier URL does not answer yet" && e.Str("url") == j1.v2URL()
	}); err != nil {
		t.Fatalf("appview never probed the frozen first Jetstream: %v\n%s", err, a.Tail(20))
	}
	const switchedBack = "jetstream switching back to an earlier URL, which answers again"
	if early := a.Log.Find(from, harness.Msg(switchedBack)); len(early) > 0 {
		t.Fatalf("switched back to a frozen Jetstream: %+v", early[0])
	}
	if err := j1.proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed := time.Now()
	back, err := a.Log.WaitFrom(ctx, from, func(e harness.Event) bool {
		return e.Msg == switchedBack && e.Str("next_url") == j1.v2URL()
	})
	if err != nil {
		t.Fatalf("appview did not switch back to the thawed first Jetstream within a minute: %v\n%s", err, a.Tail(20))
	}
	t.Logf("FIGURE failback: switched back %v after the thaw (failback_interval 1s, stale_timeout %v)",
		back.Logged.Sub(thawed).Round(time.Millisecond), staleTimeout)
	waitSeq(t, j1.addr, newestSeq(t, j1), time.Minute, a)
	if host, _, _ := position(t, db); host != j1.addr {
		t.Fatalf("stored position on %q, want the first Jetstream %q", host, j1.addr)
	}
}
