package atproto

import (
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

func TestParseFollowsTheSpecificationsTestVectors(t *testing.T) {
	for _, s := range testsupport.ValidVectors(testsupport.SyntaxDatetime) {
		if _, err := ParseDatetime(s); err != nil {
			t.Errorf("%q refused, the specification says valid: %v", s, err)
		}
	}
	for _, s := range testsupport.InvalidVectors(testsupport.SyntaxDatetime) {
		if _, err := ParseDatetime(s); err == nil {
			t.Errorf("%q accepted, the specification says invalid", s)
		}
	}
}

// A comma before the fraction is ISO 8601's other separator, which the
// AT Protocol datetime does not allow; indigo's pattern let it through.
func TestParseRefusesAnyFractionSeparatorButADot(t *testing.T) {
	for _, s := range []string{"2025-12-01T00:00:00,123Z", "2025-12-01T00:00:00,1+02:00", "2025-12-01T00:00:00:123Z"} {
		if _, err := ParseDatetime(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
	want := int64(1764547200123)
	if got, err := ParseDatetime("2025-12-01T00:00:00.123Z"); err != nil || got.UnixMilli() != want {
		t.Errorf("Parse(dot) = %v, %v; want %d ms", got, err, want)
	}
}
