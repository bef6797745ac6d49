// Package consumer is the Jetstream consumer worker (lease
// "jetstream-consumer"): it reads the Jetstream v1 stream from the stored
// cursor (minus jetstream.rewind when the cursor may come from another
// Jetstream instance) and applies each batch of events in one fenced
// transaction.
//
// # One batch, one step
//
// The consumer hands every batch to its pipeline (pipeline.go), the one
// step from the Jetstream client to the database. pipeline.commit
// prepares the batch (the handles it needs, verified before the write
// lock is taken) and then, inside ONE transaction fenced by the worker's
// custody (pipeline.write, the consumer's one call of fence.Fenced):
//
//  1. orders: each commit is screened against its repository's newest
//     rev (revs.go: a stale or future-dated commit is skipped, a #sync
//     queues a re-read);
//  2. applies the events (a processor.TxSession, one Apply per
//     commit-budget chunk): records, per-hold stats and the
//     repository_stats aggregate recomputed from persisted rows
//     (TxSession.Finish), and queues the re-reads the #account and
//     #identity events ask for (lifecycle.go);
//  3. enqueues a webhook delivery per subscriber for every manifest stored
//     for the first time (webhooks.EnqueueTx; idempotent by event key);
//  4. writes the position, last (position.go).
//
// All of it commits together or not at all, so the position can never be
// durable past an event whose records, stats or deliveries are not, and a
// replay after a crash or a rewind is harmless (every write is newer-wins
// or idempotent). The pipeline returns what committed; the consumer then
// moves its in-memory position on, tells the StatsCache what changed
// (processor.ObserveStats) and kicks the webhook dispatcher when
// deliveries were enqueued (consumer.advance). A commit that fails with
// fence.ErrSuperseded means custody is lost: the worker fails with that
// error.
//
// # One bad row cannot stall the stream
//
// The processor isolates each event under a savepoint, but some work sits
// outside them: the repository_stats refresh, the webhook enqueue, the
// commit. If one event breaks that work, the batch can never commit, and
// retrying it from the cursor forever is a stall. So a batch commit that
// fails with anything but lost custody, the end of the context or a
// failure of the database itself (processor.DatabaseFailure: locked, I/O,
// ...) is retried event by event (pipeline.each), each event with its
// deliveries and the cursor in its own fenced transaction. An event whose
// own commit still fails is skipped (counted by the processor as db_error,
// logged at a sampled rate) and the cursor is moved past it in a fenced
// transaction of its own. Only when even that write fails does the worker
// fail: the database is broken, and a restart retries from the cursor.
//
// A batch that does not reach past the stored cursor (replaying an older
// stretch after a rewind) leaves it alone, so restarts cannot walk the
// resume point backwards.
//
// # The actor
//
//	LeaseActor ── spawns with custody ──▶ consumer
//	                                        ├── StatsCache   (Options.Stats: statscache.New)
//	                                        ├── dispatcher   (webhooks)
//	                                        └── jetstream.Client Run goroutine
//	                                              reader ─▶ batch ─▶ handler ─▶ pipeline.commit
//
// Started loads the cursor, spawns the two children and starts the
// client's Run goroutine. The client calls the handler with each batch on
// that goroutine and reads no further than a small buffer until it returns:
// that is the backpressure, and it keeps the blocking database work off the
// actor's goroutine. After a commit the handler sends the StatsCache an
// Observe and the dispatcher a Kick (only when deliveries were enqueued).
// The package's files follow that order: worker.go (registration),
// consumer.go (the actor, handle, advance), pipeline.go (the step),
// revs.go and position.go (what the step orders by and writes last),
// resume.go (where a connection resumes), gaps.go (lost events),
// lifecycle.go (re-reads account lifecycle events ask for), resync.go
// (re-reads), metrics.go.
// Frames that did not decode (Batch.Failures, already counted by the
// client) are logged with their class, size and time_us when known, at a
// sampled rate per class; the next good event moves the cursor past them.
//
// # Where a connection resumes
//
// Jetstream stamps time_us per instance, so a cursor read from one
// instance is only exact on that instance. The first connect of each
// incarnation (after a restart or a handover, we do not know where the
// cursor came from) and every connect to a URL other than the one the
// last committed batch came from resume at the committed cursor minus
// jetstream.rewind. A reconnect to that same URL resumes at the last
// event committed from it (inclusive): a replay from a cursor comes out of
// Jetstream's time-ordered store, so nothing before that event is still to
// come, and a server that drops the subscriber every few events still
// moves the resume point on every connection. When the connection was on
// the live tail (its newest event within a minute of the host's clock),
// the reconnect rewinds by the reorder window (1 s, or jetstream.rewind if
// smaller): the live tail is not in time_us order (42 of the 152 events of
// the shared capture are older than the one before, by up to 31 ms), so
// events stamped just before the last one received may still have been on
// their way. It never rewinds past where that connection began to reach
// new events, so each connection that reaches them moves the resume point.
//
// Failure: a commit error ends Run; the actor then fails with that error
// (a panic its parent sees as the reason), so fence.ErrSuperseded reaches
// the LeaseActor as lost custody and anything else as a worker failure
// (restart with backoff, from the stored cursor). Child failures are
// escalated the same way.
//
// Stopping: Close cancels the handler's context (a batch in flight is
// rolled back: fence.Fenced checks the context before commit), sends a
// close frame within the client's small budget, closes the socket and waits
// for Run; only then do the children stop. Nothing is written after the
// actor stopped.
//
// UpdateCollections changes the collection filter on the live connection
// (options_update) and for every later one.
package consumer
