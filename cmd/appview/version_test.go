package main

import (
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/harness"
)

func TestVersionFlagAndCommandPrintTheSameBuildIdentity(t *testing.T) {
	t.Parallel()
	flag := runAppview(t, t.TempDir(), childEnv(), "--version")
	cmd := runAppview(t, t.TempDir(), childEnv(), "version")
	if flag.code != 0 || cmd.code != 0 {
		t.Fatalf("exit codes %d and %d, stderr %q %q", flag.code, cmd.code, flag.stderr, cmd.stderr)
	}
	if flag.stdout != cmd.stdout {
		t.Fatalf("--version printed %q, version printed %q", flag.stdout, cmd.stdout)
	}
	want := regexp.MustCompile(`^appview \S+ \(commit \S+, go[0-9.]+\S*\)\n$`)
	if !want.MatchString(cmd.stdout) || !strings.Contains(cmd.stdout, runtime.Version()) {
		t.Fatalf("version = %q, want %s with %s", cmd.stdout, want, runtime.Version())
	}
}

// ldflagsVersion and ldflagsCommit are what TestMain links into the
// binary under test with -ldflags -X, as deploy/Dockerfile does.
const ldflagsVersion, ldflagsCommit = harness.TestVersion, harness.TestCommit

func TestLdflagsOverrideVersionAndCommit(t *testing.T) {
	t.Parallel()
	r := runAppview(t, t.TempDir(), childEnv(), "version")
	if r.code != 0 {
		t.Fatalf("appview version: exit %d, stderr %q", r.code, r.stderr)
	}
	if got, want := r.stdout, "appview "+ldflagsVersion+" (commit "+ldflagsCommit+", "+runtime.Version()+")\n"; got != want {
		t.Fatalf("version = %q, want %q", got, want)
	}
}
