package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/testsupport"
)

// devBin runs this command: the test binary itself, which TestMain turns
// into appview-dev (run, the whole of main) when asCommand is set in its
// environment. The tests run it as a process, for its exit code and its
// output, without linking a binary of their own (16 s of a loaded run,
// for the five commands the tests run).
var devBin string

// asCommand is the environment variable that makes the test binary run
// appview-dev instead of the tests. It is no APPVIEW_ variable: appview-dev
// refuses those that name no configuration key.
const asCommand = "TEST_BINARY_RUNS_APPVIEW_DEV"

func TestMain(m *testing.M) {
	if os.Getenv(asCommand) == "1" {
		os.Exit(run(os.Args[1:]))
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test binary:", err)
		os.Exit(1)
	}
	devBin = exe
	os.Exit(m.Run())
}

type result struct {
	stdout, stderr string
	code           int
}

func runDev(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, devBin, args...)
	cmd.Dir, cmd.Env = dir, append(env[:len(env):len(env)], asCommand+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("appview-dev %s: %v", strings.Join(args, " "), err)
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// childEnv is this process's environment without APPVIEW_* settings, plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "APPVIEW_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

func TestSynthCheckComparesTheDatabaseWithTheExpectedState(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.db")
	env := childEnv("APPVIEW_DATABASE_URL=file:" + path)
	if r := runDev(t, dir, env, "synth", "--events", "200", "--out", "s.jsonl", "--expected", "s.json"); r.code != 0 {
		t.Fatalf("synth: exit %d: %s", r.code, r.stderr)
	}
	if r := runDev(t, dir, env, "synth-check"); r.code != cli.ExitConfig || !strings.Contains(r.stderr, "--expected") {
		t.Fatalf("synth-check without --expected: exit %d, %q; want %d naming --expected", r.code, r.stderr, cli.ExitConfig)
	}
	if r := runDev(t, dir, env, "synth-check", "--expected", "s.json"); r.code != cli.ExitConfig || !strings.Contains(r.stderr, "database.url") {
		t.Fatalf("synth-check on a missing database: exit %d, %q; want %d naming database.url", r.code, r.stderr, cli.ExitConfig)
	}
	// A migrated database that has consumed nothing differs.
	testsupport.OpenDBAt(t, path).Close()
	r := runDev(t, dir, env, "synth-check", "--expected", "s.json")
	if r.code != cli.ExitFailure || !strings.Contains(r.stdout, "missing row") || !strings.Contains(r.stderr, "differs") {
		t.Fatalf("synth-check on an empty database: exit %d, stdout %q, stderr %q; want %d with missing rows", r.code, r.stdout, r.stderr, cli.ExitFailure)
	}
}

func TestBenchRefusesAMissingAppviewBinary(t *testing.T) {
	dir := t.TempDir()
	r := runDev(t, dir, childEnv(), "bench", "--quick", "--appview", filepath.Join(dir, "no-such-appview"))
	if r.code != cli.ExitConfig || !strings.Contains(r.stderr, "--appview") {
		t.Fatalf("bench with a missing --appview: exit %d, %q; want %d naming --appview", r.code, r.stderr, cli.ExitConfig)
	}
}
