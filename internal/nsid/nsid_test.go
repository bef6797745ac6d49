package nsid

import (
	"strings"
	"testing"
)

func TestValidFollowsTheNSIDSpecification(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	for s, want := range map[string]bool{
		"io.atcr.manifest":      true,
		"io.atcr.sailor.star":   true,
		"com.example.fooBar":    true,
		"a-b.example.name":      true,
		"com.example.x1":        true,
		"io.atcr.foo-bar":       false, // the name has no hyphens
		"io.atcr.1x":            false, // nor a leading digit
		"1io.atcr.x":            false, // the first segment begins with a letter
		"io.-atcr.x":            false, // domain segments do not begin with a hyphen
		"io.atcr-.x":            false, // or end with one
		"io.atcr":               false, // three segments at least
		"io..x":                 false,
		"io.atcr.x_y":           false,
		"io.atcr.":              false,
		".io.atcr.x":            false,
		"io.atcr.*":             false, // a pattern, not an NSID
		"io.atc r.x":            false,
		"io.atcr.é":             false,
		"io." + long(64) + ".x": false,
		"io." + long(63) + ".x": true,
		"io.atcr." + long(64):   false,
		"io" + strings.Repeat("."+long(63), 3) + "." + long(58) + ".x": true,  // a 253-byte authority
		"io" + strings.Repeat("."+long(63), 3) + "." + long(59) + ".x": false, // 254 bytes
	} {
		if got := Valid(s); got != want {
			t.Errorf("Valid(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestValidPatternAcceptsNSIDsAndPrefixWildcards(t *testing.T) {
	for s, want := range map[string]bool{
		"io.atcr.*":        true,
		"io.*":             true,
		"io.atcr.sailor.*": true,
		"io.atcr.manifest": true,
		"*":                false,
		".*":               false,
		"io.atcr.*.x":      false,
		"io.atcr*":         false,
		"io.atc r.*":       false,
		"1io.*":            false,
		"io.-a.*":          false,
		"io.atcr.foo-bar":  false,
	} {
		if got := ValidPattern(s); got != want {
			t.Errorf("ValidPattern(%q) = %v, want %v", s, got, want)
		}
	}
}
