// Package backfill walks every io.atcr.* record on the network into the
// database, for what the Jetstream consumer never saw (records older than
// its cursor, or missed during an outage). It runs as a Job under the lease
// "backfill", so one instance backfills at a time.
//
// # What a run does
//
//	for each collection of Collections (manifests first):
//	  relay: com.atproto.sync.listReposByCollection?collection=C&cursor=…
//	         (relay_endpoints in order; the next relay on failure)
//	  for each DID of the page, at most backfill.concurrency at once:
//	    resolve the DID's PDS (identity: did:plc via the PLC directory, did:web)
//	    PDS: com.atproto.repo.listRecords?repo=DID&collection=C&cursor=…
//	    each page → synthetic Jetstream create events → Applier (the same
//	    processor as the consumer, so the same idempotency holds)
//	mark the run completed
//
// Requests are retried on 429, 5xx and network errors with jittered
// exponential backoff, waiting as long as Retry-After asks (up to a cap).
// A DID that does not resolve, or whose PDS keeps failing, is recorded as
// failed, logged (sampled) and skipped; a PDS that failed after retries is
// not asked again in that run. Neither stops the run.
//
// # Checkpoint and custody
//
// A run is a row of backfill_runs (completed_at NULL while unfinished).
// Its checkpoint is backfill_collections (per collection: the relay and
// the cursor of the next relay page; every DID of the earlier pages is
// finished) and backfill_repos (per collection and DID: the listRecords
// cursor after the last page applied, and running/done/failed). A page of
// records, its DID's checkpoint and the run's counters commit in ONE
// fence.Fenced transaction under the worker's custody, so:
//
//   - a new holder after failover resumes the unfinished run where the old
//     one left off: no page is applied twice or skipped;
//   - a holder whose custody was superseded cannot write records or
//     checkpoints (the fence check fails; Run returns ErrSuperseded);
//   - when the job's context ends, the request in flight is cancelled,
//     Run waits for its goroutines and returns, and nothing is written
//     after that.
//
// One bad record cannot stall a run: a page whose transaction fails for a
// reason of its records (not lost custody, not the context, not the
// database itself failing) is applied again record by record, each in its
// own fenced transaction; a record that still fails is skipped (logged,
// counted as db_error) and the page's checkpoint commits on its own.
//
// A relay's cursor means nothing to another relay, so switching relays
// lists the collection again from the start; DIDs already finished are
// skipped by their checkpoint.
//
// # Once or periodic
//
// backfill.interval 0: the job is Once — it runs to completion (resuming an
// unfinished run after a delay if a collection could not be listed) and the
// registry then holds the lease idle until shutdown, so a second instance
// cannot run its own startup backfill. A new holder skips the run when one
// completed less than backfill.rerun_after ago. backfill.interval > 0: Run
// every interval under the lease, always resuming an unfinished run first.
//
// Records deleted from a repository are not removed by the backfill (it
// sees only what exists); deletions arrive through Jetstream.
package backfill
