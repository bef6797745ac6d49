// This file parses database.url (docs/spec.md §3): which database an instance
// opens, an embedded file or a libSQL server. config.Validate and
// database.Open both call Parse, so a URL the configuration accepts is
// exactly a URL the database layer opens. It is a package of its own,
// free of cgo, so that config does not link the libSQL driver.
//
// Accepted forms:
//
//	file:rel/path               a file relative to the working directory
//	file:/abs/path              an absolute file path
//	file:///abs/path            the same, with an empty authority (RFC 8089)
//	file://localhost/abs/path   the same, naming the local host (RFC 8089)
//	http://HOST:PORT            a libSQL server (sqld)
//	https://HOST, libsql://HOST a libSQL server over TLS (sqld, Turso)
//
// Refused, each with a reason an operator can act on:
//
//   - a file URL naming any host but localhost (file://db.example/x.db): an
//     embedded database is on this machine, and file://rel/x.db would
//     otherwise quietly mean a different path than the operator meant;
//   - an in-memory database (:memory:, file::memory:, mode=memory): go-libsql
//     gives every connection of the pool its own private in-memory database,
//     and no other instance can see it, so leases and every table would
//     silently differ from one connection to the next;
//   - query parameters and fragments on a file URL: go-libsql would ignore
//     them (busy_timeout has its own key), and a '#' in a path is better
//     written %23 than silently cut off.

package database
