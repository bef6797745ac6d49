package consumer

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/atcr-io/appview/internal/logval"
)

// A peer's text quoted in an error keeps whole characters and its end
// (an HTTP body's cause is often last).
func TestAPeersTextIsBoundedAtWholeCharactersKeepingItsEnd(t *testing.T) {
	body := strings.Repeat("x", 199) + strings.Repeat("é", 400) + " cause: rate limited"
	got := bounded(body)
	if !utf8.ValidString(got) || !strings.HasSuffix(got, "cause: rate limited") || len(got) > logval.MaxBytes+64 {
		t.Fatalf("bounded(%d bytes) = %q: want valid UTF-8, bounded, with its end", len(body), got)
	}
	if short := "é short"; bounded(short) != short {
		t.Fatalf("bounded(%q) = %q, want it unchanged", short, bounded(short))
	}
}
