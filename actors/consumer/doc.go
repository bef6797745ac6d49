// Package consumer is the Jetstream consumer worker (lease
// "jetstream-consumer"): it reads the Jetstream v1 stream from the stored
// cursor minus jetstream.rewind and applies each batch of events in one
// fenced transaction.
//
// # One batch, one commit
//
// commitBatch is the unit of progress. Inside lease.Fenced under the
// worker's custody it
//
//  1. applies the events (processor.ApplyTx): records, per-hold stats and
//     the repository_stats aggregate recomputed from persisted rows;
//  2. enqueues a webhook delivery per subscriber for every manifest stored
//     for the first time (webhooks.EnqueueTx; idempotent by event key);
//  3. writes the cursor, last: the batch's largest time_us.
//
// All three commit together or not at all, so the cursor can never be
// durable past an event whose records, stats or deliveries are not, and a
// replay after a crash or a rewind is harmless (every write is newer-wins
// or idempotent). After the commit the consumer tells the StatsCache what
// changed (statscache.Observe) and kicks the webhook dispatcher when
// deliveries were enqueued. A commit that fails with lease.ErrSuperseded
// means custody is lost: the worker fails with that error.
//
// The stored cursor only moves forward: replaying an older stretch after a
// rewind does not move it back.
//
// The consumer actor itself (reader goroutine with backpressure, the
// StatsCache and dispatcher children, options_update, Worker) is built on
// the Jetstream client of package jetstream.
package consumer
