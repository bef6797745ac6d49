package processor

import (
	"fmt"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Record versions (docs/ordering.md). Every row the processor writes from a
// repo record, and every tombstone, stores the version of the event that
// wrote it, and a create, update or delete changes a row only when its
// version is newer. Versions are strings compared byte-wise (SQLite's TEXT
// order and Go's < agree):
//
//   - A commit's version is its rev: a TID (atproto.com/specs/tid), 13
//     characters of base32-sortable, which the repo's PDS makes strictly
//     increasing per repo. Every row the processor keys belongs to the one
//     repo that wrote it, so two different changes to a row never share a
//     version, whichever Jetstream host stamped them and whatever time_us
//     or updatedAt they carry.
//   - An event without a rev (the backfill's listRecords reads, which carry
//     none) has the version "0" + its time_us as 20 digits (NoRevVersion).
//     "0" sorts below every TID's first character, so any event with a rev
//     replaces such a row, and such versions order among themselves by time.
//   - Several operations of one commit share its rev. A commit names each
//     record path once (its ops are the diff between two repo trees), so two
//     operations on one record with one rev are not a real history; should
//     a delete and a create or update of one record arrive with the same
//     rev, the delete wins in either order (a tombstone blocks an equal
//     version, a delete removes an equal version), so the result does not
//     depend on arrival order. A second create or update with an equal
//     version is a replay and changes nothing.
//
// Identity and account events carry no rev and are not repo records: they
// keep ordering by time_us (users.identity_us, users.account_us).

// validTID reports whether s is a TID as the AT Protocol specification
// defines it (indigo's atproto/syntax, checked against the spec's interop
// test vectors): fixed-length, sortable base32, so two valid revs compare
// by time as strings.
func validTID(s string) bool {
	_, err := syntax.ParseTID(s)
	return err == nil
}

// NoRevVersion is the version of an event without a rev stamped timeUS
// (Unix µs): "0" and timeUS as 20 digits, below every TID.
func NoRevVersion(timeUS int64) string {
	return fmt.Sprintf("0%020d", timeUS)
}

// versionOf returns the version of a commit event: its rev, or
// NoRevVersion(time_us) when it has none. A rev that is not a TID is an
// error: it would compare unpredictably with every other version of the
// repo.
func versionOf(ev *jetstream.Event) (string, error) {
	rev := ev.Commit.Rev
	if rev == "" {
		return NoRevVersion(ev.TimeUS), nil
	}
	if !validTID(rev) {
		return "", invalid(ReasonBadValue, "rev %q is not a TID", rev)
	}
	return rev, nil
}
