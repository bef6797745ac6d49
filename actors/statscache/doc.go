// Package statscache is the StatsCache actor: per repository (owner DID,
// repository), each hold's pull/push counts and last pull/push, as the
// holds report them in io.atcr.hold.stats records (absolute values; a
// newer version, the hold repo's commit rev, replaces that hold's numbers:
// see docs/ordering.md).
//
// # The bug it exists to prevent
//
// In the system this project replaces, StatsCache was per-process memory
// whose aggregate was written to repository_stats as an absolute value. Two
// consumers, or a new holder with a cold cache after failover, each wrote a
// partial sum as the whole truth. Here:
//
//   - The actor never writes a sum from memory. Per-hold rows and the
//     aggregate are written by the processor inside the consumer's fenced
//     batch transaction (processor.ApplyTx), the aggregate recomputed there
//     from the persisted repository_hold_stats rows, and the cursor commits
//     in that same transaction. So the cursor can never be durable past an
//     event whose stats are not: they are one commit. (Chosen over a
//     separate StatsCache write awaited before the cursor commit: one
//     transaction has no window at all, and the backfill, which has no
//     StatsCache, gets the same guarantee.)
//   - Every message carries the custody it was produced under; a message
//     whose custody is not the actor's own is rejected with a
//     *processor.StaleCustodyError reply and counted
//     (appview_statscache_rejected_total).
//   - It warms from repository_hold_stats when it starts, and then
//     reconciles: under fence.Fenced with its custody it recomputes every
//     repository_stats row from the persisted per-hold and star rows and
//     rewrites the rows that differ (counted in
//     appview_statscache_reconciled_total). A new holder after failover
//     therefore starts from the whole persisted truth and repairs any
//     partial sum it finds; it does not trust its own memory for writes.
//
// # Messages (package internal/processor)
//
//	*Observe{Custody, Stats}   → *Observed | *StaleCustodyError   (after a commit;
//	                             answered only when sent as a request)
//	*Get{OwnerDID, Repository} → *Snapshot
//
// The messages live in internal/processor so the consumer, which spawns
// the cache as its child, never imports this package: the registration
// (consumer.Worker(statscache.New, pm) in cmd/appview/workers.go) hands the
// consumer the cache's props builder.
//
// # The view serves a read
//
// The in-memory view answers GET /debug/stats?did=DID&repository=NAME on
// the admin endpoint of the instance that holds the consumer's lease: the
// repository's per-hold numbers and their totals, with the custody (lease,
// fence) the view is held under. Other instances answer 503 (no cache runs
// there). It is the same sum repository_stats holds, computed from memory,
// so an operator can compare the two. A query without both parameters,
// with either twice, a did that is not a DID or a blank repository is
// answered 400 with the reason.
//
// Observe applies newer-wins by version in memory, as the SQL did (an
// equal or older version is ignored; updatedAt is data only, two updates
// in one millisecond are still ordered). Warm-up and reconcile run on the actor's
// goroutine in Started: messages wait until the view is warm. A failed
// warm-up (database error, or fence.ErrSuperseded from the reconcile) makes
// the actor fail with that error, so its parent can treat superseded as
// lost custody.
package statscache
