package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

func TestVersionFlagAndCommandPrintTheSameBuildIdentity(t *testing.T) {
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

func TestLdflagsOverrideVersionAndCommit(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "appview")
	build := exec.Command("go", "build", "-o", bin, "-ldflags", "-X main.version=v1.2.3-test -X main.commit=0123abcd", ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), "appview v1.2.3-test (commit 0123abcd, "+runtime.Version()+")\n"; got != want {
		t.Fatalf("version = %q, want %q", got, want)
	}
}
