// This file serves the AT Protocol interop syntax test vectors
// (testdata/, copied from bluesky-social/atproto interop-test-files/syntax)
// to the tests of every package that parses AT Protocol identifiers, so one
// list of valid and invalid values checks every parser the project uses.
//
// Only tests import it; the shipped binary does not link it.

package testsupport

import (
	"embed"
	"fmt"
	"strings"
)

//go:embed testdata/*.txt
var files embed.FS

// Kinds the vectors cover, as named in the upstream file names.
const (
	SyntaxATIdentifier = "atidentifier"
	SyntaxATURI        = "aturi"
	SyntaxCID          = "cid"
	SyntaxDatetime     = "datetime"
	SyntaxDID          = "did"
	SyntaxHandle       = "handle"
	SyntaxNSID         = "nsid"
	SyntaxRecordKey    = "recordkey"
	SyntaxTID          = "tid"
)

// ValidVectors returns the values the specification says are valid syntax for
// kind (one of the constants above). It panics on an unknown kind: that
// is a mistake in a test, not in input.
func ValidVectors(kind string) []string { return load(kind + "_syntax_valid.txt") }

// InvalidVectors returns the values the specification says are invalid for kind:
// the syntax-invalid list and, where upstream has one (datetime), the
// values that match the syntax but do not parse as a time.
func InvalidVectors(kind string) []string {
	out := load(kind + "_syntax_invalid.txt")
	if _, err := files.Open("testdata/" + kind + "_parse_invalid.txt"); err == nil {
		out = append(out, load(kind+"_parse_invalid.txt")...)
	}
	return out
}

// load reads one vector file: one value per line, blank lines and lines
// beginning with "#" skipped. Values are kept byte for byte (some invalid
// ones end in spaces or hold non-ASCII characters on purpose).
func load(name string) []string {
	b, err := files.ReadFile("testdata/" + name)
	if err != nil {
		panic(fmt.Sprintf("syntaxvectors: %s: %v", name, err))
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, line)
	}
	return out
}
