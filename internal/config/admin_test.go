package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestAdminAuthRules covers the admin endpoint's start-up rules: a non-loopback
// admin.addr needs a token unless explicitly opted out; the token comes
// from admin.token or admin.token_file, never both; weak or unusable
// tokens are refused naming the key.
func TestAdminAuthRules(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "  s3cret-token-0123456789\n")
	empty := write("empty", " \n")
	short := write("short", "abcde\n")
	big := write("big", strings.Repeat("x", MaxTokenFileBytes+1))
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		sets   []string
		key    string // "" means accepted
		reason string
	}{
		{name: "loopback without token", sets: []string{"admin.addr=127.0.0.1:0"}},
		{name: "localhost without token", sets: []string{"admin.addr=localhost:5001"}},
		{name: "ipv6 loopback without token", sets: []string{"admin.addr=[::1]:5001"}},
		{name: "admin disabled", sets: []string{"admin.addr="}},
		{name: "all interfaces without token", sets: []string{"admin.addr=0.0.0.0:5001"}, key: "admin.token", reason: "not a loopback address"},
		{name: "empty host without token", sets: []string{"admin.addr=:5001"}, key: "admin.token", reason: "not a loopback address"},
		{name: "lan address without token", sets: []string{"admin.addr=10.0.0.5:5001"}, key: "admin.token", reason: "admin.allow_unauthenticated"},
		{name: "hostname without token", sets: []string{"admin.addr=appview-1:5001"}, key: "admin.token"},
		// The rule docs/operations.md states: a loopback IP or the name
		// localhost, in any case, needs no token; no other name does, even
		// one that resolves to loopback (names are not resolved).
		{name: "localhost on another port without token", sets: []string{"admin.addr=localhost:5311"}},
		{name: "LOCALHOST without token", sets: []string{"admin.addr=LOCALHOST:5311"}},
		{name: "another 127/8 address without token", sets: []string{"admin.addr=127.1.2.3:5001"}},
		{name: "ipv6 unspecified without token", sets: []string{"admin.addr=[::]:5001"}, key: "admin.token", reason: "not a loopback address"},
		{name: "a loopback alias name without token", sets: []string{"admin.addr=ip6-localhost:5001"}, key: "admin.token", reason: "not a loopback address"},
		{name: "a localhost subdomain without token", sets: []string{"admin.addr=app.localhost:5001"}, key: "admin.token", reason: "not a loopback address"},
		{name: "explicit opt-out", sets: []string{"admin.addr=0.0.0.0:5001", "admin.allow_unauthenticated=true"}},
		{name: "all interfaces with token", sets: []string{"admin.addr=0.0.0.0:5001", "admin.token=0123456789abcdef"}},
		{name: "all interfaces with token file", sets: []string{"admin.addr=0.0.0.0:5001", "admin.token_file=" + good}},
		{name: "short token", sets: []string{"admin.token=short"}, key: "admin.token", reason: "at least 16"},
		{name: "token with space", sets: []string{"admin.token=0123456789 abcdef"}, key: "admin.token", reason: "whitespace"},
		{name: "both token and file", sets: []string{"admin.token=0123456789abcdef", "admin.token_file=" + good}, key: "admin.token_file", reason: "not both"},
		{name: "missing token file", sets: []string{"admin.token_file=" + filepath.Join(dir, "nope")}, key: "admin.token_file", reason: "no such file"},
		{name: "empty token file", sets: []string{"admin.token_file=" + empty}, key: "admin.token_file", reason: "empty"},
		// Found by new users: a directory was named twice ("read DIR: read
		// DIR: is a directory"), and a FIFO with no writer hung the start
		// past every signal. Anything but a regular file is refused.
		{name: "token file is a directory", sets: []string{"admin.token_file=" + dir}, key: "admin.token_file", reason: "admin.token_file: " + dir + " is a directory, not a regular file (from --set)"},
		{name: "token file is a fifo", sets: []string{"admin.token_file=" + fifo}, key: "admin.token_file", reason: "is a FIFO, not a regular file"},
		// Found by a new user: a short token read from the file was
		// refused under admin.token, and no refusal said where the file
		// name came from.
		{name: "short token in the file", sets: []string{"admin.token_file=" + short}, key: "admin.token_file", reason: "the token in " + short + " must be at least 16 characters (got 5) (from --set)"},
		{name: "missing token file names its source", sets: []string{"admin.token_file=" + filepath.Join(dir, "nope")}, key: "admin.token_file", reason: "(from --set)"},
		{name: "oversized token file", sets: []string{"admin.token_file=" + big}, key: "admin.token_file", reason: "larger than"},
		{name: "protect metrics without token", sets: []string{"admin.protect_metrics=true"}, key: "admin.protect_metrics", reason: "needs admin.token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, "", nil, tc.sets)
			if tc.key == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want a *config.Error for %s", err, tc.key)
			}
			if ce.Key != tc.key || !strings.Contains(ce.Error(), tc.reason) {
				t.Fatalf("err = %v, want key %s with %q", err, tc.key, tc.reason)
			}
		})
	}
	cfg := mustLoad(t, "", nil, []string{"admin.token_file=" + good})
	if cfg.Admin.Token != "s3cret-token-0123456789" {
		t.Fatalf("token from file = %q, want it trimmed", cfg.Admin.Token)
	}
}
