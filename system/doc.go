// Package system wires the runtime: it builds the actor system (protoactor's
// slog logger bridged to zerolog), one LeaseActor per registered worker
// under a root actor, the custody event log and the admin debug views of
// the leases, and stops it all gracefully (every lease released). It
// contains no worker logic: workers register through internal/workers and
// never import this package (docs/architecture.md).
package system
