// Package harness runs real `appview serve` processes (and sqld, the
// libSQL server) on one host and turns what they log into custody events
// that a test or a benchmark can wait on and check.
//
// It exists because the seed's one real bug (the process exited before its
// release landed, so a rolling deploy paused for a whole TTL) was invisible
// to unit tests and obvious in a two-instance run. Everything here is about
// running that kind of check on demand:
//
//   - Start writes a YAML configuration for one instance (docs/spec.md §3) into its
//     own directory, starts the binary with it and reads its stderr, where
//     every line is one JSON object (docs/spec.md §5). Each line becomes an Event;
//     Log.Wait blocks until a matching event arrives, the process exits or
//     the context ends. Nothing polls with sleeps.
//   - Cluster keeps every instance it started, merges their logs into one
//     timeline ordered by the logged time, and adds a synthetic
//     process.exited event when a process dies, so a SIGKILLed holder's
//     custody ends in the timeline even though it logged nothing.
//   - CheckExclusive and CheckFences read a timeline and report the first
//     moment two instances ran one leased worker, or a grant whose fence did
//     not grow by exactly one.
//   - StartSqld runs `sqld --db-path DIR --http-listen-addr 127.0.0.1:PORT`
//     and waits until it answers; StartCommand runs any other appview
//     command (jetstream-replay, say) with its log read the same way.
//   - Leases reads the lease table through `appview leases --json`, the way
//     an operator does.
//
// Clocks: custody events carry "at", when the custody changed (wall
// clock, microseconds), besides "time", when the line was written
// (milliseconds, possibly a little later: a relay goroutine writes them).
// The timeline orders by "at" where a line has it. Events of different
// processes that share a timestamp are ordered causally (a worker stops
// before another starts, a lease is released before another instance
// acquires it), the only order the lease protocol allows.
//
// The harness takes no *testing.T: the multi-process tests in tests/ and
// `appview-dev bench` both use it, and it reports problems as errors.
package harness
