package testsupport_test

import (
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// TestTheLibraryAgreesWithEveryVector checks the loader (a value mangled
// by it would flip a verdict) and pins the library version to the
// specification: the project's parsers are built on these functions.
func TestTheLibraryAgreesWithEveryVector(t *testing.T) {
	parsers := map[string]func(string) error{
		testsupport.SyntaxATIdentifier: func(s string) error { _, err := syntax.ParseAtIdentifier(s); return err },
		testsupport.SyntaxATURI:        func(s string) error { _, err := syntax.ParseATURI(s); return err },
		testsupport.SyntaxDatetime:     func(s string) error { _, err := syntax.ParseDatetime(s); return err },
		testsupport.SyntaxDID:          func(s string) error { _, err := syntax.ParseDID(s); return err },
		testsupport.SyntaxHandle:       func(s string) error { _, err := syntax.ParseHandle(s); return err },
		testsupport.SyntaxNSID:         func(s string) error { _, err := syntax.ParseNSID(s); return err },
		testsupport.SyntaxRecordKey:    func(s string) error { _, err := syntax.ParseRecordKey(s); return err },
		testsupport.SyntaxTID:          func(s string) error { _, err := syntax.ParseTID(s); return err },
	}
	for kind, parse := range parsers {
		valid, invalid := testsupport.ValidVectors(kind), testsupport.InvalidVectors(kind)
		if len(valid) == 0 || len(invalid) == 0 {
			t.Fatalf("%s: %d valid and %d invalid vectors loaded", kind, len(valid), len(invalid))
		}
		for _, v := range valid {
			if err := parse(v); err != nil {
				t.Errorf("%s %q is valid by the specification: %v", kind, v, err)
			}
		}
		for _, v := range invalid {
			if parse(v) == nil {
				t.Errorf("%s %q is invalid by the specification, accepted", kind, v)
			}
		}
	}
}
