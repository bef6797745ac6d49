//go:build soak

// The rolling upgrade from the previous release: a soak (soak_test.go),
// on a file database and on sqld. Nine replacements under traffic, it
// was the longest test of scripts/test (about a minute of a race-enabled
// cluster's CPU, its build of the previous release aside).

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/harness"
	"github.com/atcr-io/appview/internal/jetstream"
)

// previousRelease is the commit the rolling-upgrade test runs beside the
// build under test: main before the change that made a grant record its
// nonce after the acquire (61a42df "lease: acquire in one statement, then
// record the nonce") and before migration 17. It claims the next fence
// with its nonce and then acquires under that claim; the build under test
// acquires, then records its nonce: both share one lease table during an
// upgrade. It indexes the stream as the build under test does (the end
// state is compared with this build's rules) and its schema ends at
// migration previousSchema. It must be an ancestor of main, so that every
// full clone has it. Move it to the last commit before the next change of
// the lease protocol or of the schema, and never to one before a change
// of how records are indexed.
const previousRelease = "ab31ada4ce28cec363d59cbc26fe75f480130277"

// previousSchema is the newest migration previousRelease knows.
const previousSchema = 16

// newerSchemaWarning is what an appview logs, once, at start on a
// database a newer appview migrated (cmd/appview/serve.go, the same in
// previousRelease).
const newerSchemaWarning = "the database carries migrations this version does not know: a newer appview migrated it; running on it, but upgrade this instance"

// upgradeTraffic is the stream an upgrade runs under, on the v2 wire with
// sequence numbers: at its pace it spans the nine replacements of a
// race-enabled build.
var upgradeTraffic = trafficOptions{events: 4000, users: 8, holds: 3, rate: 250, v2: true}

// previous is previousRelease's binary, built once per test process.
var previous struct {
	once sync.Once
	bin  string
	err  error
}

// previousBinary returns previousRelease's appview binary, built beside
// the build under test, as it is (with the race detector when the tests
// run with it): the first build on a machine compiles the commit's own
// packages (about 20 s on 2 cores), later ones reuse the binary it kept
// (harness.BuildCommit).
func previousBinary(t *testing.T) string {
	t.Helper()
	previous.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		root, err := harness.ModuleRoot(ctx)
		if err != nil {
			previous.err = err
			return
		}
		out := filepath.Join(filepath.Dir(bin), "appview-previous")
		if previous.err = harness.BuildCommit(ctx, root, previousRelease, os.TempDir(), out, raceEnabled); previous.err == nil {
			previous.bin = out
		}
	})
	if previous.err != nil {
		t.Fatalf("build the previous release %s: %v", previousRelease, previous.err)
	}
	return previous.bin
}

// rollingUpgrade runs three instances of previousRelease on db, which it
// created and migrated, under traffic on the v2 wire, and
// replaces them one at a time with the build under test (the upgrade),
// then with previousRelease again (the rollback), then with the build
// under test again, each replacement with events in flight. It checks
// what an operator relies on: no leased worker ran on two instances at
// once and every grant's fence is one above the last, whichever binary
// granted it; every instance exits 0 and no worker restarted, failed or
// lost its lease; the final database equals the stream's expected state
// and every push reached the receiver once; an older instance started on
// the migrated schema warns once and runs on; and each consumer handover
// between the two binaries (the upgrade again among them: the consumer
// moves from an instance of the rollback to one of the build under test)
// resumed by sequence number from the position the other binary stored.
func rollingUpgrade(t *testing.T, on upgradeOn) {
	db, judge := on.db, on.judge
	old := previousBinary(t)
	c := newCluster(t)
	stripe := stripeStub(t)
	o := upgradeTraffic
	o.creator = old
	tr := startTraffic(t, c, db, o)
	// A bound on the whole roll, not a figure: the sqld soak took 84 s on
	// a quiet host and over 4 min at load 8.
	ctx := within(t, 10*time.Minute)
	next := 0
	release := map[string]string{} // instance → "previous" or "current"
	spec := func(b string) harness.Spec {
		next++
		s := tr.spec(leasedSpec(fmt.Sprintf("u%02d", next), db, stripe))
		s.Timing = on.timing
		s.Bin, release[s.ID] = b, "current"
		if b == old {
			release[s.ID] = "previous"
		}
		return s
	}
	fail := func(err error) {
		t.Helper()
		if judge != nil {
			judge(c, err)
		}
		t.Fatal(err)
	}
	running, err := c.StartAll(ctx, spec(old), spec(old), spec(old))
	if err != nil {
		fail(err)
	}
	for _, l := range leasedWorkers {
		if _, _, err := harness.WaitAny(ctx, harness.Is(harness.WorkerStarted, l), running...); err != nil {
			fail(err)
		}
	}
	phases := []struct{ name, bin string }{{"upgrade", bin}, {"rollback", old}, {"upgrade again", bin}}
	steps := 3 * len(phases)
	var handovers []time.Duration
	step := 0
	for _, ph := range phases {
		for range 3 {
			step++
			us, err := tr.waitCursor(ctx, tr.progress(float64(step)/float64(steps+1)))
			if err != nil {
				fail(fmt.Errorf("%s, step %d: %w", ph.name, step, err))
			}
			if us >= tr.expected.MaxTimeUS {
				t.Fatalf("%s, step %d: the stream ran out before it; it says nothing about handing over a busy consumer", ph.name, step)
			}
			var took []time.Duration
			if running, took, err = replaceOldest(ctx, c, running, spec(ph.bin)); err != nil {
				fail(fmt.Errorf("%s, step %d: %w", ph.name, step, err))
			}
			handovers = append(handovers, took...)
		}
	}
	if err := tr.waitDrained(ctx); err != nil {
		fail(err)
	}
	for _, i := range running {
		checkStopped(t, ctx, i)
	}
	tr.check(ctx, on.stalls)
	tl := c.Timeline()
	if err := harness.CheckExclusive(tl, leasedWorkers...); err != nil {
		t.Error(err)
	}
	if err := harness.CheckFences(tl, firstFences); err != nil {
		t.Error(err)
	}
	checkReleasedByLastGrant(t, ctx, db, tl)
	checkNothingFailed(t, c, on.stalls)
	checkSchemaWarnings(t, c, release)
	checkResumedBySeq(t, c, release)
	slices.Sort(handovers)
	t.Logf("%d handovers between and across releases: median %v, max %v", len(handovers), handovers[len(handovers)/2], handovers[len(handovers)-1])
	// On a server that stalls, a handover driven by the release may wait
	// out a stall, but never the TTL.
	bound := gracefulHandoverBound
	if on.stalls {
		bound = on.timing.TTL
	}
	if worst := handovers[len(handovers)-1]; worst > bound {
		t.Errorf("a handover took %v; want every one driven by the release (< %v), not the TTL", worst, bound)
	}
}

// upgradeOn is the database a rolling upgrade runs on and what it may
// meet there.
type upgradeOn struct {
	db     string
	timing harness.Timing // every instance's leases.*
	// stalls: the server may not answer for longer than the renew
	// deadline (sqld 0.24 at times does, docs/operations.md). A lease lost
	// in a blackout (failing closed) and a push resent by the next custody
	// are then allowed; exclusive custody, fences, the end state, at most
	// one delivery per custody and every resume by seq are checked as ever.
	stalls bool
	// judge, when not nil, is given the cluster and the failure before the
	// roll fails the test: it may skip it instead, when the server, not
	// the build, is at fault.
	judge func(*harness.Cluster, error)
}

// checkNothingFailed fails the test for any worker restart or failure,
// lost lease (but one lost in a blackout, with stalls) or newer-schema
// refusal in any instance's log: an upgrade must not make anything
// crash-loop.
func checkNothingFailed(t *testing.T, c *harness.Cluster, stalls bool) {
	t.Helper()
	for _, i := range c.Instances() {
		for _, e := range i.Log.Events() {
			switch {
			case stalls && e.Event == harness.LeaseLost && e.Reason == "blackout":
			case e.Event == harness.WorkerRestarted, e.Event == harness.WorkerFailed, e.Event == harness.LeaseLost:
				t.Errorf("%s: %s", i.ID, e)
			case e.Level == "error" && i.ID != "replay":
				t.Errorf("%s logged an error: %s", i.ID, e.Line)
			}
		}
	}
}

// checkSchemaWarnings: the previous release's instances started after the
// build under test migrated the database warn once that it carries a
// migration they do not know, and run on; those started before say
// nothing; the build under test migrated it once.
func checkSchemaWarnings(t *testing.T, c *harness.Cluster, release map[string]string) {
	t.Helper()
	newer := newerThanPrevious(t)
	migrated, sawCurrent := 0, false
	for _, i := range c.Instances() {
		r, ok := release[i.ID]
		if !ok {
			continue
		}
		warned := i.Log.Find(0, harness.Msg(newerSchemaWarning))
		want := 0
		if r == "previous" && sawCurrent {
			want = 1
		}
		if len(warned) != want {
			t.Errorf("%s (%s release) warned %d times of a newer schema; want %d", i.ID, r, len(warned), want)
		}
		for _, e := range warned {
			if v := string(e.Fields["versions"]); v != newer {
				t.Errorf("%s: newer migrations %s; want %s", i.ID, v, newer)
			}
		}
		migrated += len(i.Log.Find(0, harness.Msg("database migrated")))
		sawCurrent = sawCurrent || r == "current"
	}
	if migrated != 1 {
		t.Errorf("%d instances migrated the database; want the first of the build under test alone", migrated)
	}
}

// newerThanPrevious is the versions the build under test knows and
// previousRelease does not, as the warning's "versions" field lists them.
func newerThanPrevious(t *testing.T) string {
	t.Helper()
	migs, err := database.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var v []string
	for _, m := range migs {
		if m.Version > previousSchema {
			v = append(v, fmt.Sprint(m.Version))
		}
	}
	return "[" + strings.Join(v, ",") + "]"
}

// checkResumedBySeq: every grant of the consumer's lease to an instance of
// one release after a grant to the other started the consumer from a
// stored sequence position on the replay server's host and connected with
// that sequence number as its cursor (not a time), and this happened at
// least once in each direction.
func checkResumedBySeq(t *testing.T, c *harness.Cluster, release map[string]string) {
	t.Helper()
	byID := map[string]*harness.Instance{}
	for _, i := range c.Instances() {
		byID[i.ID] = i
	}
	gs := harness.Grants(c.Timeline())[leaseConsumer]
	crossed := map[string]int{}
	for k := 1; k < len(gs); k++ {
		from, to := release[gs[k-1].Instance], release[gs[k].Instance]
		if from == to {
			continue
		}
		// Custody events are logged apart from the worker's own lines, so
		// the log's order is not theirs: the consumer's start names its
		// custody, and its first connection is the first after the grant.
		i, g := byID[gs[k].Instance], gs[k]
		custody := fmt.Sprintf("%s:%d", leaseConsumer, g.Fence)
		started := i.Log.Find(0, func(e harness.Event) bool { return e.Msg == "consumer started" && e.Str("custody") == custody })
		connected := i.Log.Find(0, func(e harness.Event) bool {
			return e.Msg == "jetstream connected" && !e.Logged.Before(g.Event.Time.Truncate(time.Millisecond))
		})
		if len(started) == 0 || len(connected) == 0 {
			t.Errorf("%s (%s, fence %d after %s) never started its consumer and connected", i.ID, to, g.Fence, from)
			continue
		}
		seq, cursor := intField(started[0], "seq"), intField(connected[0], "cursor")
		if seq <= 0 || started[0].Str("host") == "" || cursor <= 0 || cursor >= jetstream.CursorSeqMax {
			t.Errorf("%s (%s, fence %d after %s) resumed from host %q seq %d with cursor %d; want the stored seq position",
				i.ID, to, g.Fence, from, started[0].Str("host"), seq, cursor)
			continue
		}
		if w := connected[0].Str("wire"); w != string(jetstream.WireV2) {
			t.Errorf("%s (%s) connected on the %q wire; want v2", i.ID, to, w)
		}
		crossed[from+" to "+to]++
	}
	t.Logf("consumer handovers between releases, each resumed by seq: %v", crossed)
	for _, dir := range []string{"previous to current", "current to previous"} {
		if crossed[dir] == 0 {
			t.Errorf("no consumer handover from the %s release was seen resuming by seq", strings.ReplaceAll(dir, " to ", " release to the "))
		}
	}
}

// intField reads the integer field key of e (0 when absent).
func intField(e harness.Event, key string) int64 {
	var n int64
	_ = json.Unmarshal(e.Fields[key], &n)
	return n
}
