// Package nsid checks Namespaced Identifiers, the AT Protocol's names for
// Lexicon schemas and record collections (https://atproto.com/specs/nsid),
// and the "prefix.*" patterns Jetstream accepts in wantedCollections.
package nsid

import "strings"

// Limits from the NSID specification, in bytes (NSIDs are ASCII).
const (
	// MaxLength is the longest NSID: a 253-byte domain authority, a dot
	// and a 63-byte name.
	MaxLength = 253 + 1 + 63
	// maxAuthority is the longest domain authority (a hostname).
	maxAuthority = 253
	// maxSegment is the longest segment (a DNS label).
	maxSegment = 63
)

// Valid reports whether s is an NSID: a domain authority in reverse order
// (two segments at least, each 1 to 63 letters, digits or hyphens, not
// beginning or ending with a hyphen, the first not beginning with a digit)
// and a name (1 to 63 letters and digits, not beginning with a digit),
// joined by dots, MaxLength bytes at most. Examples: io.atcr.manifest,
// com.example.fooBar.
func Valid(s string) bool {
	if len(s) > MaxLength {
		return false
	}
	dot := strings.LastIndexByte(s, '.')
	if dot < 0 || dot > maxAuthority {
		return false
	}
	authority, name := s[:dot], s[dot+1:]
	if strings.Count(authority, ".") < 1 || !validAuthority(authority) {
		return false
	}
	return validName(name)
}

// ValidPattern reports whether s is a wantedCollections value: an NSID
// (Valid), or a prefix of one or more authority-style segments followed
// by ".*" (io.atcr.*), which matches every NSID that begins with the
// prefix and a dot.
func ValidPattern(s string) bool {
	if prefix, ok := strings.CutSuffix(s, ".*"); ok {
		return len(prefix) <= maxAuthority && validAuthority(prefix)
	}
	return Valid(s)
}

// validAuthority checks dot-separated domain segments; the first may not
// begin with a digit.
func validAuthority(s string) bool {
	for i, seg := range strings.Split(s, ".") {
		if !validDomainSegment(seg) || (i == 0 && isDigit(seg[0])) {
			return false
		}
	}
	return true
}

func validDomainSegment(seg string) bool {
	if seg == "" || len(seg) > maxSegment || seg[0] == '-' || seg[len(seg)-1] == '-' {
		return false
	}
	for i := 0; i < len(seg); i++ {
		if c := seg[i]; !isLetter(c) && !isDigit(c) && c != '-' {
			return false
		}
	}
	return true
}

func validName(seg string) bool {
	if seg == "" || len(seg) > maxSegment || isDigit(seg[0]) {
		return false
	}
	for i := 0; i < len(seg); i++ {
		if c := seg[i]; !isLetter(c) && !isDigit(c) {
			return false
		}
	}
	return true
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
