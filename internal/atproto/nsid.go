// This file checks Namespaced Identifiers, the AT Protocol's names for
// Lexicon schemas and record collections (https://atproto.com/specs/nsid),
// and the "prefix.*" patterns Jetstream accepts in wantedCollections.
//
// The NSID syntax itself is indigo's atproto/syntax.ParseNSID, which
// follows the specification and its interop test vectors; this package
// adds only the wildcard form, which is Jetstream's and not the spec's.

package atproto

import (
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// ValidNSID reports whether s is an NSID by the specification: a domain
// authority in reverse order and a name, at least three segments, 317
// bytes at most. Examples: io.atcr.manifest, com.example.fooBar.
func ValidNSID(s string) bool {
	_, err := syntax.ParseNSID(s)
	return err == nil
}

// ValidNSIDPattern reports whether s is a wantedCollections value: an NSID
// (Valid), or a prefix followed by ".*" (io.atcr.*), which matches every
// NSID that begins with the prefix and a dot. The prefix must be one or
// more leading segments of some valid NSID, so a pattern that can match
// nothing (1io.*, io.-a.*, io.atcr*) is refused where Jetstream v1 would
// accept it silently.
func ValidNSIDPattern(s string) bool {
	if prefix, ok := strings.CutSuffix(s, ".*"); ok {
		// The shortest NSIDs extending the prefix: one more segment when
		// the prefix already has two, else two more.
		return prefix != "" && (ValidNSID(prefix+".a") || ValidNSID(prefix+".a.a"))
	}
	return ValidNSID(s)
}
