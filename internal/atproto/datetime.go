// This file parses the AT Protocol datetime of records and labels
// (atproto.com/specs/lexicon, "Datetime": the intersection of RFC 3339 and
// ISO 8601, upper-case T and Z, an explicit offset, a "." before any
// fractional seconds).

package atproto

import (
	"fmt"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// ParseDatetime returns the time s names, or an error when s is not an AT
// Protocol datetime. It is indigo's syntax.ParseDatetimeTime with one
// check added: the character after the seconds must be ".", "Z", "+" or
// "-". indigo's pattern writes the fraction's separator as an unescaped
// "." (any character), and Go's RFC 3339 parser then accepts a comma, so
// "2025-12-01T00:00:00,123Z", which neither the specification nor its
// reference implementation accepts, would parse.
func ParseDatetime(s string) (time.Time, error) {
	t, err := syntax.ParseDatetimeTime(s)
	if err != nil {
		return time.Time{}, err
	}
	// ParseDatetimeTime matched YYYY-MM-DDTHH:MM:SS first: 19 bytes, then
	// a zone at least.
	if c := s[19]; c != '.' && c != 'Z' && c != '+' && c != '-' {
		return time.Time{}, fmt.Errorf("datetime %q: %q after the seconds, want '.' before a fraction or a zone", s, c)
	}
	return t, nil
}
