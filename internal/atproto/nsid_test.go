package atproto

import (
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

func TestValidFollowsTheSpecificationsTestVectors(t *testing.T) {
	for _, s := range testsupport.ValidVectors(testsupport.SyntaxNSID) {
		if !ValidNSID(s) {
			t.Errorf("Valid(%q) = false, the specification says valid", s)
		}
		if !ValidNSIDPattern(s) {
			t.Errorf("ValidPattern(%q) = false: every NSID is a pattern", s)
		}
	}
	for _, s := range testsupport.InvalidVectors(testsupport.SyntaxNSID) {
		if ValidNSID(s) {
			t.Errorf("Valid(%q) = true, the specification says invalid", s)
		}
	}
}

func TestValidAcceptsTheLongestNSIDs(t *testing.T) {
	// 287 bytes, from the vectors: refused by the hand-written check this
	// package had, which capped the authority at 253 bytes.
	long := "com" + strings.Repeat(".middle", 40) + ".foo"
	if !ValidNSID(long) || !ValidNSIDPattern(long) {
		t.Errorf("the %d-byte NSID %q is refused", len(long), long)
	}
	if !ValidNSIDPattern("com" + strings.Repeat(".middle", 40) + ".*") {
		t.Error("a prefix of the 287-byte NSID is refused")
	}
}

func TestValidPatternAcceptsNSIDsAndPrefixWildcards(t *testing.T) {
	for s, want := range map[string]bool{
		"io.atcr.*":        true,
		"io.*":             true,
		"io.atcr.sailor.*": true,
		"io.atcr.manifest": true,
		"org.4chan.*":      true,
		"*":                false,
		".*":               false,
		"io.atcr.*.x":      false,
		"io.atcr*":         false,
		"io.atc r.*":       false,
		"1io.*":            false,
		"io.-a.*":          false,
		"io.atcr.foo-bar":  false,
		"io..*":            false,
		"io.atcr.é.*":      false,
	} {
		if got := ValidNSIDPattern(s); got != want {
			t.Errorf("ValidPattern(%q) = %v, want %v", s, got, want)
		}
	}
}
