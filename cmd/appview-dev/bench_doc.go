// This file is `appview-dev bench`: it measures the lease runtime on one
// host with real processes and prints one figure a line, "name value
// unit", so two runs (or two commits) can be compared with diff or awk.
//
// Repetition: every step runs Options.Repeat times (--repeat, default
// DefaultRepeat = 5; 1 with --quick). The "name value unit" line of a
// figure carries the median over those runs, and two more lines its
// spread, "name_min value unit" and "name_max value unit", so one noisy
// run on a shared host cannot decide a target. Each run's own value is
// noted on stderr as it is measured. --only takes step names (Steps) and
// figure names (a figure selects its step and prints only itself).
//
// Figures and how each is taken:
//
//   - graceful_handover_p50_ms, graceful_handover_p99_ms: two instances on
//     a file database; the holder of the cleanup lease gets SIGTERM; the
//     figure is the contender's lease.acquired minus the holder's
//     lease.released, both from the events' own times ("at", µs: when
//     the acquire statement returned and when the release statement
//     began, so the release's own round trip is inside the figure). A fresh
//     instance replaces the stopped one before the next round.
//     graceful_handover_p50_ms_sqld and _p99_ms_sqld (step graceful-sqld,
//     needs --sqld): the same, 20 rounds, on a sqld server started for
//     the run. graceful_handover_rtt_ratio (and _sqld): the run's p50
//     divided by the p50 of an acquire round-trip loop (as for
//     acquire_rtt_p50_ms) run right after the handovers on the same
//     database, the last holder still running, paired within each run.
//   - acquire_rtt_p50_ms_{file,sqld}, renew_rtt_p50_ms_{file,sqld}: the
//     round trip of lease.Store.Acquire (of a released row: the handover
//     path) and lease.Store.Renew, called from this process against a file
//     database and against a sqld server started for the run.
//   - crash_handover_minus_ttl_p50_ms: the holder gets SIGKILL; the figure
//     is the contender's lease.acquired minus the killed grant's expires_at
//     as the lease row had it (its last renewal + TTL, database clock).
//   - renew_cost_ratio, renew_cost_ratio_100, renew_cost_ratio_5: 3
//     instances (3 connection pools on one file database) each renew
//     1,000 (100, 5) leases the way a renew tick does, with one
//     lease.Store.RenewAll statement per instance per round (the
//     batched path LeaseActors take through lease.Renewer), and,
//     interleaved in the same run, the same rows by bare single-row
//     UPDATEs with a client-side clock; the median of the paired round
//     ratios (batched / bare). A round of 5 or 100 leases is repeated
//     until each side renews about 1,000 leases per instance.
//   - idle_rss_mb: resident set of an idle `appview serve` after it has
//     acquired its leases and renewed a few times.
//   - ingest_ratio, ingest_events_per_s, bare_rows_per_s (MeasureIngest):
//     the io.atcr commits of a synthetic stream (20k events) are ingested
//     by the real consumer path (a loopback jetstream.ReplayServer with
//     compressed frames, a consumer actor built by consumer.Worker under a
//     fenced grant, a new file database), timed until jetstream_cursor
//     holds the last event; and the row images the processor writes for
//     them (recorded once by internal/rowcapture) are written again by
//     bare INSERT OR REPLACE, in the consumer's batches (of
//     jetstream.DefaultBatchSize events), one transaction
//     per batch, into a new database of the same schema. Seven alternating
//     pairs; the figures are the median of bare time / consumer time, the
//     median consumer events/s and the median bare rows/s.
//   - replay_1m_rss_mb_at_{10,50,100}pct, replay_1m_rss_growth_ratio,
//     replay_1m_events_per_s: 1,000,000 synthetic events served by an
//     `appview jetstream-replay` process to a real `appview serve`
//     (production lease timing); serve's VmRSS as jetstream_cursor passes
//     10%, 50% and 100% of the stream, the growth 100% / 10% (flat is
//     about 1.0 to 1.3), and the stream's rate between 10% and 100%.
//   - jetstream_close_{p50,p99}_ms_{silent,blocked}: jetstream.Client.Close,
//     100 clients one after another, timed from the call to its return:
//     "silent" once connected to a loopback server that never sends,
//     "blocked" while the handler holds a batch until its context ends.
//
// --quick runs every step small, once, under the same names (3 ingest pairs of 2k
// events, a 20k-event replay): a smoke run, not a measurement.
//
// Targets: graceful handover p50 <= 13 ms and p99 <= 50 ms (file and
// sqld); crash - TTL <= 100 ms; renew_cost_ratio (each size) <= 0.3; idle RSS
// <= 40 MB; ingest_ratio >= 0.8; replay RSS flat (growth <= 1.2) at
// >= 20k events/s; Jetstream close <= 100 ms.
// The benchmark reports; it does not judge.

package main
