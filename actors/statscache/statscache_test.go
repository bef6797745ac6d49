package statscache_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/actors/statscache"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/synth"
)

func TestMain(m *testing.M) {
	testsupport.VerifyTestMain(m)
}

const ttl = time.Minute

func acquire(t testing.TB, db *database.DB, holder string) fence.Custody {
	t.Helper()
	return testsupport.Custody(t, db, "jetstream-consumer", holder, ttl)
}

func request[T any](t testing.TB, sys *actor.ActorSystem, pid *actor.PID, msg any) T {
	t.Helper()
	res, err := sys.Root.RequestFuture(pid, msg, 10*time.Second).Result()
	if err != nil {
		t.Fatalf("request %T: %v", msg, err)
	}
	v, ok := res.(T)
	if !ok {
		t.Fatalf("request %T: reply %T %v", msg, res, res)
	}
	return v
}

func stopped(t testing.TB, sys *actor.ActorSystem, pid *actor.PID) {
	t.Helper()
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// stat is a hold's counts as the processor reports them; its version is
// the no-rev version of its time, so a later updatedAt is a newer version.
func stat(hold string, pull int64, updatedAt int64) processor.HoldStat {
	return processor.HoldStat{HoldDID: hold, OwnerDID: "did:plc:o", Repository: "app", RKey: "rk",
		PullCount: pull, PushCount: 1, UpdatedAt: updatedAt, SourceUS: updatedAt * 1000,
		Version: processor.NoRevVersion(updatedAt * 1000)}
}

func TestAMessageUnderAStaleCustodyIsRejectedAndCounted(t *testing.T) {
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	reg := prometheus.NewRegistry()
	m, err := statscache.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	old := acquire(t, db, "a")
	testsupport.Release(t, db, old)
	cur := acquire(t, db, "b")
	pid := sys.Root.Spawn(statscache.NewProps(statscache.Options{DB: db, Custody: cur, Log: zerolog.Nop(), Metrics: m}))
	defer stopped(t, sys, pid)

	rej := request[*processor.StaleCustodyError](t, sys, pid, &processor.ObserveStats{Custody: old, Stats: []processor.HoldStat{stat("did:web:h1", 5, 100)}})
	if rej.Got != old || rej.Have != cur {
		t.Fatalf("rejection %+v", rej)
	}
	if got := testutil.ToFloat64(m.Rejected()); got != 1 {
		t.Fatalf("rejected metric = %v, want 1", got)
	}
	snap := request[*processor.StatsSnapshot](t, sys, pid, &processor.GetStats{OwnerDID: "did:plc:o", Repository: "app"})
	if len(snap.Holds) != 0 {
		t.Fatalf("a rejected message changed the view: %+v", snap)
	}
	ok := request[*processor.StatsObserved](t, sys, pid, &processor.ObserveStats{Custody: cur, Stats: []processor.HoldStat{stat("did:web:h1", 5, 100)}})
	if ok.Applied != 1 {
		t.Fatalf("current custody: %+v", ok)
	}
}

func TestAnOlderUpdatedAtFromTheSameHoldIsIgnored(t *testing.T) {
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	c := acquire(t, db, "a")
	pid := sys.Root.Spawn(statscache.NewProps(statscache.Options{DB: db, Custody: c, Log: zerolog.Nop()}))
	defer stopped(t, sys, pid)
	res := request[*processor.StatsObserved](t, sys, pid, &processor.ObserveStats{Custody: c, Stats: []processor.HoldStat{
		stat("did:web:h1", 10, 200), stat("did:web:h2", 4, 150), stat("did:web:h1", 3, 100), stat("did:web:h1", 10, 200),
	}})
	if res.Applied != 2 || res.Ignored != 2 {
		t.Fatalf("observed %+v, want 2 applied 2 ignored", res)
	}
	snap := request[*processor.StatsSnapshot](t, sys, pid, &processor.GetStats{OwnerDID: "did:plc:o", Repository: "app"})
	if snap.PullCount != 14 || len(snap.Holds) != 2 || snap.Holds[0].PullCount != 10 {
		t.Fatalf("snapshot %+v", snap)
	}
}

// Two updates of one hold's stats in one millisecond (same updatedAt) are
// ordered by their commits' revs in the cache's view as in the database.
func TestTwoUpdatesInOneMillisecondAreOrderedByRevInTheView(t *testing.T) {
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	c := acquire(t, db, "a")
	pid := sys.Root.Spawn(statscache.NewProps(statscache.Options{DB: db, Custody: c, Log: zerolog.Nop()}))
	defer stopped(t, sys, pid)
	stats := func(us int64, rev string, pull int) jetstream.Event {
		rec, _ := json.Marshal(map[string]any{"ownerDid": "did:plc:o", "repository": "app", "pullCount": pull,
			"pushCount": 1, "updatedAt": "2026-01-01T00:00:00.123Z"})
		return jetstream.Event{DID: "did:web:h1.example", TimeUS: us, Kind: jetstream.KindCommit, Commit: &jetstream.Commit{
			Rev: rev, Operation: "update", Collection: processor.CollectionStats, RKey: "rk", Record: rec}}
	}
	if err := applyStream(t, sys, pid, db, c, []jetstream.Event{stats(100, "3lrnqkdzhdq22", 7)}); err != nil {
		t.Fatal(err)
	}
	if err := applyStream(t, sys, pid, db, c, []jetstream.Event{stats(101, "3lrnqkdzhdq23", 9)}); err != nil {
		t.Fatal(err)
	}
	snap := request[*processor.StatsSnapshot](t, sys, pid, &processor.GetStats{OwnerDID: "did:plc:o", Repository: "app"})
	if snap.PullCount != 9 {
		t.Fatalf("view pull count = %d, want 9 (the later commit)", snap.PullCount)
	}
	assertViewMatchesDatabase(t, sys, pid, db.DB)
}

// applyStream feeds events through the processor under c, batch by batch,
// telling the cache what each committed batch changed, as the consumer does.
func applyStream(t testing.TB, sys *actor.ActorSystem, pid *actor.PID, db *database.DB, c fence.Custody, events []jetstream.Event) error {
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	for i := 0; i < len(events); i += 200 {
		res, err := p.Apply(context.Background(), db, c, events[i:min(i+200, len(events))])
		if err != nil {
			return err
		}
		if pid != nil {
			request[*processor.StatsObserved](t, sys, pid, &processor.ObserveStats{Custody: c, Stats: res.HoldStats})
		}
	}
	return nil
}

func generate(seed uint64, n int) ([]jetstream.Event, *synth.Expected) {
	g := synth.NewGenerator(synth.Options{Seed: seed, Events: n})
	var evs []jetstream.Event
	for {
		ev, ok := g.Next()
		if !ok {
			return evs, g.Expected()
		}
		evs = append(evs, ev)
	}
}

// assertAggregateIsSumOverHolds checks every repository_stats row against
// the persisted per-hold rows.
func assertAggregateIsSumOverHolds(t testing.TB, db *sql.DB) {
	t.Helper()
	var bad int
	err := db.QueryRow(`SELECT COUNT(*) FROM repository_stats r WHERE (r.pull_count, r.push_count, r.last_pull, r.last_push) IS NOT
  (SELECT COALESCE(SUM(pull_count), 0), COALESCE(SUM(push_count), 0), MAX(last_pull), MAX(last_push)
   FROM repository_hold_stats h WHERE h.did = r.did AND h.repository = r.repository)`).Scan(&bad)
	if err != nil {
		t.Fatal(err)
	}
	if bad != 0 {
		t.Fatalf("%d repository_stats rows are not the sum over their holds", bad)
	}
}

func TestAWarmCacheHoldsThePersistedRows(t *testing.T) {
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	c := acquire(t, db, "a")
	events, _ := generate(21, 3000)
	if err := applyStream(t, sys, nil, db, c, events); err != nil {
		t.Fatal(err)
	}
	pid := sys.Root.Spawn(statscache.NewProps(statscache.Options{DB: db, Custody: c, Log: zerolog.Nop()}))
	defer stopped(t, sys, pid)
	assertViewMatchesDatabase(t, sys, pid, db.DB)
}

// assertViewMatchesDatabase compares the cache's snapshot of every
// repository with repository_stats.
func assertViewMatchesDatabase(t testing.TB, sys *actor.ActorSystem, pid *actor.PID, db *sql.DB) {
	t.Helper()
	rows, err := db.Query(`SELECT ` + database.Text("did") + `, ` + database.Text("repository") + `, pull_count, push_count
FROM repository_stats`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		did, repo  string
		pull, push int64
	}
	var all []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.did, &r.repo, &r.pull, &r.push); err != nil {
			t.Fatal(err)
		}
		all = append(all, r)
	}
	rows.Close()
	withHolds := 0
	for _, r := range all {
		snap := request[*processor.StatsSnapshot](t, sys, pid, &processor.GetStats{OwnerDID: r.did, Repository: r.repo})
		if snap.PullCount != r.pull || snap.PushCount != r.push {
			t.Errorf("%s/%s: cache %d/%d, database %d/%d", r.did, r.repo, snap.PullCount, snap.PushCount, r.pull, r.push)
		}
		if len(snap.Holds) > 0 {
			withHolds++
		}
	}
	if withHolds == 0 {
		t.Fatal("no repository has hold stats: the test proves nothing")
	}
}

func TestFailoverMidStreamLeavesRepositoryStatsEqualToTheSumOverHolds(t *testing.T) {
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	events, exp := generate(22, 4000)
	half := len(events) / 2

	a := acquire(t, db, "instance-a")
	cacheA := sys.Root.Spawn(statscache.NewProps(statscache.Options{DB: db, Custody: a, Log: zerolog.Nop()}))
	if err := applyStream(t, sys, cacheA, db, a, events[:half]); err != nil {
		t.Fatal(err)
	}
	// Instance A loses custody (here: its lease is taken over after a
	// release); B starts cold, from the persisted rows only.
	testsupport.Release(t, db, a)
	b := acquire(t, db, "instance-b")
	cacheB := sys.Root.Spawn(statscache.NewProps(statscache.Options{DB: db, Custody: b, Log: zerolog.Nop()}))
	defer stopped(t, sys, cacheB)

	// The old holder keeps going for a moment: every write it tries is refused.
	if err := applyStream(t, sys, cacheA, db, a, events[half:half+200]); !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("old holder's batch: %v, want ErrSuperseded", err)
	}
	stopped(t, sys, cacheA)

	// B replays from a rewound cursor, as a new consumer does.
	if err := applyStream(t, sys, cacheB, db, b, events[half-300:]); err != nil {
		t.Fatal(err)
	}
	assertAggregateIsSumOverHolds(t, db.DB)
	for _, d := range synth.Diff(context.Background(), db.DB, exp) {
		t.Error(d)
	}
	assertViewMatchesDatabase(t, sys, cacheB, db.DB)
	var stale int
	if err := db.QueryRow(`SELECT COUNT(*) FROM repository_stats WHERE fence NOT IN (?, ?)`, a.Fence, b.Fence).Scan(&stale); err != nil || stale != 0 {
		t.Fatalf("rows stamped with another fence: %d %v", stale, err)
	}
}

func TestAStartingCacheRepairsAPartialSumLeftInRepositoryStats(t *testing.T) {
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	events, _ := generate(23, 2000)
	a := acquire(t, db, "instance-a")
	if err := applyStream(t, sys, nil, db, a, events); err != nil {
		t.Fatal(err)
	}
	// What the seed's bug left behind: one hold's numbers written as the total.
	res, err := db.Exec(`UPDATE repository_stats SET pull_count = (SELECT MIN(pull_count) FROM repository_hold_stats h
  WHERE h.did = repository_stats.did AND h.repository = repository_stats.repository)
WHERE (SELECT COUNT(*) FROM repository_hold_stats h WHERE h.did = repository_stats.did AND h.repository = repository_stats.repository) > 1`)
	if err != nil {
		t.Fatal(err)
	}
	broken, _ := res.RowsAffected()
	if broken == 0 {
		t.Fatal("no repository has two holds: the test proves nothing")
	}
	testsupport.Release(t, db, a)
	b := acquire(t, db, "instance-b")
	reg := prometheus.NewRegistry()
	m, _ := statscache.NewMetrics(reg)
	pid := sys.Root.Spawn(statscache.NewProps(statscache.Options{DB: db, Custody: b, Log: zerolog.Nop(), Metrics: m}))
	defer stopped(t, sys, pid)
	request[*processor.StatsSnapshot](t, sys, pid, &processor.GetStats{}) // answered only once warm
	assertAggregateIsSumOverHolds(t, db.DB)
	// The repaired rows carry the repairing custody; their values are the
	// expected ones (updated_at is the repair's time, so it is not compared).
	var repaired int64
	if err := db.QueryRow(`SELECT COUNT(*) FROM repository_stats WHERE fence = ?`, b.Fence).Scan(&repaired); err != nil || repaired != broken {
		t.Fatalf("rows stamped with fence %d: %d (%v), want %d", b.Fence, repaired, err, broken)
	}
	if got := testutil.ToFloat64(m.Reconciled()); got != float64(broken) {
		t.Fatalf("reconciled metric = %v, want %d", got, broken)
	}
}

// supervisorProbe spawns a child and reports its failure reason.
type supervisorProbe struct {
	child   *actor.Props
	reasons chan any
}

func (p *supervisorProbe) Receive(ctx actor.Context) {
	if _, ok := ctx.Message().(*actor.Started); ok {
		ctx.Spawn(p.child)
	}
}

func TestACacheWhoseCustodyWasSupersededFailsWithErrSuperseded(t *testing.T) {
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	a := acquire(t, db, "instance-a")
	testsupport.Release(t, db, a)
	acquire(t, db, "instance-b")
	reasons := make(chan any, 4)
	strategy := actor.NewOneForOneStrategy(0, time.Second, func(reason any) actor.Directive {
		reasons <- reason
		return actor.StopDirective
	})
	probe := &supervisorProbe{child: statscache.NewProps(statscache.Options{DB: db, Custody: a, Log: zerolog.Nop()}), reasons: reasons}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return probe }, actor.WithSupervisor(strategy)))
	defer stopped(t, sys, pid)
	select {
	case r := <-reasons:
		err, ok := r.(error)
		if !ok || !errors.Is(err, fence.ErrSuperseded) {
			t.Fatalf("failure reason %v, want ErrSuperseded", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cache did not fail")
	}
}

func TestAWarmUpOverCountsStoredBeforeTheRangeCheckSaturatesInsteadOfFailing(t *testing.T) {
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	// What an older processor let in: two holds at the top of int64, whose
	// SUM overflows.
	for _, hold := range []string{"did:web:a.example", "did:web:b.example"} {
		if _, err := db.Exec(`INSERT INTO repository_hold_stats (did, repository, hold_did, rkey, pull_count, push_count, updated_at, source_us)
VALUES ('did:plc:o', 'app', ?, 'rk', 9223372036854775807, 2, 1, 1)`, hold); err != nil {
			t.Fatal(err)
		}
	}
	c := acquire(t, db, "me")
	pid := sys.Root.Spawn(statscache.NewProps(statscache.Options{DB: db, Custody: c, Log: zerolog.Nop()}))
	defer stopped(t, sys, pid)
	snap := request[*processor.StatsSnapshot](t, sys, pid, &processor.GetStats{OwnerDID: "did:plc:o", Repository: "app"})
	if snap.PullCount != processor.MaxSafeInteger || snap.PushCount != 4 {
		t.Fatalf("snapshot pull %d push %d, want %d and 4", snap.PullCount, snap.PushCount, int64(processor.MaxSafeInteger))
	}
	var pull, push int64
	if err := db.QueryRow(`SELECT pull_count, push_count FROM repository_stats WHERE did = 'did:plc:o' AND repository = 'app'`).
		Scan(&pull, &push); err != nil {
		t.Fatalf("the warm-up wrote no aggregate: %v", err)
	}
	if pull != processor.MaxSafeInteger || push != 4 {
		t.Fatalf("repository_stats pull %d push %d, want %d and 4", pull, push, int64(processor.MaxSafeInteger))
	}
}
