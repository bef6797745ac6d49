// Package syntaxmemo remembers, in a small fixed table, strings that an
// AT Protocol syntax check accepted, so a string seen again is accepted
// without running the check again.
//
// The checks are indigo's atproto/syntax parsers, most of them regular
// expressions: 1–2 µs a call. Every commit of the stream repeats its
// repository's DID (checked by the decoder and again by the processor)
// and often its hold's, and carries a rev (TID) that the consumer checks
// in up to four places, so the same strings are checked again and again
// on the reader's path (docs/performance.md, fifteenth pass).
//
// Only acceptance is remembered: a string the check refuses is checked
// every time, so nothing wrong is ever accepted from the table. Validity
// is a function of the string alone, so a remembered answer never goes
// stale. The table is direct-mapped (a string's hash picks its one slot,
// and a newer string evicts the older), holds only strings of at most
// MaxLen bytes, and never grows: its memory is bounded whatever the
// stream. It is safe for concurrent use without a lock (each slot is an
// atomic pointer).
package syntaxmemo

import (
	"hash/maphash"
	"sync/atomic"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// MaxLen is the longest string (bytes) a Memo remembers: every TID (13)
// and record key (512 at most, the stream's are short) of the stream's
// kind fits, and most DIDs (did:plc is 32 bytes); a longer one is checked
// every time, so one table holds at most slots × MaxLen bytes of strings.
const MaxLen = 320

// Memo remembers strings its check accepted. Build one with New.
type Memo struct {
	check func(string) bool
	seed  maphash.Seed
	slots []atomic.Pointer[string]
	mask  uint64
}

// New returns a Memo for check with slots entries (rounded up to a power
// of two, at least 1).
func New(slots int, check func(string) bool) *Memo {
	n := 1
	for n < slots {
		n <<= 1
	}
	return &Memo{check: check, seed: maphash.MakeSeed(), slots: make([]atomic.Pointer[string], n), mask: uint64(n - 1)}
}

// Valid reports whether check accepts s, from the table when s was
// accepted before and is still there.
func (m *Memo) Valid(s string) bool {
	if len(s) > MaxLen {
		return m.check(s)
	}
	slot := &m.slots[maphash.String(m.seed, s)&m.mask]
	if p := slot.Load(); p != nil && *p == s {
		return true
	}
	if !m.check(s) {
		return false
	}
	slot.Store(&s)
	return true
}

// The process's tables, one per syntax. Sized for the strings a stream
// repeats: the DIDs of active repositories and holds, the revs of the
// commits in flight, record keys (tags and hold stats reuse theirs).
var (
	dids       = New(4096, func(s string) bool { _, err := syntax.ParseDID(s); return err == nil })
	tids       = New(1024, func(s string) bool { _, err := syntax.ParseTID(s); return err == nil })
	recordKeys = New(1024, func(s string) bool { _, err := syntax.ParseRecordKey(s); return err == nil })
)

// DID reports whether s is a DID (atproto.com/specs/did), as
// syntax.ParseDID checks it.
func DID(s string) bool { return dids.Valid(s) }

// TID reports whether s is a TID (atproto.com/specs/tid), as
// syntax.ParseTID checks it; syntax.TID(s) is then the parsed TID.
func TID(s string) bool { return tids.Valid(s) }

// RecordKey reports whether s is a record key
// (atproto.com/specs/record-key), as syntax.ParseRecordKey checks it.
func RecordKey(s string) bool { return recordKeys.Valid(s) }
