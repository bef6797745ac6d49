// This file records every row image written to a database and
// writes the same images again as bare batched INSERTs: the yardstick of
// ingest_ratio (`appview-dev bench`, and the processor's Go benchmark
// BenchmarkIngestVersusBareInserts).
//
// The question ingest_ratio answers is how much the ingest path (Jetstream
// decoding, the processor's rules, savepoints, tombstones, the aggregate
// refresh, the fenced commit) costs over the unavoidable price of storing
// its result: the same rows, inserted with nothing else, in the same
// batches, one transaction per batch, into the same schema (its keys and
// indexes are the data model's cost, not the ingest path's).
//
// Recording is done by the database itself, in an untimed run: Install
// adds an AFTER INSERT and an AFTER UPDATE trigger to every table, each
// appending NEW as a JSON array to a log table, so no row a writer touches
// can be missed, whatever statement wrote it. Cut closes a batch (call it
// after each transaction of the run being recorded). Capture.Insert then
// replays the images with INSERT OR REPLACE: a row written twice (an
// insert, then an update) is written twice, as the recorded run did.
// Deletes are not recorded: they have no row image to insert.
// RecordProcessor is the recorded run both measurements use: the
// processor's batches into a fresh file database.
//
// Values survive the JSON round trip exactly: integers are decoded as
// int64 (never through float64), text as string, NULL as nil. A BLOB
// column makes the trigger fail (SQLite's json_array refuses BLOBs), which
// surfaces as the recorded run's error rather than as a wrong capture.

package main
