package processor_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/synth"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/rs/zerolog"
)

func generate(t testing.TB, o synth.Options) ([]jetstream.Event, *synth.Expected) {
	t.Helper()
	g := synth.NewGenerator(o)
	var evs []jetstream.Event
	for {
		ev, ok := g.Next()
		if !ok {
			break
		}
		evs = append(evs, ev)
	}
	return evs, g.Expected()
}

// applyInBatches applies events in batches of size n, collecting the push
// event keys reported.
func applyInBatches(t testing.TB, p *processor.Processor, db *database.DB, events []jetstream.Event, n int, pushes map[string]bool) {
	t.Helper()
	for i := 0; i < len(events); i += n {
		res, err := p.Apply(context.Background(), db, unfenced, events[i:min(i+n, len(events))])
		if err != nil {
			t.Fatalf("apply batch at %d: %v", i, err)
		}
		if res.Skipped[processor.ReasonDatabase] != 0 {
			t.Fatalf("batch at %d: database refused events: %+v", i, res)
		}
		for _, m := range res.NewManifests {
			pushes[m.EventKey()] = true
		}
	}
}

func TestSyntheticTrafficProducesTheExpectedState(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			db := testsupport.OpenDB(t)
			events, exp := generate(t, synth.Options{Seed: seed, Events: 2000})
			p := processor.New(processor.Options{Log: zerolog.Nop()})
			pushes := map[string]bool{}
			applyInBatches(t, p, db, events, 100, pushes)
			for _, d := range synth.Diff(context.Background(), db.DB, exp) {
				t.Error(d)
			}
			var got []string
			for k := range pushes {
				got = append(got, k)
			}
			sort.Strings(got)
			if strings.Join(got, "\n") != strings.Join(exp.PushEventKeys, "\n") {
				t.Errorf("push event keys: got %d, want %d", len(got), len(exp.PushEventKeys))
			}
		})
	}
}

// dump renders every table of the database (but the lease and migration
// bookkeeping) as sorted rows.
func dump(t testing.TB, db *database.DB) string {
	t.Helper()
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN ('schema_migrations', 'leases', 'lease_contenders') ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	rows.Close()
	var b strings.Builder
	for _, name := range names {
		q, err := testsupport.SelectAll(context.Background(), db, name)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := testsupport.DumpRows(context.Background(), db.DB, q)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "== %s (%d rows)\n%s\n", name, len(lines), strings.Join(lines, "\n"))
	}
	return b.String()
}

func TestApplyingTheStreamTwiceOrWithRewindsLeavesAnIdenticalDatabase(t *testing.T) {
	events, exp := generate(t, synth.Options{Seed: 11, Events: 2000})
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	pushes := map[string]bool{}

	once := testsupport.OpenDB(t)
	applyInBatches(t, p, once, events, 250, pushes)
	want := dump(t, once)
	if d := synth.Diff(context.Background(), once.DB, exp); len(d) != 0 {
		t.Fatalf("single pass differs from the expected state: %v", d)
	}

	twice := testsupport.OpenDB(t)
	applyInBatches(t, p, twice, events, 250, pushes)
	applyInBatches(t, p, twice, events, 77, pushes)
	if got := dump(t, twice); got != want {
		t.Fatalf("applying the stream twice changed the database:\n%s", firstDifference(want, got))
	}

	// Rewinds: like a consumer that reconnects with a cursor some way back,
	// again and again, with batch boundaries falling elsewhere each time.
	rng := rand.New(rand.NewPCG(5, 6))
	rewound := testsupport.OpenDB(t)
	pos := 0
	for pos < len(events) {
		end := min(len(events), pos+1+rng.IntN(400))
		applyInBatches(t, p, rewound, events[pos:end], 1+rng.IntN(60), pushes)
		pos = max(0, end-rng.IntN(300))
		if end == len(events) {
			break
		}
	}
	if got := dump(t, rewound); got != want {
		t.Fatalf("applying the stream with rewinds changed the database:\n%s", firstDifference(want, got))
	}
}

func firstDifference(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < min(len(w), len(g)); i++ {
		if w[i] != g[i] {
			return fmt.Sprintf("line %d:\nwant %s\ngot  %s", i+1, w[i], g[i])
		}
	}
	return fmt.Sprintf("lengths %d vs %d", len(w), len(g))
}

func TestDiffReportsEveryKindOfDifference(t *testing.T) {
	db := testsupport.OpenDB(t)
	events, exp := generate(t, synth.Options{Seed: 4, Events: 1500})
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	applyInBatches(t, p, db, events, 500, map[string]bool{})
	for name, rows := range exp.Tables {
		if len(rows) == 0 {
			t.Errorf("expected state has no %s rows: the stream does not exercise it", name)
		}
	}
	for _, q := range []string{
		`UPDATE tags SET digest = 'sha256:wrong' WHERE rowid = (SELECT MIN(rowid) FROM tags)`,
		`DELETE FROM stars WHERE rowid = (SELECT MIN(rowid) FROM stars)`,
		`UPDATE repository_stats SET pull_count = pull_count + 1 WHERE rowid = (SELECT MIN(rowid) FROM repository_stats)`,
		`INSERT INTO hold_crew (hold_did, rkey, member_did, role, added_at) VALUES ('did:web:x', 'r', 'did:plc:y', 'read', 1)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	d := synth.Diff(context.Background(), db.DB, exp)
	joined := strings.Join(d, "\n")
	for _, want := range []string{"tags: row", "stars: missing row", "repository_stats: row", "hold_crew: unexpected row"} {
		if !strings.Contains(joined, want) {
			t.Errorf("diff lacks %q:\n%s", want, joined)
		}
	}
}
