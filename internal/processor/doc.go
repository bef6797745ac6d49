// Package processor turns Jetstream v1 events (jetstream.Event) into the
// registry's rows (database/migrations/0002_registry.sql): io.atcr.*
// records (docs/lexicons.md) plus identity and account events. The consumer
// feeds it the live stream; the backfill feeds it listRecords results as
// synthetic create events. It assumes nothing about a live stream: any
// event may arrive twice, late, or after a newer one.
//
// # API
//
//	p := processor.New(processor.Options{Log: log, Metrics: m})
//	// records and the caller's own writes in one commit (the backfill's
//	// page and checkpoint, a re-read's rev and queue row)
//	fence.Fenced(ctx, db, custody, func(tx *sql.Tx) error {
//	    res, err := p.ApplyTx(ctx, tx, custody, batch)
//	    ... the caller's writes ...
//	})
//	// the same transaction in chunks (the consumer's pipeline, under its
//	// commit budget: actors/consumer/pipeline.go), first without
//	// savepoints: on processor.ErrRedo, roll back and run it again with
//	// p.BeginTx (processor.Redo)
//	s := p.BeginBareTx(ctx, tx, custody)
//	_ = s.Preload(batch) // optional: one read for the whole batch
//	res, err := s.Apply(batch[:25]) ... s.Apply(batch[25:50]) ...
//	err = s.Finish() // the aggregates, once
//	// ... and once the transaction has committed:
//	s.Committed() // count and log the outcomes
//	// one shot, nothing else to commit
//	res, err := p.Apply(ctx, db, custody, events)
//
// Result reports applied / unchanged / skipped counts (skips by reason),
// the per-hold stats rows changed (Result.HoldStats, for the StatsCache's
// warm view) and the manifests stored for the first time
// (Result.NewManifests, the webhook "push" triggers).
//
// # Guarantees
//
//   - Idempotent: applying an event twice, or a whole stream twice, or a
//     stream with rewinds, leaves the database identical. Every column is a
//     function of the events (times come from time_us, never the wall
//     clock), except repository_stats.fence, which names the writer.
//   - Newer wins, by version (version.go, docs/ordering.md): each row and
//     each tombstone keeps the version of the event that wrote it, the
//     commit's rev (a TID, strictly increasing per repo), or for an event
//     without a rev "0" and its time_us, which sorts below every rev. An
//     equal or older create/update never overwrites a row and an older
//     delete never removes it, whichever Jetstream host stamped them and
//     whatever time_us or updatedAt they carry (both are kept as data
//     only: source_us, updated_at). A delete leaves a tombstone
//     (record_tombstones), so a create not newer than the delete (a
//     rewound replay, a backfill read) cannot bring the record back; at
//     one rev the delete wins. Hold stats are ordered the same way, by
//     their hold repo's rev, also in SQL.
//   - Bounded statements: a statement whose parameters grow with the record
//     (layers, references, annotations) or the batch (tombstone lookups,
//     aggregate refreshes) is split by database.Chunks, so a record of any
//     size the consumer accepts is stored whole.
//   - Bounded log lines: every logged value from an event is cut at
//     logval.MaxBytes with a marker.
//   - No partial sums: repository_stats is recomputed, inside the same
//     transaction, from the persisted repository_hold_stats and stars rows
//     of every repository the batch changed. Whatever a cache knew or
//     missed, the stored aggregate is the sum over all persisted holds.
//   - No overflow: a count must lie in [0, MaxSafeInteger] (2^53−1, the
//     AT Protocol data model's integer range) or its record is skipped as
//     bad_value; the sums over holds saturate at MaxSafeInteger
//     (SaturatingSumSQL), so no number of holds, nor a row stored before
//     the check, can make the aggregate fail.
//   - Isolation: a record that breaks its lexicon (missing required field,
//     over a length limit, wrong format) is skipped before it touches the
//     database; one the database refuses (or found invalid only while
//     writing) is rolled back alone. A BeginTx session gets this with
//     SAVEPOINTs; Apply and the consumer first run the transaction without
//     any (BeginBareTx: SQLite then keeps no statement sub-journal). An
//     event that fails there before it changed anything is skipped where
//     it stands; only one that fails after changing a row makes them roll
//     the transaction back whole and run it again with savepoints (Redo),
//     so the result is the same either way. Both are counted by reason
//     and logged at a sampled rate (a burst per period, not one line per
//     event); the rest of the batch lands and the caller's cursor still
//     advances past them. Commits outside io.atcr.* are skipped silently
//     (counted). Only a failure of the transaction itself (locked, I/O,
//     savepoint) is returned, so the caller retries the whole batch.
//
// # Files
//
// An event's way through the package: decode.go (an event to an op,
// Prepare), session.go (TxSession: Preload, Apply, Finish, Committed),
// apply.go (the per-event machinery: savepoints, redo, the dispatch to a
// collection), one file per collection with its lexicon check and its
// rows (manifest.go, tag.go, star.go, profile.go, repopage.go,
// captain.go, crew.go, holdstats.go), users.go (users rows, identity and
// account events), txstate.go (what a transaction carries from one Apply
// to the next), aggregate.go (repository_stats), processor.go (the
// Processor, results and outcomes), metrics.go.
//
// # Users
//
// A users row is created by the first user-repo record applied for a DID
// (manifest, tag, star, profile, repo page), or by the first #identity or
// #account event of a DID (with the event's status), so that later events
// have something to update: an account may hold records this index never
// saw (a backfill that skipped it while inactive, a reactivation, which
// sends no record events). Jetstream sends those events for the whole
// network regardless of wantedCollections, so the table holds a row for
// every account seen; only rows with records or a profile matter to
// readers. An event that may leave a repository incompletely indexed asks
// for a re-read of it (Result.Rereads, users.go): the first event of a DID
// (unless it says the account is inactive), an #account event making an
// inactive row active, an #identity event naming another PDS than the row
// had, and either kind for a repository noted in repo_incomplete. The
// consumer queues them in the batch's transaction.
package processor
