package logval

import (
	"errors"
	"io/fs"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestValuesUpToTheLimitAreKeptAndLongerOnesCutWithAMarker(t *testing.T) {
	exact := strings.Repeat("a", MaxBytes)
	if got := String(exact); got != exact {
		t.Errorf("a value of exactly MaxBytes was changed")
	}
	long := strings.Repeat("b", 122*1024)
	got := String(long)
	want := strings.Repeat("b", MaxBytes) + "…[truncated " + "124416" + " bytes]"
	if got != want {
		t.Errorf("String(122 KiB) = %.80q... (%d bytes), want %d bytes ending in the marker", got, len(got), len(want))
	}
	if Bytes([]byte(long)) != want {
		t.Errorf("Bytes differs from String")
	}
	if Bytes([]byte("short")) != "short" || String("") != "" {
		t.Errorf("short values changed")
	}
}

func TestACutNeverSplitsAUTF8Character(t *testing.T) {
	for pad := range 4 {
		s := strings.Repeat("x", pad) + strings.Repeat("€", MaxBytes) // 3 bytes each
		got := String(s)
		if !utf8.ValidString(got) {
			t.Fatalf("pad %d: cut inside a character: %q", pad, got[MaxBytes-4:])
		}
		kept := strings.Index(got, "…[truncated")
		if kept > MaxBytes || kept < MaxBytes-utf8.UTFMax {
			t.Fatalf("pad %d: kept %d bytes, want within a character of %d", pad, kept, MaxBytes)
		}
		if !strings.HasSuffix(got, "…[truncated "+strconv.Itoa(len(s)-kept)+" bytes]") {
			t.Fatalf("pad %d: marker %q does not count the %d bytes cut", pad, got[kept:], len(s)-kept)
		}
	}
	// Invalid UTF-8 (continuation bytes only) is cut near the limit, not at 0.
	if got := String(strings.Repeat("\x80", 2*MaxBytes)); !strings.HasPrefix(got, strings.Repeat("\x80", MaxBytes-utf8.UTFMax)) {
		t.Fatalf("invalid UTF-8 cut too short: %d bytes", len(got))
	}
}

func TestErrorsAreBoundedAndStillUnwrap(t *testing.T) {
	if Error(nil) != nil || Err(nil) != "" {
		t.Fatal("nil error not kept nil")
	}
	base := &fs.PathError{Op: "open", Path: strings.Repeat("p", 10*MaxBytes), Err: fs.ErrNotExist}
	err := Error(base)
	if len(err.Error()) > MaxBytes+64 || !strings.Contains(err.Error(), "…[truncated ") {
		t.Fatalf("Error() is %d bytes: not bounded", len(err.Error()))
	}
	if Err(base) != err.Error() {
		t.Fatal("Err and Error disagree")
	}
	var pe *fs.PathError
	if !errors.Is(err, fs.ErrNotExist) || !errors.As(err, &pe) {
		t.Fatal("the bounded error no longer unwraps to its cause")
	}
}
