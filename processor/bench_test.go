package processor_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/jetstream"
	"github.com/atcr-io/appview/processor"
	"github.com/atcr-io/appview/synth"
)

const benchBatch = 200

// registryWrites are the tables the processor writes.
var registryWrites = []string{"users", "manifests", "manifest_layers", "manifest_references", "manifest_annotations",
	"tags", "stars", "repo_pages", "hold_captains", "hold_crew", "repository_hold_stats", "repository_stats", "record_tombstones"}

// BenchmarkIngestVersusBareInserts measures, in one run, the ingest rate of
// synthetic io.atcr events through the processor into a file database, and
// the time bare batched INSERTs of the same rows take: every row image the
// processor inserted or updated (captured by triggers in an untimed run),
// written with INSERT OR REPLACE (a row may be written more than once) in
// the same batches, one transaction per batch, into the same schema (its
// keys and indexes are the data model's cost, not the processor's).
// ratio = bare time / processor time (target >= 0.5).
func BenchmarkIngestVersusBareInserts(b *testing.B) {
	all, _ := generate(b, synth.Options{Seed: 99, Events: 20000})
	var events []jetstream.Event
	for _, ev := range all {
		if ev.Kind == jetstream.KindCommit && strings.HasPrefix(ev.Commit.Collection, "io.atcr.") {
			events = append(events, ev)
		}
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	batches, cols := captureWrites(b, p, events)
	rows := 0
	for _, batch := range batches {
		rows += len(batch)
	}
	var procTime, bareTime time.Duration
	for b.Loop() {
		b.StopTimer()
		procDB := openDB(b)
		bareDB := openDB(b)
		b.StartTimer()

		start := time.Now()
		for i := 0; i < len(events); i += benchBatch {
			if _, err := p.Apply(context.Background(), procDB.DB, unfenced, events[i:min(i+benchBatch, len(events))]); err != nil {
				b.Fatal(err)
			}
		}
		procTime += time.Since(start)

		start = time.Now()
		bareInserts(b, bareDB.DB, batches, cols)
		bareTime += time.Since(start)
	}
	n := float64(b.N)
	b.ReportMetric(float64(len(events))*n/procTime.Seconds(), "events/s")
	b.ReportMetric(float64(rows)*n/bareTime.Seconds(), "bare-rows/s")
	b.ReportMetric(float64(rows)/float64(len(events)), "rows/event")
	b.ReportMetric(bareTime.Seconds()/procTime.Seconds(), "ratio")
}

type loggedRow struct {
	table string
	vals  []any
}

// captureWrites applies events once with logging triggers installed and
// returns, per batch, every row image written, plus each table's columns.
func captureWrites(b *testing.B, p *processor.Processor, events []jetstream.Event) ([][]loggedRow, map[string][]string) {
	db := openDB(b)
	if _, err := db.Exec(`CREATE TABLE bench_log (id INTEGER PRIMARY KEY, tbl TEXT, row TEXT)`); err != nil {
		b.Fatal(err)
	}
	cols := map[string][]string{}
	for _, t := range registryWrites {
		r, err := db.Query("SELECT name FROM pragma_table_info('" + t + "')")
		if err != nil {
			b.Fatal(err)
		}
		for r.Next() {
			var c string
			_ = r.Scan(&c)
			cols[t] = append(cols[t], c)
		}
		r.Close()
		news := make([]string, len(cols[t]))
		for i, c := range cols[t] {
			news[i] = "NEW." + c
		}
		for _, ev := range []string{"INSERT", "UPDATE"} {
			q := fmt.Sprintf(`CREATE TRIGGER log_%s_%s AFTER %s ON %s BEGIN INSERT INTO bench_log (tbl, row) VALUES ('%s', json_array(%s)); END`,
				t, strings.ToLower(ev), ev, t, t, strings.Join(news, ", "))
			if _, err := db.Exec(q); err != nil {
				b.Fatal(err)
			}
		}
	}
	var out [][]loggedRow
	var last int64
	for i := 0; i < len(events); i += benchBatch {
		if _, err := p.Apply(context.Background(), db.DB, unfenced, events[i:min(i+benchBatch, len(events))]); err != nil {
			b.Fatal(err)
		}
		r, err := db.Query(`SELECT id, tbl, row FROM bench_log WHERE id > ? ORDER BY id`, last)
		if err != nil {
			b.Fatal(err)
		}
		var batch []loggedRow
		for r.Next() {
			var (
				row  loggedRow
				text string
			)
			if err := r.Scan(&last, &row.table, &text); err != nil {
				b.Fatal(err)
			}
			if err := json.Unmarshal([]byte(text), &row.vals); err != nil {
				b.Fatal(err)
			}
			for j, v := range row.vals {
				if f, ok := v.(float64); ok {
					row.vals[j] = int64(f)
				}
			}
			batch = append(batch, row)
		}
		r.Close()
		out = append(out, batch)
	}
	return out, cols
}

func bareInserts(b *testing.B, db *sql.DB, batches [][]loggedRow, cols map[string][]string) {
	queries := map[string]string{}
	for t, cs := range cols {
		queries[t] = fmt.Sprintf("INSERT OR REPLACE INTO %s VALUES (%s)", t, strings.TrimSuffix(strings.Repeat("?,", len(cs)), ","))
	}
	for _, batch := range batches {
		tx, err := db.Begin()
		if err != nil {
			b.Fatal(err)
		}
		for _, row := range batch {
			if _, err := tx.Exec(queries[row.table], row.vals...); err != nil {
				b.Fatalf("%s: %v", row.table, err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}
