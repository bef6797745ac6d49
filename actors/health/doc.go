// Package health checks every known hold on every instance and keeps the
// result in a local, in-memory cache: GET <hold>/xrpc/_health (any 2xx is
// healthy; docs/lexicons.md, hold XRPC) every health.check_interval, each
// request bounded by health.timeout, at most health.concurrency at once.
//
// # Not leased, on purpose
//
// The cache is local state that each instance reads when it serves, so
// every instance must keep its own; a lease would leave all instances but
// one blind. The checker writes nothing to the database, so running it
// everywhere is safe. It registers as an unleased Job (workers.Spec with
// Leased false); its custody has Fence 0 and is not consulted.
//
// # Rounds
//
// A round re-reads the known holds (distinct hold DIDs of hold_captains
// and manifests.hold_did), resolves each DID to its endpoint (identity:
// the "#atcr_hold" service, or a did:web's host), checks them concurrently
// and then replaces the cache in one step: holds no longer known are
// dropped, and every known hold has a fresh result. There is no hysteresis:
// one failed check marks a hold unhealthy, so a hold that goes down is
// marked so by the next round, within one interval (health.timeout must be
// below health.check_interval). A check cut short because the worker is
// stopping is not counted as a failure.
//
// # Job plus guarded snapshot, not an actor
//
// The cache is read from two places that are not actors: the /debug/holds
// HTTP handler and the Prometheus collector behind /metrics. Behind an
// actor each read would be a RequestFuture with a timeout, and a scrape
// during a slow round would wait on the mailbox or fail. A round is the
// only writer and replaces the whole map under a mutex, so readers take a
// consistent snapshot in microseconds and never block on I/O. The Cache
// is built once per process (in Worker) and outlives worker restarts, so
// /debug/holds keeps the last known state while the job is restarted.
//
// # Outputs
//
// /debug/holds (on workers.Deps.Admin): JSON {instance, round_at_ms, holds:
// [Status...]} sorted by DID. Metrics, one series per known hold:
// appview_hold_healthy{hold} (1/0), appview_hold_check_latency_seconds{hold},
// appview_hold_consecutive_failures{hold},
// appview_hold_last_check_timestamp_seconds{hold}; and
// appview_hold_checks_total{outcome} (healthy, unhealthy).
package health
