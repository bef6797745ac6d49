// Package bench is `appview bench`: it measures the lease runtime on one
// host with real processes and prints one figure a line, "name value
// unit", so two runs (or two commits) can be compared with diff or awk.
//
// Figures and how each is taken:
//
//   - graceful_handover_p50_ms, graceful_handover_p99_ms: two instances on
//     a file database; the holder of the cleanup lease gets SIGTERM; the
//     figure is the contender's lease.acquired minus the holder's
//     lease.released, both from the events' own times ("at", µs). A fresh
//     instance replaces the stopped one before the next round.
//   - acquire_rtt_p50_ms_{file,sqld}, renew_rtt_p50_ms_{file,sqld}: the
//     round trip of lease.Store.Acquire (of a released row: the handover
//     path) and lease.Store.Renew, called from this process against a file
//     database and against a sqld server started for the run.
//   - crash_handover_minus_ttl_p50_ms: the holder gets SIGKILL; the figure
//     is the contender's lease.acquired minus the killed grant's expires_at
//     as the lease row had it (its last renewal + TTL, database clock).
//   - renew_cost_ratio: 3 instances (3 connection pools) each renew 1,000
//     leases through lease.Store, and, interleaved in the same run, the same
//     rows by bare UPDATEs with a client-side clock; the ratio of the
//     median round times. It prices what the store adds per renewal (the
//     database clock, the holder and fence match, the affected-rows check).
//   - idle_rss_mb: resident set of an idle `appview serve` after it has
//     acquired its leases and renewed a few times.
//   - ingest_ratio: bare batched INSERTs of the rows the processor writes
//     over the processor's own ingest of the same events; measured by the
//     function plugged into IngestRatio, and left out (with a note on
//     stderr) while none is.
//
// Targets: graceful p50 <= 13 ms, p99 <= 50 ms; crash - TTL <=
// 100 ms; renew_cost_ratio <= 1.2; idle RSS <= 40 MB; ingest_ratio >= 0.5.
// The benchmark reports; it does not judge.
package bench
