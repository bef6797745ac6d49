package processor_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/testsupport"
)

// Sizes of BenchmarkHoldStatUpsertRowsPerStatement.
const (
	// rowsStored is how many hold-stat rows the table holds before the
	// timed upserts (the shape of a database some batches into a replay).
	rowsStored = 20000
	// rowsPerTx is how many rows one timed transaction upserts: a
	// consumer batch's share of hold-stat events is about this.
	rowsPerTx = 1000
	// rowsPerValues is the rows of one multi-row VALUES statement (11
	// parameters each: 1,100 a statement).
	rowsPerValues = 100
)

// holdStatColumns are the columns every variant writes, in order.
const holdStatColumns = `repository_hold_stats (did, repository, hold_did, rkey, pull_count, push_count,
  last_pull, last_push, updated_at, source_us, version)`

// holdStatConflict is the processor's newer-wins rule (applier.putStats).
const holdStatConflict = `
ON CONFLICT (did, repository, hold_did) DO UPDATE SET rkey = excluded.rkey, pull_count = excluded.pull_count,
  push_count = excluded.push_count, last_pull = excluded.last_pull, last_push = excluded.last_push,
  updated_at = excluded.updated_at, source_us = excluded.source_us, version = excluded.version
WHERE excluded.version > repository_hold_stats.version`

// BenchmarkHoldStatUpsertRowsPerStatement measures what one row of the
// processor's hold-stat upsert costs when a statement writes one row (as
// the applier does), every row of the transaction (one JSON parameter
// through json_each, as the aggregate refresh does), or 100 rows (a
// multi-row VALUES): the question behind "fewer statements than events"
// (docs/performance.md, tried and dropped). Each op is one transaction of
// 1,000 upserts, two thirds of them new rows, into a file database
// holding 20,000; the figure is µs/row.
//
//	go test -run '^$' -bench HoldStatUpsertRowsPerStatement -count 3 ./internal/processor
func BenchmarkHoldStatUpsertRowsPerStatement(b *testing.B) {
	for _, v := range []struct {
		name  string
		write func(ctx context.Context, tx *sql.Tx, rows [][11]any) error
	}{
		{"one-row", upsertOneRow},
		{"json-each", upsertJSONEach},
		{"values-100", upsertValues},
	} {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			db := testsupport.OpenDB(b)
			if err := fillHoldStats(ctx, db); err != nil {
				b.Fatal(err)
			}
			batch := 0
			for b.Loop() {
				b.StopTimer()
				rows := holdStatRows(batch)
				batch++
				tx, err := db.DB.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := v.write(ctx, tx, rows); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*rowsPerTx), "µs/row")
		})
	}
}

// fillHoldStats stores rowsStored distinct hold-stat rows.
func fillHoldStats(ctx context.Context, db *database.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for i := range rowsStored {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+holdStatColumns+` VALUES (?1, ?2, ?3, ?4, 1, 1, 0, 0, 0, 0, 'a')`,
			fmt.Sprintf("did:plc:u%05d", i%500), fmt.Sprintf("repo%d", i%40), fmt.Sprintf("did:web:h%d", i/1000), fmt.Sprintf("r%d", i)); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// holdStatRows are the rows of the n-th timed transaction: 700 owners ×
// 40 repositories of one hold, so about a third are stored already.
func holdStatRows(n int) [][11]any {
	rows := make([][11]any, rowsPerTx)
	for i := range rows {
		k := n*rowsPerTx + i
		rows[i] = [11]any{fmt.Sprintf("did:plc:u%05d", k%700), fmt.Sprintf("repo%d", k%40), "did:web:h9",
			fmt.Sprintf("s%d", k), k, k, k, k, k, k, fmt.Sprintf("b%09d", k)}
	}
	return rows
}

func upsertOneRow(ctx context.Context, tx *sql.Tx, rows [][11]any) error {
	for _, r := range rows {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+holdStatColumns+`
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)`+holdStatConflict, r[:]...); err != nil {
			return err
		}
	}
	return nil
}

func upsertJSONEach(ctx context.Context, tx *sql.Tx, rows [][11]any) error {
	list, err := json.Marshal(rows)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO `+holdStatColumns+`
SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4, j.value ->> 5,
  j.value ->> 6, j.value ->> 7, j.value ->> 8, j.value ->> 9, j.value ->> 10
FROM json_each(?1) AS j WHERE true`+holdStatConflict, string(list))
	return err
}

func upsertValues(ctx context.Context, tx *sql.Tx, rows [][11]any) error {
	for lo := 0; lo < len(rows); lo += rowsPerValues {
		args := make([]any, 0, 11*rowsPerValues)
		for _, r := range rows[lo:min(lo+rowsPerValues, len(rows))] {
			args = append(args, r[:]...)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+holdStatColumns+` VALUES `+
			database.Values(len(args)/11, 11)+holdStatConflict, args...); err != nil {
			return err
		}
	}
	return nil
}
