package syntaxvectors

import (
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// TestTheLibraryAgreesWithEveryVector checks the loader (a value mangled
// by it would flip a verdict) and pins the library version to the
// specification: the project's parsers are built on these functions.
func TestTheLibraryAgreesWithEveryVector(t *testing.T) {
	parsers := map[string]func(string) error{
		ATIdentifier: func(s string) error { _, err := syntax.ParseAtIdentifier(s); return err },
		ATURI:        func(s string) error { _, err := syntax.ParseATURI(s); return err },
		Datetime:     func(s string) error { _, err := syntax.ParseDatetime(s); return err },
		DID:          func(s string) error { _, err := syntax.ParseDID(s); return err },
		Handle:       func(s string) error { _, err := syntax.ParseHandle(s); return err },
		NSID:         func(s string) error { _, err := syntax.ParseNSID(s); return err },
		RecordKey:    func(s string) error { _, err := syntax.ParseRecordKey(s); return err },
		TID:          func(s string) error { _, err := syntax.ParseTID(s); return err },
	}
	for kind, parse := range parsers {
		valid, invalid := Valid(kind), Invalid(kind)
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
