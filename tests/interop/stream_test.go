//go:build interop

package interop

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/harness"
)

// Both wires consume the same Jetstream from its first event; the stored
// position ends at Jetstream's own sequence number; every event is
// committed. Prints the catch-up rate of each wire (same run, same server).
func TestBothWiresConsumeTheStreamAndThePositionTracksJetstreamsSeq(t *testing.T) {
	parallel(t)
	w := newWorldOf(t, backlogAccounts, backlogRecords, 1)
	j := w.js[0]
	waitServed(t, j, backlogEvents, 30*time.Second) // the backlog is there
	// Freeze the simulator so both wires catch up on the same backlog.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.sim.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.sim.Signal(syscall.SIGCONT)
	// The newest event: what Jetstream read from the simulator before the
	// freeze reaches its stream within milliseconds, so once the stream
	// has been quiet for a second it has ended (newestSeq waits for an
	// event after its call, which never comes now, for 3 s).
	all := probe(t, j, -1, time.Second)
	if len(all) == 0 {
		t.Fatalf("%s served no event", j.addr)
	}
	target := all[len(all)-1].seq
	probed := probe(t, j, target, 5*time.Second)
	host := j.addr
	// Each wire twice, in the order v2 v1 v1 v2, so neither gains from
	// going second (a warm page cache on the server).
	for round, wire := range []struct{ name, url string }{{"v2", j.v2URL()}, {"v1", j.v1URL()}, {"v1", j.v1URL()}, {"v2", j.v2URL()}} {
		db := filepath.Join(w.dir, fmt.Sprintf("%s-%d.db", wire.name, round))
		seed(t, db, host, 1)
		a := appview(t, w.c, fmt.Sprintf("appview-%s-%d", wire.name, round), db, []string{wire.url}, nil)
		b := waitSeq(t, host, target, 2*time.Minute, a)
		conn, err := a.Wait(context.Background(), harness.Msg("jetstream connected"))
		if err != nil {
			t.Fatal(err)
		}
		took := b.at.Sub(conn.Logged)
		events := 0
		for _, x := range batches(a) {
			if x.last <= target {
				events += x.events
			}
		}
		t.Logf("FIGURE catch-up %s wire: %d events to seq %d in %v from connect = %.0f events/s", wire.name, events, target, took.Round(time.Millisecond),
			float64(events)/took.Seconds())
		checkCovered(t, host, probed, 2, target, batches(a))
		if _, err := a.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		gotHost, seq, timeUS := position(t, db)
		if gotHost != host || seq < target || timeUS == 0 {
			t.Fatalf("%s wire: stored position host %q seq %d time_us %d, want host %q seq >= %d", wire.name, gotHost, seq, timeUS, host, target)
		}
	}
}

// appview is killed (SIGKILL or SIGTERM) and restarted at random points:
// every start resumes at or past the last committed batch, and every
// event is committed.
func TestKillAndRestartAtRandomPointsNeitherRegressesNorSkips(t *testing.T) {
	parallel(t)
	// The first start (from seq 1) catches up on a backlog: 1000 events,
	// which the bootstrap of 100 accounts of 10 records makes.
	w := newWorldOf(t, 100, 10, 1)
	j := w.js[0]
	waitServed(t, j, 1000, 30*time.Second)
	db := filepath.Join(w.dir, "kill.db")
	seed(t, db, j.addr, 1)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13))
	var starts []*harness.Instance
	for round := range 6 {
		a := appview(t, w.c, fmt.Sprintf("appview-%d", round), db, []string{j.v2URL()}, nil)
		starts = append(starts, a)
		e, err := a.Wait(context.Background(), harness.Msg("consumer started"))
		if err != nil {
			t.Fatal(err)
		}
		var before int64
		for _, b := range batches(starts[:len(starts)-1]...) {
			before = max(before, b.last)
		}
		if got := num(e, "seq"); got < before {
			t.Fatalf("start %d resumed at seq %d, before the last committed batch's %d: regression", round, got, before)
		}
		// A random point of the run, by design a stretch of time: within
		// 1.5 s of the consumer's start it may fall in the catch-up (the
		// first start's 1000 events take a fraction of a second), in
		// live consumption, or between two batch commits.
		time.Sleep(time.Duration(100+rng.IntN(1400)) * time.Millisecond)
		sig := syscall.SIGKILL
		if round%2 == 1 {
			sig = syscall.SIGTERM
		}
		_ = a.Signal(sig)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, _ = a.ExitCode(ctx)
		cancel()
	}
	final := appview(t, w.c, "appview-final", db, []string{j.v2URL()}, nil)
	starts = append(starts, final)
	target := newestSeq(t, j)
	waitSeq(t, j.addr, target, time.Minute, starts...)
	checkCovered(t, j.addr, probe(t, j, target, 5*time.Second), 2, target, batches(starts...))
}

// A holder that dies before its first commit on a fresh database hands
// its successor where it began, not nothing: the first appview stores its
// starting time and is killed before it reads a single event (its only
// URL is dead); events go on arriving at Jetstream; the successor, on the
// real URL, must cover every event Jetstream saw from the first one's
// start on. (Before, it started at its own, later, live tail and the
// events in between were lost: the real-PDS suite met this in CI.)
func TestAHolderKilledBeforeItsFirstCommitHandsOnWhereItBegan(t *testing.T) {
	parallel(t)
	w := newWorld(t, 1)
	j := w.js[0]
	db := filepath.Join(w.dir, "fresh.db")
	first := appview(t, w.c, "first", db, []string{"ws://" + freeAddr(t) + "/xrpc/network.bsky.jetstream.subscribeEvents"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	started, err := first.Wait(ctx, harness.Msg("consumer started"))
	if err != nil {
		t.Fatalf("the first appview's consumer never started: %v\n%s", err, first.Tail(20))
	}
	_ = first.Signal(syscall.SIGKILL)
	if _, err := first.ExitCode(ctx); err != nil {
		t.Fatal(err)
	}
	// Let Jetstream see events the dead holder owed: 50 more.
	waitServed(t, j, newestSeq(t, j)+50, 20*time.Second)
	next := appview(t, w.c, "next", db, []string{j.v2URL()}, nil)
	target := newestSeq(t, j)
	waitSeq(t, j.addr, target, time.Minute, next)
	probed := probe(t, j, target, 3*time.Second)
	from := int64(0)
	for _, p := range probed {
		if !p.at.Before(started.Time) {
			from = p.seq
			break
		}
	}
	if from == 0 {
		t.Fatalf("Jetstream saw no event after the first appview started at %v", started.Time)
	}
	t.Logf("the successor must cover seq %d (the first event after the dead holder began) to %d", from, target)
	checkCovered(t, j.addr, probed, from, target, batches(next))
}
