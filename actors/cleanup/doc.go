// Package cleanup is the periodic sweep that prunes tables which otherwise
// grow without bound. It runs as a leased Job (lease "cleanup") every
// cleanup.interval on exactly one instance; it is the seed's
// RunPeriodicCleanup, moved out of database start-up so that it runs under
// custody and stops when custody ends.
//
// # What it prunes
//
// The prune rules are data (Rules): a table, an SQL predicate and an age.
// The defaults:
//
//	webhook_deliveries   status delivered/failed, updated_at older than cleanup.retention
//	backfill_runs        completed_at older than cleanup.retention, except the
//	                     most recent completed run (a new backfill holder reads it
//	                     to decide whether to skip its startup run)
//	lease_contenders     seen_at older than ContenderStaleTTLs × leases.ttl
//	                     (advisory rows of instances that went away)
//	unleased_instances   seen_at older than ContenderStaleTTLs × leases.ttl
//	                     (records of leases-off instances that were killed)
//	billing_tier_pushes  members no longer crew of the hold, updated_at older than
//	                     cleanup.retention
//
// Pending deliveries and running backfills (completed_at NULL) never match.
// The leases table is never touched: New refuses a rule naming it, because
// a lease row carries the fence that keeps a stalled former holder out.
//
// # How it deletes
//
// The cutoff of every rule is fixed once per sweep from the database's
// clock (database.NowMS), so instances whose clocks disagree prune the same
// rows and a sweep always terminates. Rows are deleted in chunks of at most
// cleanup.chunk_rows, each chunk its own fence.Fenced transaction: the write
// lock is held briefly, and a superseded custody deletes nothing more from
// its first refused chunk on. A failing rule is logged and the other rules
// still run; the sweep's error reports every failure, and the job runner
// retries at the next interval.
//
// Each sweep logs one info line with the rows deleted per rule and counts
// them in appview_cleanup_rows_deleted_total{rule}.
package cleanup
