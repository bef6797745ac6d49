package logval

import (
	"errors"
	"io/fs"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestValuesUpToTheLimitAreKeptAndLongerOnesCutInTheMiddleWithAMarker(t *testing.T) {
	exact := strings.Repeat("a", MaxBytes)
	if got := String(exact); got != exact {
		t.Errorf("a value of exactly MaxBytes was changed")
	}
	long := "HEAD" + strings.Repeat("b", 122*1024) + "TAIL"
	got := String(long)
	cut := len(long) - MaxBytes
	want := "HEAD" + strings.Repeat("b", MaxBytes/2-4) + "…[truncated " + strconv.Itoa(cut) + " bytes]…" +
		strings.Repeat("b", MaxBytes/2-4) + "TAIL"
	if got != want {
		t.Errorf("String(122 KiB) = %.80q... (%d bytes), want %d bytes: both ends around the marker", got, len(got), len(want))
	}
	if String("short") != "short" || String("") != "" {
		t.Errorf("short values changed")
	}
}

func TestACutNeverSplitsAUTF8Character(t *testing.T) {
	for pad := range 4 {
		s := strings.Repeat("x", pad) + strings.Repeat("€", MaxBytes) + strings.Repeat("y", pad) // 3 bytes each
		got := String(s)
		if !utf8.ValidString(got) {
			t.Fatalf("pad %d: cut inside a character: %q", pad, got)
		}
		i := strings.Index(got, "…[truncated ")
		j := strings.LastIndex(got, " bytes]…") + len(" bytes]…")
		kept := i + len(got) - j
		if kept > MaxBytes || kept < MaxBytes-2*utf8.UTFMax {
			t.Fatalf("pad %d: kept %d bytes, want within a character per end of %d", pad, kept, MaxBytes)
		}
		if n, err := strconv.Atoi(got[i+len("…[truncated ") : j-len(" bytes]…")]); err != nil || n != len(s)-kept {
			t.Fatalf("pad %d: the marker says %d bytes cut (%v), want %d", pad, n, err, len(s)-kept)
		}
	}
	// Invalid UTF-8 (continuation bytes only) is still cut to MaxBytes.
	s := strings.Repeat("\x80", 4*MaxBytes)
	if got := String(s); len(got) != MaxBytes+len(marker(len(s)-MaxBytes)) {
		t.Fatalf("invalid UTF-8 kept %d bytes, want %d", len(got)-len(marker(len(s)-MaxBytes)), MaxBytes)
	}
}

func TestErrorsAreBoundedKeepTheirCauseAndStillUnwrap(t *testing.T) {
	if Error(nil) != nil || Err(nil) != "" {
		t.Fatal("nil error not kept nil")
	}
	base := &fs.PathError{Op: "open", Path: strings.Repeat("p", 10*MaxBytes), Err: fs.ErrNotExist}
	err := Error(base)
	if len(err.Error()) > MaxBytes+64 || !strings.Contains(err.Error(), "…[truncated ") {
		t.Fatalf("Error() is %d bytes: not bounded", len(err.Error()))
	}
	if !strings.HasSuffix(err.Error(), fs.ErrNotExist.Error()) {
		t.Fatalf("the cause at the end of the message was cut: %q", err.Error()[len(err.Error())-40:])
	}
	if Err(base) != err.Error() {
		t.Fatal("Err and Error disagree")
	}
	var pe *fs.PathError
	if !errors.Is(err, fs.ErrNotExist) || !errors.As(err, &pe) {
		t.Fatal("the bounded error no longer unwraps to its cause")
	}
}

// A password is masked whether or not the URL parses.
func TestMaskURLMasksAPasswordInAnyURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://user:s3cret PW@127.0.0.1/":  "http://user:xxxxx@127.0.0.1/",
		"http://user:s3cretPW@127.0.0.1/\n": "http://user:xxxxx@127.0.0.1/\n",
		"http://user:s3cretPW@[::1/":        "http://user:xxxxx@[::1/",
		"http:user:s3cretPW@127.0.0.1":      "http:user:xxxxx@127.0.0.1",
		"libsql://u:pa/ss@db.example.com/x": "libsql://u:xxxxx@db.example.com/x",
		"wss://host.example/subscribe":      "wss://host.example/subscribe",
		"http://token@host/":                "http://token@host/",
		"not a url":                         "not a url",
		"https://host/path?next=a@b":        "https://host/path?next=a@b",
		// No scheme (found by a new-user pass: these were echoed whole).
		"//u:s3cret@1.1.1.1/h": "//u:xxxxx@1.1.1.1/h",
		"u:s3cret@1.1.1.1/h":   "u:xxxxx@1.1.1.1/h",
	} {
		if got := MaskURL(in); got != want {
			t.Errorf("MaskURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A jetstream.urls query may carry a proxy's token, and the URL is shown
// in logs and on the open /metrics page: the values are hidden, the names
// kept (a new user found ?token=s3cr3t on /metrics three times).
func TestRedactURLHidesQueryValuesAndPasswords(t *testing.T) {
	for raw, want := range map[string]string{
		"ws://h/subscribe?token=s3cr3t":                      "ws://h/subscribe?token=xxxxx",
		"wss://u:pw@h/x?a=1&a=2&b=":                          "wss://u:xxxxx@h/x?a=xxxxx&a=xxxxx&b=xxxxx",
		"ws://h/xrpc/network.bsky.jetstream.subscribeEvents": "ws://h/xrpc/network.bsky.jetstream.subscribeEvents",
	} {
		if got := RedactURL(raw); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", raw, got, want)
		}
	}
}

// A value a byte over the bound was logged as its 512 bytes and a
// 24-byte marker: a longer line than the value itself.
func TestAValueBarelyOverTheBoundIsKeptWhole(t *testing.T) {
	for _, n := range []int{MaxBytes + 1, MaxBytes + 10} {
		s := strings.Repeat("r", n)
		if got := String(s); got != s {
			t.Errorf("%d bytes: got %d bytes %q..., want the value whole", n, len(got), got[:20])
		}
	}
	s := strings.Repeat("r", MaxBytes+100)
	if got := String(s); len(got) >= len(s) || !strings.Contains(got, "…[truncated 100 bytes]…") {
		t.Errorf("100 bytes over: %d bytes, want it cut", len(got))
	}
}
