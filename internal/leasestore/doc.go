// Package leasestore is the database side of named leases (docs/spec.md §4): the
// leases table and its one-statement acquire, renew and release (Store),
// the rows `appview leases` and /debug/leases show (Row, Listed, List),
// the lease timing and the relations it must keep (Timing.Validate), and
// the contenders table that makes a graceful handover quick
// (Contenders). It sits below actors/: the LeaseActor (actors/lease)
// decides custody; this package only reads and writes it, every statement
// on the database's clock.
package leasestore
